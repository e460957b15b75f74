// The router under a launcher (Router::start_launched), with the launcher and
// the worker ranks played by the test: what reaches its control port before
// the workers have joined.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/tcp.h"
#include "msinfer/core/json.h"
#include "msinfer/runtime/control.h"
#include "msinfer/runtime/router.h"

namespace msinfer::runtime {
namespace {

using namespace std::chrono_literals;

// Rank 0 of a launcher of `size` ranks; hands the router's blob to the test.
class FakeLauncher : public comm::Bootstrap {
 public:
  explicit FakeLauncher(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  StatusOr<std::vector<std::string>> allgather(const std::string& blob) override {
    std::lock_guard<std::mutex> l(mu_);
    blob_ = blob;
    cv_.notify_all();
    return std::vector<std::string>(static_cast<size_t>(size_), blob);
  }
  // "bootstrap-address control-address secret", once the router published it.
  std::string wait_blob() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, 30s, [&] { return !blob_.empty(); });
    return blob_;
  }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string blob_;
};

int open_fds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

void send_line(int fd, const std::string& s) {
  const std::string line = s + "\n";
  ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
}

// A 1 attention + 1 expert deployment's router, started under a fake
// launcher of 3 ranks on a thread of its own; its control address and the
// job's secret, from the blob it published.
struct LaunchedRouter {
  WorkerConfig config;  // the router keeps a reference while it starts
  FakeLauncher launcher{3};
  std::future<StatusOr<std::unique_ptr<Router>>> started;
  std::string control, secret;
  LaunchedRouter() {
    ::setenv("MSINFER_ADDRESS", "127.0.0.1", 1);
    config.attention_workers = 1;
    config.expert_workers = 1;
    started = std::async(std::launch::async,
                         [this] { return Router::start_launched(config, launcher); });
    std::istringstream blob(launcher.wait_blob());
    std::string bootstrap;
    blob >> bootstrap >> control >> secret;
  }
};

// A silent connection, one with a wrong secret and one that sends junk reach
// the control port first; the two real ranks join after them and the router
// starts at once: nobody waits for the silent one's 30 s.
TEST(RouterLaunchTest, StrayControlConnectionsDelayNoWorker) {
  LaunchedRouter l;
  ASSERT_FALSE(l.control.empty());
  const std::string &control = l.control, &secret = l.secret;
  auto& started = l.started;
  auto silent = comm::tcp_connect(control, 10s);
  auto wrong = comm::tcp_connect(control, 10s);
  auto junk = comm::tcp_connect(control, 10s);
  ASSERT_TRUE(silent.ok() && wrong.ok() && junk.ok());
  send_line(*wrong, Json{{"rank", 1}, {"secret", std::string(32, '0')}}.dump());
  send_line(*junk, "{\"rank\": [1, 2], \"secret\": 7");
  std::vector<int> ranks;
  for (int rank : {2, 1}) {
    auto fd = comm::tcp_connect(control, 10s);
    ASSERT_TRUE(fd.ok());
    // Rank 2 describes itself with mistyped fields: named "?", not a crash.
    Json hello = rank == 2 ? Json{{"rank", rank}, {"pid", "x"}, {"host", 5}, {"secret", secret}}
                           : Json{{"rank", rank}, {"pid", 1}, {"host", "h"}, {"secret", secret}};
    hello["protocol"] = control::kProtocolVersion;  // checked at the handshake
    send_line(*fd, hello.dump());
    send_line(*fd, control::encode(control::Ready::of(rank - 1, 1.0, 0)));
    ranks.push_back(*fd);
  }
  // The old router read hellos one by one, 30 s each: it would still wait here.
  ASSERT_EQ(started.wait_for(20s), std::future_status::ready);
  auto router = started.get();
  ASSERT_TRUE(router.ok()) << router.status().to_string();
  const std::string described = (*router)->describe();
  EXPECT_NE(described.find("rank 1 on h"), std::string::npos) << described;
  EXPECT_NE(described.find("rank 2 on ?"), std::string::npos) << described;
  // The ranks leave as the router shuts down (it tells them to exit).
  for (int fd : ranks) ::shutdown(fd, SHUT_RDWR);
  router->reset();
  for (int fd : ranks) ::close(fd);
  for (int fd : {*silent, *wrong, *junk}) ::close(fd);
}

// 500 connections that never send a hello reach the control port before the
// ranks: the router keeps at most 256 of them open (it closes the oldest), so
// they cannot use up its fds, and the ranks that come after them still join.
TEST(RouterLaunchTest, AFloodOfSilentConnectionsHoldsBoundedFds) {
  LaunchedRouter l;
  ASSERT_FALSE(l.control.empty());
  const std::string &control = l.control, &secret = l.secret;
  auto& started = l.started;
  const int before = open_fds();
  constexpr int kSilent = 500;
  std::vector<int> silent;
  for (int i = 0; i < kSilent; ++i) {
    auto fd = comm::tcp_connect(control, 10s);
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    silent.push_back(*fd);
  }
  // The router accepts them as they come; the most it held in 3 s.
  int most = 0;
  for (auto until = std::chrono::steady_clock::now() + 3s;
       std::chrono::steady_clock::now() < until;) {
    most = std::max(most, open_fds() - before - kSilent);
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LE(most, 256 + 2);  // the accepted silent ones (and the acceptor's own)
  EXPECT_GE(most, 200);      // it did accept them (else the bound says nothing)
  std::vector<int> ranks;
  for (int rank : {1, 2}) {
    auto fd = comm::tcp_connect(control, 10s);
    ASSERT_TRUE(fd.ok());
    Json hello{{"rank", rank}, {"pid", 1}, {"host", "h"}, {"secret", secret}};
    hello["protocol"] = control::kProtocolVersion;
    send_line(*fd, hello.dump());
    send_line(*fd, control::encode(control::Ready::of(rank - 1, 1.0, 0)));
    ranks.push_back(*fd);
  }
  ASSERT_EQ(started.wait_for(20s), std::future_status::ready);
  auto router = started.get();
  ASSERT_TRUE(router.ok()) << router.status().to_string();
  for (int fd : ranks) ::shutdown(fd, SHUT_RDWR);
  router->reset();
  for (int fd : ranks) ::close(fd);
  for (int fd : silent) ::close(fd);
}

}  // namespace
}  // namespace msinfer::runtime
