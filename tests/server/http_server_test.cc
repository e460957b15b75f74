// The HTTP server in-process over a fake backend (one token per request and
// step; token text is empty without a tokenizer, so answers carry usage and
// finish reasons): many client threads at once over real sockets, streaming
// and not, some of them disconnecting, while the event loop and the engine
// thread hand work to each other. Small and self-contained, so it also runs
// under ThreadSanitizer.
#include "msinfer/server/http_server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "../common/loopback_http.h"
#include "../common/prometheus_text.h"

namespace msinfer::server {
namespace {

using namespace std::chrono_literals;

class OneTokenPerStep final : public GenerationBackend {
 public:
  // steps: the steps that made a token, counted for any thread to read;
  // each such step takes step_time at least.
  explicit OneTokenPerStep(std::atomic<int64_t>* steps = nullptr,
                           std::chrono::microseconds step_time = 0us)
      : steps_(steps), step_time_(step_time) {}
  Status add(const runtime::GenerationRequest& r) override {
    left_[r.id] = r.sampling.max_tokens;
    return ok_status();
  }
  StatusOr<std::vector<runtime::TokenEvent>> step() override {
    std::vector<runtime::TokenEvent> out;
    for (auto it = left_.begin(); it != left_.end();) {
      runtime::TokenEvent ev;
      ev.request_id = it->first;
      ev.token = 7;
      ev.finished = --it->second == 0;
      if (ev.finished) ev.finish_reason = runtime::FinishReason::kLength;
      out.push_back(ev);
      it = ev.finished ? left_.erase(it) : std::next(it);
    }
    if (!out.empty()) {
      if (step_time_.count() > 0) std::this_thread::sleep_for(step_time_);
      if (steps_ != nullptr) ++*steps_;
    }
    return out;
  }
  Status cancel(int64_t id) override {
    left_.erase(id);
    return ok_status();
  }
  bool idle() const override { return left_.empty(); }
  int64_t running() const override { return static_cast<int64_t>(left_.size()); }
  int64_t waiting() const override { return 0; }
  double kv_usage() const override { return left_.empty() ? 0.0 : 0.25; }
  runtime::EngineCounters counters() const override { return {}; }

