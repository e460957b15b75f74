// What is particular to the direct transport (shared-memory regions, a
// mailbox, CMA for memory it did not allocate); what every transport does is
// in transport_contract_test.cc, the multi-process exchange over it in
// multiproc_test.cc.
#include "msinfer/comm/direct_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <numeric>

#include "../common/shm_objects.h"

namespace msinfer::comm {
namespace {

using msinfer::testing::shm_objects_of;

std::unique_ptr<Transport> open_direct(int timeout_ms = 5000) {
  FabricOptions o;
  o.provider = "direct";
  o.write_timeout_ms = timeout_ms;
  auto t = make_transport(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<Completion> drain(Transport& t) {
  std::vector<Completion> out;
  EXPECT_TRUE(t.poll(&out, 1000).ok());
  return out;
}

TEST(DirectTransportTest, AllocatedRegionsAreSharedMemory) {
  auto b = open_direct();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->name(), "direct");
  auto mem = b->allocate(1 << 20);
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  auto region = b->register_memory((*mem)->data() + 4096, 8192);
  ASSERT_TRUE(region.ok());
  EXPECT_NE(region->key, 0u) << "peers map the object instead of using CMA";
  EXPECT_EQ(region->base, 4096u) << "named by offset into the object";
}

TEST(DirectTransportTest, MemoryItDidNotAllocateIsWrittenThroughCrossMemoryAttach) {
  auto a = open_direct(), b = open_direct();
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> heap(4096, 0);
  auto region = b->register_memory(heap.data(), heap.size());
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(region->key, 0u);
  auto peer = a->connect(b->address());
  ASSERT_TRUE(peer.ok());
  std::vector<uint8_t> src(100, 0x5a);
  ASSERT_TRUE(a->write(*peer, src.data(), src.size(), *region, 50, 1, 0).ok());
  auto remote = drain(*b);
  ASSERT_EQ(remote.size(), 1u);
  EXPECT_EQ(heap[49], 0);
  EXPECT_EQ(heap[50], 0x5a);
  EXPECT_EQ(heap[149], 0x5a);
  EXPECT_EQ(heap[150], 0);
}

TEST(DirectTransportTest, AddressesThatAreNotMailboxesAreRefused) {
  auto a = open_direct();
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->connect("direct:1:no-such-mailbox").ok());
  EXPECT_FALSE(a->connect("shm-address").ok());
}

TEST(DirectTransportTest, AMailboxNobodyDrainsFailsAfterTheTimeout) {
  auto a = open_direct(200), b = open_direct();
  ASSERT_TRUE(a && b);
  auto mem = b->allocate(64);
  auto region = b->register_memory((*mem)->data(), (*mem)->size());
  auto peer = a->connect(b->address());
  ASSERT_TRUE(region.ok() && peer.ok());
  Status s;
  int sent = 0;
  while (s.ok() && sent < 10000) {
    s = a->write(*peer, (*mem)->data(), 0, *region, 0, 0, 0);
    if (s.ok()) ++sent;
  }
  EXPECT_EQ(sent, 4096) << "the mailbox holds 4096 immediates";
  EXPECT_NE(s.to_string().find("took no immediate"), std::string::npos) << s.to_string();
  EXPECT_EQ(drain(*b).size(), 1000u) << "poll hands out at most `max`";
}

TEST(DirectTransportTest, ADeadPeerIsNamedAndItsObjectsAreRemoved) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    auto t = open_direct();
    std::vector<uint8_t> heap(64);
    auto r = t->register_memory(heap.data(), heap.size());
    auto mem = t->allocate(4096);
    if (!r.ok() || !mem.ok()) ::_exit(1);
    const std::string msg = t->address() + "\n" + r->encode();
    if (::write(fds[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) ::_exit(1);
    while (true) ::pause();  // until killed, holding its objects
  }
  ::close(fds[1]);
  char buf[512];
  const ssize_t n = ::read(fds[0], buf, sizeof(buf));
  ::close(fds[0]);
  ASSERT_GT(n, 25);
  const std::string msg(buf, static_cast<size_t>(n));
  const size_t nl = msg.find('\n');
  auto region = RemoteRegion::decode(msg.substr(nl + 1));
  ASSERT_TRUE(region.ok());
  auto a = open_direct(300);
  auto peer = a->connect(msg.substr(0, nl));
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  EXPECT_EQ(shm_objects_of(child).size(), 2u) << "its mailbox and its region";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);

  uint8_t byte = 1;
  Status s = a->write(*peer, &byte, 1, *region, 0, 0, 0);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.to_string().find("peer 0"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("gone"), std::string::npos) << s.to_string();

  auto next = open_direct();  // a new endpoint clears what the dead one left
  EXPECT_TRUE(shm_objects_of(child).empty());
}

TEST(DirectTransportTest, ClosingRemovesEveryObject) {
  {
    auto t = open_direct();
    ASSERT_TRUE(t);
    auto mem = t->allocate(1 << 16);
    ASSERT_TRUE(mem.ok());
    EXPECT_EQ(shm_objects_of(::getpid()).size(), 2u);
  }
  EXPECT_TRUE(shm_objects_of(::getpid()).empty());
}

}  // namespace
}  // namespace msinfer::comm
