// What a hostile or broken peer can send, over a real socket or in a
// bootstrap blob, and what the transports do with it: refuse it, name the
// peer, and never write outside a registered region.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "msinfer/comm/fabric_transport.h"
#include "msinfer/comm/socket_transport.h"
#include "msinfer/comm/tcp.h"

namespace msinfer::comm {
namespace {

std::unique_ptr<Transport> open_transport(const std::string& provider) {
  FabricOptions o;
  o.transport = *parse_transport(provider);
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

// ---- Issue 43: connections that never say hello.

std::string host_port_of(const std::string& socket_address) {
  return socket_address.substr(7, socket_address.rfind(':') - 7);
}

size_t open_fds() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// Whether the other end closed (or reset) the connection `fd`.
bool closed_by_peer(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// Polls both until `target` reports the remote write `imm` (true) or either
// fails or 20 s pass (false).
bool delivered(Transport& writer, Transport& target, uint32_t imm) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<Completion> got;
  while (std::chrono::steady_clock::now() < deadline) {
    got.clear();
    Status w = writer.poll(&got, 64);
    Status t = target.poll(&got, 64);
    EXPECT_TRUE(w.ok() && t.ok()) << w.to_string() << " / " << t.to_string();
    if (!w.ok() || !t.ok()) return false;
    for (const Completion& c : got) {
      if (c.kind == Completion::Kind::kRemoteWrite && c.imm == imm) return true;
    }
  }
  return false;
}

// 1,100 silent connections once took an expert worker past its fd limit and
// it exited. Now an endpoint holds at most kSocketMaxPendingConnections
// connections that have not said hello, closes each after
// FabricOptions::hello_timeout_ms, and serves a peer of the job that comes
// after them.
TEST(HostilePeerTest, SilentSocketConnectionsAreClosedAndAPeerIsServed) {
  FabricOptions o;
  o.transport = TransportKind::kSocket;
  o.write_timeout_ms = 2000;
  o.hello_timeout_ms = 300;
  auto made = make_transport(o);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<Transport> target = std::move(*made);
  auto writer = open_transport("socket");
  ASSERT_TRUE(writer);
  std::vector<uint8_t> memory(4096, 0), src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  auto region = target->register_memory(memory.data(), memory.size());
  ASSERT_TRUE(region.ok());
  const size_t fds_before = open_fds();

  const int kSilent = 3 * kSocketMaxPendingConnections;
  std::vector<int> silent;
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds) ::close(fd);
    }
  } closer{&silent};
  for (int i = 0; i < kSilent; ++i) {
    auto fd = tcp_connect(host_port_of(target->address()), std::chrono::seconds(5));
    ASSERT_TRUE(fd.ok()) << i << ": " << fd.status().to_string();
    silent.push_back(*fd);
  }
  auto peer = writer->connect(target->address());
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(writer->write(*peer, src.data(), src.size(), *region, 0, 7, 1).ok());
  ASSERT_TRUE(delivered(*writer, *target, 7)) << "the peer's write never arrived";
  EXPECT_EQ(memory, src);
  // Every connection has been accepted by now (the target accepts all the
  // backlog holds at once): its ends of the silent ones are capped. Ours are
  // kSilent, the writer's is one.
  EXPECT_LE(open_fds(), fds_before + kSilent + 1 + kSocketMaxPendingConnections + 1)
      << "the target holds more silent connections than its cap";

  // Every silent connection is closed: the first ones to make room, the
  // others at their deadline.
  std::vector<bool> seen_closed(silent.size(), false);
  int closed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (closed < kSilent && std::chrono::steady_clock::now() < deadline) {
    std::vector<Completion> got;
    Status s = target->poll(&got, 64);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (size_t i = 0; i < silent.size(); ++i) {
      if (!seen_closed[i] && closed_by_peer(silent[i])) {
        seen_closed[i] = true;
        ++closed;
      }
    }
    if (closed < kSilent) {
      pollfd p{
          silent[std::find(seen_closed.begin(), seen_closed.end(), false) - seen_closed.begin()],
          POLLIN, 0};
      ::poll(&p, 1, 10);  // a close shows as readable; else poll the target again
    }
  }
  EXPECT_EQ(closed, kSilent) << "silent connections kept open past the hello deadline";

  // The peer's connection said hello: it is not among them.
  ASSERT_TRUE(writer->write(*peer, src.data(), 16, *region, 0, 8, 2).ok());
  EXPECT_TRUE(delivered(*writer, *target, 8)) << "the peer's connection was closed";
}

