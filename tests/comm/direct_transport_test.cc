// What is particular to the direct transport (shared-memory regions, a
// mailbox, no writes into memory it did not allocate); what every transport does is
// in transport_contract_test.cc, the multi-process exchange over it in
// multiproc_test.cc.
#include "msinfer/comm/direct_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "../common/shm_objects.h"

namespace msinfer::comm {
namespace {

using msinfer::testing::shm_objects_of;
using msinfer::testing::shm_objects_removed;

std::unique_ptr<Transport> open_direct(int timeout_ms = 5000) {
  FabricOptions o;
  o.transport = TransportKind::kDirect;
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

// Peers write only into the shared-memory objects allocate() made: memory
// registered otherwise is a source of writes, never a target (no
// cross-memory attach, so no process has to let others ptrace it).
TEST(DirectTransportTest, MemoryItDidNotAllocateIsNotWritableByPeers) {
  auto a = open_direct(), b = open_direct();
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> heap(4096, 0);
  auto region = b->register_memory(heap.data(), heap.size());
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(region->key, 0u);
  auto peer = a->connect(b->address());
  ASSERT_TRUE(peer.ok());
  std::vector<uint8_t> src(100, 0x5a);
  Status s = a->write(*peer, src.data(), src.size(), *region, 50, 1, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(drain(*b).empty());
  EXPECT_EQ(std::count(heap.begin(), heap.end(), 0), 4096);
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
  EXPECT_EQ(sent, 512) << "a link holds 512 immediates";
  EXPECT_NE(s.to_string().find("took no immediate"), std::string::npos) << s.to_string();
  std::vector<Completion> out;
  ASSERT_TRUE(b->poll(&out, 100).ok());
  EXPECT_EQ(out.size(), 100u) << "poll hands out at most `max`";
  EXPECT_EQ(drain(*b).size(), 412u);
}

// A sender killed at a random point of its writes (over many seeded trials)
// must not stop another sender's immediates from reaching the receiver: with
// one ring shared by all senders, a death between claiming a cell and
// publishing it left a hole the receiver never passed (10 of 300 kills).
TEST(DirectTransportTest, ASenderKilledMidWriteBlocksOnlyItself) {
  auto receiver = open_direct(), healthy = open_direct();
  ASSERT_TRUE(receiver && healthy);
  auto mem = receiver->allocate(4096);
  ASSERT_TRUE(mem.ok());
  auto region = receiver->register_memory((*mem)->data(), 4096);
  ASSERT_TRUE(region.ok());
  auto hp = healthy->connect(receiver->address());
  ASSERT_TRUE(hp.ok());
  const std::string address = receiver->address();
  std::mt19937 rng(17);
  constexpr int kTrials = 200;
  int lost = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const pid_t victim = ::fork();
    if (victim == 0) {
      auto t = open_direct();
      auto p = t ? t->connect(address) : StatusOr<int>(internal_error("open"));
      if (!p.ok()) ::_exit(1);
      uint8_t byte = 0;
      std::vector<Completion> sink;
      for (uint32_t i = 0;; ++i) {
        // Zero-byte and one-byte writes: most of the time is spent posting.
        if (!t->write(*p, &byte, i & 1, *region, 0, 0x10000000u | (i & 0xffff), 0).ok()) ::_exit(2);
        sink.clear();
        (void)t->poll(&sink, 64);  // its local completions
      }
    }
    ASSERT_GT(victim, 0);
    // Drain the receiver until the victim has posted, then some more for a
    // random while, and kill it there.
    std::vector<Completion> got;
    const auto start = std::chrono::steady_clock::now();
    bool victim_posted = false;
    while (!victim_posted && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      got.clear();
      ASSERT_TRUE(receiver->poll(&got, 256).ok());
      victim_posted = !got.empty();
    }
    ASSERT_TRUE(victim_posted) << "trial " << trial << ": the victim never wrote";
    const auto kill_at = std::chrono::steady_clock::now() +
                         std::chrono::microseconds(std::uniform_int_distribution<int>(0, 300)(rng));
    while (std::chrono::steady_clock::now() < kill_at) {
      got.clear();
      ASSERT_TRUE(receiver->poll(&got, 256).ok());
    }
    ::kill(victim, SIGKILL);
    ASSERT_EQ(::waitpid(victim, nullptr, 0), victim);
    // The healthy sender's write must arrive.
    const uint32_t marker = 0x20000000u | static_cast<uint32_t>(trial);
    ASSERT_TRUE(healthy->write(*hp, (*mem)->data(), 0, *region, 0, marker, 0).ok());
    bool arrived = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!arrived && std::chrono::steady_clock::now() < deadline) {
      got.clear();
      ASSERT_TRUE(receiver->poll(&got, 256).ok());
      for (const Completion& c : got)
        arrived |= c.kind == Completion::Kind::kRemoteWrite && c.imm == marker;
    }
    if (!arrived) ++lost;
    drain(*healthy);
  }
  EXPECT_EQ(lost, 0) << lost << " of " << kTrials
                     << " kills stopped another sender's immediate from arriving";
}

// A child process that opens a direct endpoint, allocates and registers a
// region, and waits to be killed, holding its objects; killed and reaped by
// kill() or, whatever a test does, when it goes out of scope.
class HoldingChild {
 public:
  HoldingChild() {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      auto t = open_direct();
      auto mem = t->allocate(4096);
      if (!mem.ok()) ::_exit(1);
      auto r = t->register_memory((*mem)->data(), 64);
      if (!r.ok()) ::_exit(1);
      const std::string msg = t->address() + "\n" + r->encode();
      if (::write(fds[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) ::_exit(1);
      while (true) ::pause();  // until killed, holding its objects
    }
    ::close(fds[1]);
    char buf[512];
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    ::close(fds[0]);
    if (n <= 25) return;
    const std::string msg(buf, static_cast<size_t>(n));
    const size_t nl = msg.find('\n');
    auto r = RemoteRegion::decode(msg.substr(nl + 1));
    if (!r.ok()) return;
    address = msg.substr(0, nl);
    region = *r;
  }
  HoldingChild(const HoldingChild&) = delete;
  HoldingChild& operator=(const HoldingChild&) = delete;
  ~HoldingChild() { kill(); }
  void kill() {
    if (pid <= 0 || reaped) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    reaped = true;
  }

  pid_t pid = -1;
  std::string address;  // empty if it did not start
  RemoteRegion region;

 private:
  bool reaped = false;
};

// A writer (300 ms write timeout) connected to `child` as its peer 0.
struct Writer {
  std::unique_ptr<Transport> t;
  int peer = -1;
};
Writer connect_writer(const HoldingChild& child) {
  Writer w;
  if (child.address.empty()) {
    ADD_FAILURE() << "the child did not start";
    return w;
  }
  w.t = open_direct(300);
  auto peer = w.t->connect(child.address);
  if (!peer.ok()) ADD_FAILURE() << peer.status().to_string();
  w.peer = peer.ok() ? *peer : -1;
  return w;
}

// Writes into a dead peer until one fails; the status of that one.
Status write_until_refused(Writer& w, const RemoteRegion& region) {
  uint8_t byte = 1;
  Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) s = w.t->write(w.peer, &byte, 1, region, 0, 0, 0);
  return s;
}

void expect_peer_0_named_gone(const Status& s) {
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.to_string().find("peer 0"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("gone"), std::string::npos) << s.to_string();
}

TEST(DirectTransportTest, ADeadPeerIsNamedAndItsObjectsAreRemoved) {
  HoldingChild child;
  Writer a = connect_writer(child);
  ASSERT_GE(a.peer, 0);
  EXPECT_EQ(shm_objects_of(child.pid).size(), 3u) << "its mailbox, its region and its lock";
  // One write while it lives maps its region here, so that what follows does
  // not depend on whether another process has removed its objects yet.
  uint8_t byte = 1;
  ASSERT_TRUE(a.t->write(a.peer, &byte, 1, child.region, 0, 0, 0).ok());
  child.kill();

  // Like an RDMA write, a write into a dead peer's memory goes through; once
  // its link is full, the writer looks and names it.
  expect_peer_0_named_gone(write_until_refused(a, child.region));

  auto next = open_direct();  // a new endpoint clears what the dead one left
  EXPECT_TRUE(shm_objects_removed(child.pid));
}

// Any new endpoint on the machine removes a dead peer's objects, perhaps
// before anyone wrote into its region: the writer still names the peer, not
// the object it could not open.
TEST(DirectTransportTest, ADeadPeerWhoseObjectsWereRemovedIsNamed) {
  HoldingChild child;
  Writer a = connect_writer(child);
  ASSERT_GE(a.peer, 0);
  child.kill();
  auto next = open_direct();
  ASSERT_TRUE(shm_objects_removed(child.pid));

  expect_peer_0_named_gone(write_until_refused(a, child.region));
  // And one who connects only now is told the same.
  auto late = next->connect(child.address);
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(late.status().to_string().find(child.address + " is gone"), std::string::npos)
      << late.status().to_string();
}

// The same while its objects are being removed and its lock still reads as
// held: a cleaner holds a dead owner's lock while it unlinks the objects
// (the lock last), and an owner that closes unlinks them before its lock.
// Here the child lives on (so no other test's cleaner touches its objects)
// and the test unlinks them as either would.
TEST(DirectTransportTest, APeerWhoseObjectsAreBeingRemovedIsNamed) {
  HoldingChild child;
  Writer a = connect_writer(child);
  ASSERT_GE(a.peer, 0);
  size_t unlinked = 0;
  for (const std::string& name : shm_objects_of(child.pid)) {
    if (name.find(".live") == std::string::npos)
      unlinked += ::shm_unlink(("/" + name).c_str()) == 0;
  }
  EXPECT_EQ(unlinked, 2u) << "its mailbox and its region";
  expect_peer_0_named_gone(write_until_refused(a, child.region));
  auto late = a.t->connect(child.address);
  EXPECT_NE(late.status().to_string().find(child.address + " is gone"), std::string::npos)
      << late.status().to_string();
  child.kill();
  auto next = open_direct();
  EXPECT_TRUE(shm_objects_removed(child.pid));
}

// Containers that share /dev/shm but not a PID namespace: a live owner there
// has a pid that is dead here (kill(pid, 0) == ESRCH), or another process's.
// Its objects must stay while it lives, and go once it is dead. The helper
// runs in a new PID namespace (unshare -p), with a pid that no process of
// ours has.
TEST(DirectTransportTest, ObjectsOfALiveOwnerInAnotherPidNamespaceAreKept) {
  if (::geteuid() != 0 || std::system("unshare -p -f --mount-proc true >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs unshare -p (root, util-linux)";
  }
  // A pid free here and behind this namespace's allocation counter: the
  // processes started meanwhile (this test's own among them) take pids above
  // the counter, so it stays free until the counter wraps. (A fixed range
  // failed whenever the counter was passing through it.)
  long counter = 0;
  std::ifstream("/proc/sys/kernel/ns_last_pid") >> counter;
  pid_t want = 0;
  for (pid_t p = static_cast<pid_t>(counter) - 200; p > 1000 && want == 0; p -= 7) {
    if (::kill(p, 0) != 0 && errno == ESRCH) want = p;
  }
  for (pid_t p = static_cast<pid_t>(counter) + 5000; p < 32000 && want == 0; p += 7) {
    if (::kill(p, 0) != 0 && errno == ESRCH) want = p;  // just after a wrap
  }
  ASSERT_GT(want, 0);
  int to[2], from[2];
  ASSERT_EQ(::pipe2(to, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(from, O_CLOEXEC), 0);
  const std::string last = std::to_string(want - 1);
  const pid_t ns = ::fork();
  if (ns == 0) {
    ::dup2(to[0], 0);
    ::dup2(from[1], 1);
    ::execlp("unshare", "unshare", "-p", "-f", "--kill-child", "--mount-proc", "sh", "-c",
             "echo \"$0\" > /proc/sys/kernel/ns_last_pid; \"$1\"; exit $?", last.c_str(),
             SHM_OWNER_HELPER, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to[0]);
  ::close(from[1]);
  struct Stop {  // whatever happens below: the namespace goes
    pid_t pid;
    int in, out;
    ~Stop() {
      ::close(in);
      ::close(out);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } stop{ns, to[1], from[0]};
  std::string address;
  char c;
  pollfd p{from[0], POLLIN, 0};
  while (::poll(&p, 1, 10000) == 1 && ::read(from[0], &c, 1) == 1 && c != '\n') address += c;
  ASSERT_EQ(address.rfind("direct:" + std::to_string(want) + ":", 0), 0u)
      << "the helper did not get pid " << want << " in its namespace: '" << address << "'";
  const std::string mailbox = address.substr(address.rfind(':') + 1);
  ASSERT_TRUE(std::filesystem::exists("/dev/shm/" + mailbox));
  ASSERT_NE(::kill(want, 0), 0) << "pid " << want << " exists here: the test proves nothing";

  remove_dead_shm_endpoints();
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + mailbox))
      << "a live owner's mailbox was removed";
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + mailbox + "-r1"))
      << "a live owner's region was removed";
  {  // and a writer here still reaches it
    auto w = open_direct();
    ASSERT_TRUE(w);
    EXPECT_TRUE(w->connect(address).ok());
  }

  ASSERT_EQ(::write(to[1], "die\n", 4), 4);  // dies holding its objects
  while (::poll(&p, 1, 10000) == 1 && ::read(from[0], &c, 1) == 1) {
  }
  // Every new endpoint runs the same cleaner, so under ctest -j2 another
  // test's cleaner may hold the dead owner's lock while it removes the
  // objects (the lock last); this call then sees the lock held and leaves
  // them to it. Either way a cleaner removes them: call it until they are
  // gone, for at most 10 s.
  const auto gone = [&] {
    return !std::filesystem::exists("/dev/shm/" + mailbox) &&
           !std::filesystem::exists("/dev/shm/" + mailbox + "-r1") &&
           !std::filesystem::exists("/dev/shm/" + mailbox + ".live");
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    remove_dead_shm_endpoints();
    if (gone() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + mailbox)) << "a dead owner's mailbox stayed";
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + mailbox + "-r1"));
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + mailbox + ".live"));
}

TEST(DirectTransportTest, ClosingRemovesEveryObject) {
  {
    auto t = open_direct();
    ASSERT_TRUE(t);
    auto mem = t->allocate(1 << 16);
    ASSERT_TRUE(mem.ok());
    EXPECT_EQ(shm_objects_of(::getpid()).size(), 3u) << "mailbox, region, lock";
  }
  EXPECT_TRUE(shm_objects_of(::getpid()).empty());
}

}  // namespace
}  // namespace msinfer::comm
