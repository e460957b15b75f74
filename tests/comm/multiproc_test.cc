// M2N between separate processes (fork) over libfabric shm and tcp (loopback),
// bootstrapped through a BootstrapServer in the test process. Children are
// always reaped: killed if still running when the test ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "../common/shm_objects.h"
#include "msinfer/comm/exchange.h"
#include "msinfer/comm/fabric_transport.h"

namespace msinfer::comm {
namespace {

struct Outcome {
  std::vector<int> exit_codes;
  double seconds = 0;
};

// The bootstrap server runs in a process of its own: the ranks are forked
// from this one while it has no other thread (a child forked while another
// thread holds the allocator's lock can hang, as seen under ASan).
struct ServerProcess {
  pid_t pid = -1;
  std::string address, secret;
  explicit ServerProcess(int world) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      auto server = BootstrapServer::start(world);
      const std::string a = server.ok() ? (*server)->address() + " " + (*server)->secret() : "";
      ssize_t w = ::write(fds[1], a.data(), a.size());
      (void)w;
      ::close(fds[1]);
      while (true) ::pause();  // until killed
    }
    ::close(fds[1]);
    char buf[256];
    const ssize_t k = ::read(fds[0], buf, sizeof(buf));
    ::close(fds[0]);
    const std::string got = k > 0 ? std::string(buf, static_cast<size_t>(k)) : "";
    address = got.substr(0, got.find(' '));
    secret = got.find(' ') == std::string::npos ? "" : got.substr(got.find(' ') + 1);
    EXPECT_FALSE(address.empty()) << "bootstrap server did not start";
  }
  ~ServerProcess() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// Runs one process per rank; each writes its Status message to a pipe.
Outcome run_processes(const ExchangeOptions& o, std::vector<std::string>* messages) {
  const int n = o.senders + o.receivers;
  ServerProcess server(n);
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      auto boot =
          make_tcp_bootstrap(r, n, server.address, server.secret, std::chrono::milliseconds(10000));
      Status s = boot.ok() ? run_exchange(**boot, o, nullptr) : boot.status();
      std::string msg = s.ok() ? "ok" : s.to_string();
      ssize_t w = ::write(fds[1], msg.data(), msg.size());
      (void)w;
      ::_exit(s.ok() ? 0 : 1);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  Outcome out;
  out.exit_codes.assign(n, -1);
  const auto deadline = t0 + std::chrono::seconds(60);
  for (int r = 0; r < n; ++r) {
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pids[r], SIGKILL);  // never leave a child behind
        ::waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    out.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char buf[4096];
    ssize_t k = ::read(pipes[r], buf, sizeof(buf));
    messages->push_back(k > 0 ? std::string(buf, k) : "");
    ::close(pipes[r]);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  remove_dead_shm_endpoints();  // of a rank that died holding its endpoint
  return out;
}

class MultiprocTest : public ::testing::TestWithParam<std::string> {};

// The tests of what arrives wait for a slow peer far longer than the 5 s
// default: under TSan, eight ranks on two cores beside other tests' processes
// once kept a tcp;ofi_rxm connection from being accepted for 5 s (stop 53's
// CI). How fast a dead peer is named is AKilledPeerIsNamedWithinTheTimeout's
// question; run_processes still kills every rank after 60 s.
constexpr int kCorrectnessTimeoutMs = 30000;

TEST_P(MultiprocTest, EveryByteArrivesUpTo4x4) {
  for (auto [m, n] : {std::pair{1, 1}, {2, 2}, {4, 4}, {3, 2}}) {
    ExchangeOptions o;
    o.transport = *parse_transport(GetParam());
    o.senders = m;
    o.receivers = n;
    o.bytes = 64 * 1024;
    o.row_bytes = 512;
    o.iterations = 30;
    o.slots = 3;
    o.checksum = true;
    o.empty_to_last = m == 4;  // empty messages in the 4x4 case
    o.timeout_ms = kCorrectnessTimeoutMs;
    std::vector<std::string> msgs;
    Outcome out = run_processes(o, &msgs);
    for (int r = 0; r < m + n; ++r) {
      EXPECT_EQ(out.exit_codes[r], 0) << GetParam() << " " << m << "x" << n << " rank " << r
                                      << ": " << msgs[r];
    }
  }
}

// Thousands of rounds: the remote-write completions of some providers carry
// a stale op_context (shm: a value from another process) now and then; the
// transport must never take it for one of its own operations. This crashed
// one 2x2 run in five of `bench m2n --size 32k --iters 300` before.
TEST_P(MultiprocTest, ThousandsOfRoundsStayCorrect) {
  ExchangeOptions o;
  o.transport = *parse_transport(GetParam());
  o.senders = 2;
  o.receivers = 2;
  o.bytes = 32 * 1024;
  o.row_bytes = 2048;
  o.iterations = GetParam() == "shm" ? 4000 : 1000;
  o.slots = 2;
  o.timeout_ms = kCorrectnessTimeoutMs;
  std::vector<std::string> msgs;
  Outcome out = run_processes(o, &msgs);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out.exit_codes[r], 0) << GetParam() << " rank " << r << ": " << msgs[r];
  }
}

