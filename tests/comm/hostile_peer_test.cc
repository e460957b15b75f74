// What a hostile or broken peer can send, over a real socket or in a
// bootstrap blob, and what the transports do with it: refuse it, name the
// peer, and never write outside a registered region.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "msinfer/comm/fabric_transport.h"
#include "msinfer/comm/tcp.h"

namespace msinfer::comm {
namespace {

std::unique_ptr<Transport> open_transport(const std::string& provider) {
  FabricOptions o;
  o.provider = provider;
  o.write_timeout_ms = 2000;
  auto t = make_transport(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : nullptr;
}

// The first bytes of a connection to the socket transport at `target`: its
// secret (the last field of its address) and who is writing. What a process
// of the job sends: the bounds checks must hold against one gone rogue too.
std::string socket_hello(const std::string& target, const std::string& who) {
  const std::string body = target.substr(target.rfind(':') + 1) + who;
  const uint32_t n = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + body;
}
const std::string kRogue = "socket:127.0.0.1:9:0123456789abcdef0123456789abcdef";

std::string socket_header(uint64_t key, uint64_t offset, uint64_t len, uint32_t imm) {
  std::string h(32, '\0');
  std::memcpy(h.data(), &key, 8);
  std::memcpy(h.data() + 8, &offset, 8);
  std::memcpy(h.data() + 16, &len, 8);
  std::memcpy(h.data() + 24, &imm, 4);
  return h;
}

bool send_all(int fd, const std::string& s) {
  return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// Polls `t` until it reports an error or `timeout` passes; the completions it
// handed out meanwhile go to *got.
Status poll_until_error(Transport& t, std::vector<Completion>* got,
                        std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    Status s = t.poll(got, 64);
    if (!s.ok()) return s;
  }
  return ok_status();
}

TEST(HostilePeerTest, SocketWriteWhoseOffsetWrapsAroundIsRefused) {
  auto t = open_transport("socket");
  ASSERT_TRUE(t);
  // The region is the upper half of a buffer: a wrapped offset would land
  // in the lower half.
  std::vector<uint8_t> memory(16384, 0);
  auto region = t->register_memory(memory.data() + 8192, 8192);
  ASSERT_TRUE(region.ok());
  auto fd =
      tcp_connect(t->address().substr(7, t->address().rfind(':') - 7), std::chrono::seconds(2));
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  const uint64_t offset = ~uint64_t{0} - 4096 + 1;  // 2^64 - 4096
  ASSERT_TRUE(send_all(*fd, socket_hello(t->address(), kRogue) +
                                socket_header(region->key, offset, 4096, 77) +
                                std::string(4096, '\xee')));
  std::vector<Completion> got;
  Status s = poll_until_error(*t, &got);
  ::close(*fd);
  EXPECT_FALSE(s.ok()) << "the write was accepted";
  EXPECT_NE(s.message().find("socket:127.0.0.1:9"), std::string::npos) << s.to_string();
  EXPECT_EQ(s.message().find("0123456789abcdef"), std::string::npos) << "a secret in a message";
  for (const Completion& c : got) EXPECT_NE(c.imm, 77u) << "a completion for the refused write";
  EXPECT_EQ(std::count(memory.begin(), memory.end(), 0), 16384)
      << "bytes written outside the region";
}

TEST(HostilePeerTest, SocketWritePastTheRegionsEndIsRefused) {
  auto t = open_transport("socket");
  ASSERT_TRUE(t);
  std::vector<uint8_t> memory(8192, 0);
  auto region = t->register_memory(memory.data(), 4096);
  ASSERT_TRUE(region.ok());
  auto fd =
      tcp_connect(t->address().substr(7, t->address().rfind(':') - 7), std::chrono::seconds(2));
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(send_all(*fd, socket_hello(t->address(), kRogue) +
                                socket_header(region->key, 4000, 200, 5) + std::string(200, 'x')));
  std::vector<Completion> got;
  Status s = poll_until_error(*t, &got);
  ::close(*fd);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(std::count(memory.begin(), memory.end(), 0), 8192);
}

// Anyone who can reach the port but was not handed the address (with its
// secret) through the job's bootstrap: dropped at once, nothing written, no
// completion, and the transport carries on (a stray client must not fail the
// job).
TEST(HostilePeerTest, SocketConnectionsWithoutTheSecretAreDropped) {
  auto t = open_transport("socket");
  ASSERT_TRUE(t);
  std::vector<uint8_t> memory(4096, 0);
  auto region = t->register_memory(memory.data(), memory.size());
  ASSERT_TRUE(region.ok());
  const std::string body = socket_header(region->key, 0, 16, 3) + std::string(16, 'x');
  const std::string wrong = "socket:127.0.0.1:9:ffffffffffffffffffffffffffffffff";
  for (const std::string& opening :
       {socket_hello(wrong, kRogue), socket_hello(t->address(), "").substr(0, 4 + 32),
        std::string("GET / HTTP/1.0\r\n\r\n")}) {
    auto fd =
        tcp_connect(t->address().substr(7, t->address().rfind(':') - 7), std::chrono::seconds(2));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(send_all(*fd, opening + body));
    // The transport closes the connection; meanwhile it reports nothing.
    std::vector<Completion> got;
    bool closed = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!closed && std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(t->poll(&got, 64).ok());
      char c;
      closed = ::recv(*fd, &c, 1, MSG_DONTWAIT) == 0;
    }
    ::close(*fd);
    EXPECT_TRUE(closed) << "a connection without the secret was kept";
    EXPECT_TRUE(got.empty());
  }
  EXPECT_EQ(std::count(memory.begin(), memory.end(), 0), 4096);
}

TEST(HostilePeerTest, CheckWriteDoesNotWrapAround) {
  RemoteRegion r{1, 0, 8192};
  EXPECT_TRUE(check_write("t", 0, 1, 4096, r, 4096).ok());
  EXPECT_FALSE(check_write("t", 0, 1, 4097, r, 4096).ok());
  EXPECT_FALSE(check_write("t", 0, 1, 4096, r, ~uint64_t{0} - 4095).ok());
  EXPECT_FALSE(check_write("t", 0, 1, ~uint64_t{0}, r, 2).ok());
  EXPECT_TRUE(range_within(0, 0, 0));
  EXPECT_FALSE(range_within(1, 0, 0));
}

TEST(HostilePeerTest, BootstrapBlobsAreValidated) {
  const RemoteRegion good{3, 4096, 8192};
  auto card = PeerCard::decode(PeerCard{"direct:1:x", good}.encode(), "rank 1");
  ASSERT_TRUE(card.ok()) << card.status().to_string();
  EXPECT_EQ(card->address, "direct:1:x");
  EXPECT_EQ(card->region.base, 4096u);
  EXPECT_EQ(card->region.length, 8192u);

  auto short_blob = PeerCard::decode(std::string(24, '\0'), "rank 2");
  EXPECT_FALSE(short_blob.ok());
  EXPECT_NE(short_blob.status().message().find("rank 2"), std::string::npos);
  const RemoteRegion wraps{1, ~uint64_t{0} - 4095, 4096};  // base + length = 2^64
  auto bad = PeerCard::decode(PeerCard{"direct:1:x", wraps}.encode(), "rank 3");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 3"), std::string::npos) << bad.status().to_string();
}

// A region description whose base, added to the offset, wraps around: the
// direct transport must refuse it rather than copy below the peer's object.
// In a child, so that a write out of bounds (before the fix) shows as its
// death rather than as ours.
TEST(HostilePeerTest, DirectRegionWhoseBaseWrapsAroundIsRefused) {
  auto target = open_transport("direct");
  ASSERT_TRUE(target);
  auto mem = target->allocate(8192);
  ASSERT_TRUE(mem.ok());
  auto region = target->register_memory((*mem)->data(), 8192);
  ASSERT_TRUE(region.ok());
  ASSERT_NE(region->key, 0u);
  const std::string address = target->address();
  const pid_t child = ::fork();
  if (child == 0) {
    auto writer = open_transport("direct");
    auto peer = writer ? writer->connect(address) : StatusOr<int>(internal_error("open"));
    if (!peer.ok()) {
      std::fprintf(stderr, "writer: %s\n", peer.status().to_string().c_str());
      ::_exit(2);
    }
    RemoteRegion hostile = *region;
    hostile.base = ~uint64_t{0} - 4095;  // 2^64 - 4096
    std::vector<uint8_t> src(4096, 0xee);
    Status s = writer->write(*peer, src.data(), src.size(), hostile, 0, 1, 0);
    ::_exit(s.ok() ? 1 : 0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << (WIFSIGNALED(st) ? "the writer crashed (signal " + std::to_string(WTERMSIG(st)) + ")"
                          : "the writer's write returned " + std::to_string(WEXITSTATUS(st)));
  std::vector<Completion> got;
  ASSERT_TRUE(target->poll(&got, 16).ok());
  EXPECT_TRUE(got.empty()) << "an immediate for the refused write";
}

}  // namespace
}  // namespace msinfer::comm