// Out of fds at accept (EMFILE) is no reason to stop serving: the transport
// closes connections that said no hello to make room, or waits, and logs it
// once. In a child with a low RLIMIT_NOFILE (room for 20 more fds), so that a
// hundred silent connections reach the limit; the child exits 0 once a write
// of a peer that connected after them has arrived.
TEST(HostilePeerTest, SocketTransportOutOfFdsKeepsServing) {
  int to_parent[2];
  ASSERT_EQ(::pipe2(to_parent, O_CLOEXEC), 0);
  const std::string log =
      ::testing::TempDir() + "/hostile_peer_emfile_" + std::to_string(::getpid()) + ".log";
  std::vector<uint8_t> src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(to_parent[0]);
    const int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (logfd < 0 || ::dup2(logfd, 2) < 0) ::_exit(10);
    FabricOptions o;
    o.transport = TransportKind::kSocket;
    auto t = make_transport(o);
    if (!t.ok()) ::_exit(11);
    std::vector<uint8_t> memory(4096, 0);
    auto region = (*t)->register_memory(memory.data(), memory.size());
    if (!region.ok()) ::_exit(12);
    // At most 20 more fds: the kernel hands out the lowest free number.
    const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::close(lowest_free);
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = static_cast<rlim_t>(lowest_free + 20);
    if (lowest_free < 0 || ::setrlimit(RLIMIT_NOFILE, &r) != 0) ::_exit(13);
    const std::string line = (*t)->address() + " " + std::to_string(region->key) + "\n";
    if (::write(to_parent[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      ::_exit(14);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::vector<Completion> got;
    while (std::chrono::steady_clock::now() < deadline) {
      got.clear();
      Status s = (*t)->poll(&got, 64);
      if (!s.ok()) {
        std::fprintf(stderr, "poll failed: %s\n", s.to_string().c_str());
        ::_exit(2);
      }
      for (const Completion& c : got) {
        if (c.kind == Completion::Kind::kRemoteWrite && c.imm == 42) ::_exit(memory == src ? 0 : 3);
      }
    }
    ::_exit(4);
  }
  ::close(to_parent[1]);
  struct Reaper {
    pid_t pid;
    bool reaped = false;
    int status = 0;
    ~Reaper() {
      if (!reaped) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
    }
  } reaper{child};
  std::string line;
  {
    pollfd p{to_parent[0], POLLIN, 0};
    char buf[256];
    ssize_t n = 0;
    if (::poll(&p, 1, 30000) == 1) n = ::read(to_parent[0], buf, sizeof(buf));
    ::close(to_parent[0]);
    ASSERT_GT(n, 0) << "the child never said its address";
    line.assign(buf, static_cast<size_t>(n));
  }
  std::istringstream words(line);
  std::string address;
  uint64_t key = 0;
  words >> address >> key;

  std::vector<int> silent;
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds) ::close(fd);
    }
  } closer{&silent};
  for (int i = 0; i < 100; ++i) {
    auto fd = tcp_connect(host_port_of(address), std::chrono::seconds(5));
    ASSERT_TRUE(fd.ok()) << i << ": " << fd.status().to_string();
    silent.push_back(*fd);
  }
  auto writer = open_transport("socket");
  ASSERT_TRUE(writer);
  auto peer = writer->connect(address);
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(
      writer->write(*peer, src.data(), src.size(), RemoteRegion{key, 0, src.size()}, 0, 42, 1)
          .ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (!reaper.reaped && std::chrono::steady_clock::now() < deadline) {
    std::vector<Completion> got;
    ASSERT_TRUE(writer->poll(&got, 64).ok());
    if (::waitpid(child, &reaper.status, WNOHANG) == child) {
      reaper.reaped = true;
    } else {
      pollfd none{-1, 0, 0};
      ::poll(&none, 1, 10);  // the child's exit is not an fd: look again shortly
    }
  }
  ASSERT_TRUE(reaper.reaped) << "the child did not finish";
  std::stringstream err;
  err << std::ifstream(log).rdbuf();
  std::filesystem::remove(log);
  EXPECT_TRUE(WIFEXITED(reaper.status) && WEXITSTATUS(reaper.status) == 0)
      << "child status " << reaper.status << "\n"
      << err.str();
  const std::string text = err.str();
  size_t warnings = 0;
  for (size_t at = text.find("Too many open files"); at != std::string::npos;
       at = text.find("Too many open files", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << "the limit must be reached, and logged once:\n" << text;
}

// A port scan: connections that close, or are reset, before any hello. Not
// one of the job's peers, so not a peer that died mid-write: nothing to
// report (without tolerate_peer_loss such a close failed poll(), and the
// worker with it).
TEST(HostilePeerTest, SocketConnectionsClosedBeforeTheirHelloAreNoError) {
  auto target = open_transport("socket");
  ASSERT_TRUE(target);
  for (const bool reset : {false, true}) {
    auto fd = tcp_connect(host_port_of(target->address()), std::chrono::seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    // Taken in: the transport accepts what is waiting at its next poll.
    std::vector<Completion> got;
    ASSERT_TRUE(target->poll(&got, 64).ok());
    if (reset) {
      const linger l{1, 0};  // close with an RST
      ::setsockopt(*fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    } else {
      ::send(*fd, "\x05", 1, MSG_NOSIGNAL);  // part of a hello's length, then gone
    }
    ::close(*fd);
    for (int i = 0; i < 100; ++i) {
      Status s = target->poll(&got, 64);
      ASSERT_TRUE(s.ok()) << (reset ? "reset: " : "closed: ") << s.to_string();
    }
    EXPECT_TRUE(got.empty());
  }
  // And the job's peers are still served.
  auto writer = open_transport("socket");
  ASSERT_TRUE(writer);
  std::vector<uint8_t> memory(64, 0), src(64, 0x5a);
  auto region = target->register_memory(memory.data(), memory.size());
  ASSERT_TRUE(region.ok());
  auto peer = writer->connect(target->address());
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(writer->write(*peer, src.data(), src.size(), *region, 0, 9, 1).ok());
  EXPECT_TRUE(delivered(*writer, *target, 9));
  EXPECT_EQ(memory, src);
}

}  // namespace
}  // namespace msinfer::comm