TEST_P(MultiprocTest, AKilledPeerIsNamedWithinTheTimeout) {
  ExchangeOptions o;
  o.transport = *parse_transport(GetParam());
  o.senders = 2;
  o.receivers = 2;
  o.bytes = 4096;
  o.iterations = 50;
  // Long enough for the ten rounds before the death under TSan on a loaded
  // machine (at 1.5 s a tcp run's ranks timed out on each other first and
  // the rank that was to die exited 1: a clean-clone .ci/run, 2026-12-06).
  o.timeout_ms = 5000;
  o.die_rank = 3;  // expert rank (receiver index 1)
  o.die_at_iteration = 10;
  std::vector<std::string> msgs;
  Outcome out = run_processes(o, &msgs);
  EXPECT_EQ(out.exit_codes[3], 3) << "rank 3 should have died at round 10: " << msgs[3];
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out.exit_codes[r], 0) << "rank " << r << " should have failed: " << msgs[r];
  }
  // Attention ranks wait for the dead expert's answer: they name it, either
  // as the peer a write or read failed on, or among the senders still
  // missing ("sender(s) 0, 1" when expert 0 failed too, on the first
  // attention rank's failure: errors cascade).
  for (int r = 0; r < 2; ++r) {
    bool named = msgs[r].find("peer 1") != std::string::npos;
    const size_t at = msgs[r].find("sender(s) ");
    if (at != std::string::npos) {
      std::stringstream missing(msgs[r].substr(at + 10));
      std::string id;
      while (std::getline(missing, id, ',')) {
        if (std::atoi(id.c_str()) == 1) named = true;
      }
    }
    EXPECT_TRUE(named) << "rank " << r << ": " << msgs[r];
  }
  EXPECT_LT(out.seconds, 30.0) << "not detected within the timeout";
}

using msinfer::testing::shm_objects_of;
using msinfer::testing::shm_objects_removed;

// A killed process leaves its shm endpoint object behind. It must neither stop
// a later process that reuses the pid (libfabric's default name is the pid)
// nor stay in /dev/shm: the next endpoint removes objects of dead processes.
// (What the dead process left is counted while it lives: once it is dead,
// any test's new endpoint beside this one may remove them.)
TEST(ShmEndpointTest, ObjectsOfKilledProcessesAreNoObstacleAndAreRemoved) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    // Stand in for a dead process with this pid: libfabric's default name.
    std::ofstream("/dev/shm/" + std::to_string(::getpid()) + ":0:0") << "stale";
    FabricOptions o;
    o.transport = TransportKind::kFabricShm;
    auto t = make_fabric_transport(o);
    if (!t.ok()) ::_exit(1);
    if (::write(ready[1], "1", 1) != 1) ::_exit(1);
    while (true) ::pause();  // until killed, holding the endpoint
  }
  ::close(ready[1]);
  char c = 0;
  const bool opened = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  std::remove(("/dev/shm/" + std::to_string(child) + ":0:0").c_str());
  if (opened) {
    EXPECT_EQ(shm_objects_of(child).size(), 2u) << "its endpoint's object and lock";
  }
  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  ASSERT_TRUE(opened) << "the endpoint did not open next to a stale object";

  FabricOptions o;
  o.transport = TransportKind::kFabricShm;
  auto t = make_fabric_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(shm_objects_removed(child)) << "the dead process's object was not removed";
  EXPECT_EQ(shm_objects_of(::getpid()).size(), 2u) << "the endpoint's object and its lock";
  t->reset();
  EXPECT_TRUE(shm_objects_of(::getpid()).empty()) << "closing the endpoint removes its object";
}

INSTANTIATE_TEST_SUITE_P(Providers, MultiprocTest, ::testing::Values("shm", "tcp", "direct", "socket"));

}  // namespace
}  // namespace msinfer::comm