 private:
  std::map<int64_t, int64_t> left_;
  std::atomic<int64_t>* steps_;
  std::chrono::microseconds step_time_;
};

// Sends a request; reads until the server closes or `stop_after` bytes came.
std::string exchange(int port, const std::string& req, size_t stop_after = SIZE_MAX) {
  const int fd = testing::send_request(port, req);
  if (fd < 0) return "";
  std::string got = testing::read_from(fd, 30s, "", stop_after);
  ::close(fd);
  return got;
}

std::string post(const std::string& body) {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
         "application/json\r\nConnection: close\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// What the server serves: model "m", its token ids below 100.
ApiContext model_m() {
  ApiContext ctx;
  ctx.served_model_name = "m";
  ctx.vocab = 100;
  ctx.max_model_len = 1 << 20;
  return ctx;
}

// io_uring: the loop sends a round's writes in one io_uring submit (else a
// send() each). anticipate: the loop polls for rounds when they are due (else
// the engine thread wakes it for each).
void concurrent_clients_streaming_and_disconnecting(bool io_uring, bool anticipate) {
  Metrics metrics("m");
  const ApiContext ctx = model_m();
  ServerOptions so;
  so.port = 0;
  so.io_uring = io_uring;
  so.anticipate = anticipate;
  auto server = HttpServer::start(so, ctx, &metrics);
  ASSERT_TRUE(server.ok()) << server.status().message();
  HttpServer& http = **server;
  std::thread loop([&] { http.run(); });
  // Loading: no scheduler yet.
  EXPECT_NE(exchange(http.port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .find(" 503 "),
            std::string::npos);
  SchedulerOptions o;
  o.max_num_seqs = 8;
  auto sched = std::make_unique<Scheduler>(std::make_unique<OneTokenPerStep>(), o, &metrics);
  http.set_scheduler(sched.get());

  std::atomic<int> plain_ok{0}, stream_ok{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i) {
        const int kind = (t + i) % 3;
        if (kind == 0) {
          const std::string r =
              exchange(http.port(), post(R"({"prompt": [1, 2], "max_tokens": 20})"));
          if (r.find(" 200 ") != std::string::npos &&
              r.find("\"completion_tokens\":20") != std::string::npos)
            ++plain_ok;
        } else if (kind == 1) {
          const std::string r = exchange(
              http.port(),
              post(
                  R"({"prompt": [1], "max_tokens": 30, "stream": true, "stream_options": {"include_usage": true}})"));
          if (r.find("\"finish_reason\":\"length\"") != std::string::npos &&
              r.find("\"completion_tokens\":30") != std::string::npos &&
              r.find("data: [DONE]") != std::string::npos) {
            ++stream_ok;
          }
        } else {
          // Leaves after the first bytes of a long stream: cancelled.
          exchange(http.port(), post(R"({"prompt": [1], "max_tokens": 1000000, "stream": true})"),
                   1);
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(plain_ok.load(), 16);
  EXPECT_EQ(stream_ok.load(), 16);
  // The abandoned streams were cancelled: the batch empties.
  EXPECT_TRUE(sched->wait_idle(std::chrono::steady_clock::now() + 30s));
  const std::string m =
      exchange(http.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(m.find("msinfer:request_aborted_total{model_name=\"m\"} 16"), std::string::npos) << m;
  if (!io_uring) {
    EXPECT_NE(m.find("msinfer:http_batched_writes_total{model_name=\"m\"} 0\n"), std::string::npos)
        << m;
  }
  EXPECT_NE(m.find("msinfer:http_loop_wakeups_total{model_name=\"m\"} "), std::string::npos) << m;
  http.set_draining();
  sched->start_draining();
  EXPECT_NE(exchange(http.port(), post(R"({"prompt": [1], "max_tokens": 2})")).find(" 503 "),
            std::string::npos);
  sched->stop();
  http.stop();
  loop.join();
  sched.reset();
}

TEST(HttpServerTest, ConcurrentClientsStreamingAndDisconnecting) {
  concurrent_clients_streaming_and_disconnecting(true, true);
}

TEST(HttpServerTest, ConcurrentClientsStreamingAndDisconnectingWithASendEachAndWakeUps) {
  concurrent_clients_streaming_and_disconnecting(false, false);
}

// A loop that falls behind holds the engine back: with the loop stuck (the
// test holds it in a signal handler it runs), the engine makes at most
// max_rounds_ahead more steps and waits; let go, the loop takes them and the
// engine goes on.
TEST(HttpServerTest, TheEngineWaitsForALoopFarBehind) {
  Metrics metrics("m");
  const ApiContext ctx = model_m();
  ServerOptions so;
  so.port = 0;
  so.max_rounds_ahead = 32;
  auto server = HttpServer::start(so, ctx, &metrics);
  ASSERT_TRUE(server.ok()) << server.status().message();
  HttpServer& http = **server;
  std::mutex mu;
  std::condition_variable cv;
  bool hold = true, held = false;
  http.on_signal([&](int) {
    std::unique_lock<std::mutex> l(mu);
    held = true;
    cv.notify_all();
    cv.wait(l, [&] { return !hold; });
  });
  std::thread loop([&] { http.run(); });
  std::atomic<int64_t> steps{0};
  SchedulerOptions o;
  auto sched =
      std::make_unique<Scheduler>(std::make_unique<OneTokenPerStep>(&steps, 100us), o, &metrics);
  http.set_scheduler(sched.get());
  auto release = [&] {
    std::lock_guard<std::mutex> l(mu);
    hold = false;
    cv.notify_all();
  };
  // Whatever fails below, the loop is let go and everything stops.
  struct Cleanup {
    std::function<void()> f;
    ~Cleanup() { f(); }
  } cleanup{[&] {
    release();
    sched->stop();
    http.stop();
    loop.join();
  }};

  // A stream that would run for a million steps (100 s; its tokens' text is
  // empty: its events carry nothing until the end), once it runs.
  const int fd = testing::send_request(
      http.port(), post(R"({"prompt": [1], "max_tokens": 1000000, "stream": true})"));
  ASSERT_GE(fd, 0);
  ASSERT_NE(testing::read_from(fd, 30s, " 200 OK").find(" 200 OK"), std::string::npos);
  const auto running_by = std::chrono::steady_clock::now() + 30s;
  while (steps.load() < 10 && std::chrono::steady_clock::now() < running_by) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(steps.load(), 10);
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, 30s, [&] { return held; }));
  }
  // The engine stops: no step for 200 ms, a second after the hold at the
  // earliest (its 32 steps take 3 ms; a machine busy with other tests may
  // keep it off its cpu for a while), a deadline in case it never stops.
  const int64_t at_hold = steps.load();
  int64_t last = at_hold;
  const auto held_at = std::chrono::steady_clock::now();
  auto quiet_since = held_at;
  const auto deadline = held_at + 30s;
  while (std::chrono::steady_clock::now() < deadline &&
         (std::chrono::steady_clock::now() - held_at < 1s ||
          std::chrono::steady_clock::now() - quiet_since < 200ms)) {
    std::this_thread::sleep_for(5ms);
    const int64_t now = steps.load();
    if (now != last) {
      last = now;
      quiet_since = std::chrono::steady_clock::now();
    }
  }
  // At most the 32 rounds the loop may be behind, and the one the engine was
  // making as the loop stopped.
  EXPECT_LE(last - at_hold, 33) << "the engine ran on without the loop";
  release();
  // The loop takes the rounds; the engine goes on.
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (steps.load() <= last + 100 && std::chrono::steady_clock::now() < until) {
    testing::read_from(fd, 10ms);
  }
  EXPECT_GT(steps.load(), last + 100);
  ::close(fd);
  EXPECT_TRUE(sched->wait_idle(std::chrono::steady_clock::now() + 30s));
  const std::string m =
      exchange(http.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const size_t body = m.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << m;
  EXPECT_GE(testing::metric(testing::parse_metrics(m.substr(body + 4)),
                            "msinfer:http_engine_waits_total{"),
            1)
      << m;
}

// A deployment's backend whose workers' health the test sets (as the
// router publishes it), and which can stop as a router does.
class DeploymentOf final : public GenerationBackend {
 public:
  Status add(const runtime::GenerationRequest&) override { return ok_status(); }
  StatusOr<std::vector<runtime::TokenEvent>> step() override {
    return std::vector<runtime::TokenEvent>{};
  }
  Status cancel(int64_t) override { return ok_status(); }
  bool idle() const override { return true; }
  int64_t running() const override { return 0; }
  int64_t waiting() const override { return 0; }
  double kv_usage() const override { return 0; }
  runtime::EngineCounters counters() const override { return {}; }
  Status health() const override {
    std::lock_guard<std::mutex> l(mu);
    return stopped;
  }
  std::optional<runtime::DeploymentHealth> deployment_health() const override {
    std::lock_guard<std::mutex> l(mu);
    return d;
  }
  mutable std::mutex mu;
  runtime::DeploymentHealth d;   // GUARDED_BY(mu)
  Status stopped = ok_status();  // GUARDED_BY(mu)
};

// /health's answer in each state (docs/SERVING.md): 200 "ok" or "degraded"
// (a worker down, still serving), 503 "recovering", "failed" (with the
// error), "draining", "loading"; a deployment's body lists its workers.
TEST(HttpServerTest, HealthSaysWhatTheDeploymentCanServe) {
  EXPECT_EQ(health_answer(nullptr, false).status, 503);
  EXPECT_EQ(health_answer(nullptr, false).body, (Json{{"status", "loading"}}));
  Metrics metrics("m");
  auto backend = std::make_unique<DeploymentOf>();
  DeploymentOf* dep = backend.get();
  auto set = [&](int attention_live, int expert_live, bool recovering) {
    std::lock_guard<std::mutex> l(dep->mu);
    dep->d.attention = {attention_live, 2, 0, 0};
    dep->d.expert = {expert_live, 3, 0, 0};
    dep->d.recovering = recovering;
  };
  set(2, 3, false);
  SchedulerOptions o;
  o.stats_interval = 10ms;
  Scheduler sched(std::move(backend), o, &metrics);
  const Json whole = {{"attention", {{"live", 2}, {"expected", 2}}},
                      {"expert", {{"live", 3}, {"expected", 3}}}};
  HealthAnswer h = health_answer(&sched, false);
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, (Json{{"status", "ok"}, {"workers", whole}}));
  // Prefill workers are listed beside the others, one down is degraded.
  auto set_prefill = [&](int live, int expected) {
    std::lock_guard<std::mutex> l(dep->mu);
    dep->d.prefill = {live, expected, 0, 0};
  };
  set_prefill(2, 2);
  h = health_answer(&sched, false);
  EXPECT_EQ(h.body["status"], "ok");
  EXPECT_EQ(h.body["workers"]["prefill"], (Json{{"live", 2}, {"expected", 2}}));
  set_prefill(1, 2);
  h = health_answer(&sched, false);
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body["status"], "degraded");
  set_prefill(0, 0);
  EXPECT_FALSE(health_answer(&sched, false).body["workers"].contains("prefill"));
  set(2, 2, false);
  h = health_answer(&sched, false);
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body["status"], "degraded");
  EXPECT_EQ(h.body["workers"]["expert"], (Json{{"live", 2}, {"expected", 3}}));
  set(1, 3, false);
  EXPECT_EQ(health_answer(&sched, false).body["status"], "degraded");
  set(2, 2, true);
  h = health_answer(&sched, false);
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body["status"], "recovering");
  EXPECT_EQ(health_answer(&sched, true).body["status"], "draining");
  {
    std::lock_guard<std::mutex> l(dep->mu);
    dep->stopped = unavailable("expert worker 1 (pid 7) was killed by signal 9");
    dep->d.attention.live = dep->d.expert.live = 0;
    dep->d.stopped = true;
  }
  // The scheduler finds the stop at its next look (idle: the stats refresh).
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (sched.health().healthy && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  h = health_answer(&sched, false);
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body["status"], "failed");
  EXPECT_EQ(h.body["error"], "expert worker 1 (pid 7) was killed by signal 9");
  EXPECT_EQ(h.body["workers"]["attention"], (Json{{"live", 0}, {"expected", 2}}));
  sched.stop();
}

}  // namespace
}  // namespace msinfer::server
