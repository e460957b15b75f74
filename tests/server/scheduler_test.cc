// The engine thread against a fake backend (one token per running request and
// step): requests from many threads share the batch and all finish with the
// right tokens; the queue bound answers RESOURCE_EXHAUSTED; cancel takes a
// request out; a failing backend fails every request and turns unhealthy;
// draining refuses new work and waits for the running ones; a backend that
// stops outside a step (while adding, or idle) turns unhealthy too; sinks that
// gather into one SinkBatch are handed over once per step. Waits are
// on the sinks' events with timeouts (one poll of the snapshot, with a
// deadline, where no event exists).
#include "msinfer/server/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace msinfer::server {
namespace {

using namespace std::chrono_literals;

// Each step: one token (the request's count so far) per running request.
// With fail_when_running > 0, the first step that finds that many running
// requests fails, as a dead worker does. Request `lose_id` (when > 0) ends
// after two tokens with an error event, as a dead attention worker's do.
// Once stopped_ is set the backend has stopped, as a router that found an
// expert worker dead: add fails and health() says why, while step goes on as
// if nothing happened (so only those two tell). Adding request stop_at_add_
// stops it, as a router that finds the death while adding.
class FakeBackend final : public GenerationBackend {
 public:
  explicit FakeBackend(size_t fail_when_running = 0, int64_t lose_id = 0)
      : fail_when_(fail_when_running), lose_id_(lose_id) {}
  Status add(const runtime::GenerationRequest& r) override {
    if (r.id == stop_at_add_) stopped_ = true;
    MSI_RETURN_IF_ERROR(health());
    if (running_.count(r.id) || multi_.count(r.id)) return invalid_argument("duplicate id");
    if (r.n > 1) {
      multi_[r.id] = {r.sampling.max_tokens, std::vector<int64_t>(static_cast<size_t>(r.n), 0)};
      return ok_status();
    }
    running_[r.id] = {r.sampling.max_tokens, 0};
    return ok_status();
  }
  StatusOr<std::vector<runtime::TokenEvent>> step() override {
    while (held_) {
      in_held_step_ = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (fail_when_ > 0 && running_.size() >= fail_when_) {
      return Status(StatusCode::kUnavailable, "expert worker 1 was killed by signal 9");
    }
    std::vector<runtime::TokenEvent> out;
    ++steps_;
    if (alternate_) {
      // Tokens of requests nobody submitted (cancelled meanwhile), before
      // and after every real id.
      for (int64_t stray : {int64_t{-5}, int64_t{1} << 40}) {
        runtime::TokenEvent ev;
        ev.request_id = stray;
        ev.token = 7;
        out.push_back(ev);
      }
    }
    for (auto it = multi_.begin(); it != multi_.end();) {
      auto& [max, produced] = it->second;
      bool left = false;
      for (size_t i = 0; i < produced.size(); ++i) {
        const int64_t end = max - static_cast<int64_t>(i);
        if (produced[i] >= end) continue;
        runtime::TokenEvent ev;
        ev.request_id = it->first;
        ev.index = static_cast<int32_t>(i);
        ev.token = static_cast<int32_t>(produced[i]++);
        ev.finished = produced[i] == end;
        if (ev.finished) ev.finish_reason = runtime::FinishReason::kLength;
        left = left || !ev.finished;
        out.push_back(ev);
      }
      it = left ? std::next(it) : multi_.erase(it);
    }
    for (auto it = running_.begin(); it != running_.end();) {
      if (alternate_ && (it->first + steps_) % 2 != 0) {
        ++it;  // its micro-batch answers next step
        continue;
      }
      runtime::TokenEvent ev;
      ev.request_id = it->first;
      ev.token = static_cast<int32_t>(it->second.second++);
      ev.finished = it->second.second == it->second.first;
      if (ev.finished) ev.finish_reason = runtime::FinishReason::kLength;
      if (it->first == lose_id_ && it->second.second == 3) {
        ev.token = -1;
        ev.finished = true;
        ev.finish_reason = runtime::FinishReason::kError;
        ev.error = "request " + std::to_string(lose_id_) + " was lost: attention worker 1 died";
      }
      out.push_back(ev);
      it = ev.finished ? running_.erase(it) : std::next(it);
    }
    if (scatter_) {
      // Two tokens per request, its pair split apart and the requests in
      // descending id order, as several workers' answers may interleave.
      std::vector<runtime::TokenEvent> second;
      for (auto& ev : out) {
        if (ev.finished || ev.token < 0) continue;
        auto& r = running_.at(ev.request_id);
        runtime::TokenEvent next;
        next.request_id = ev.request_id;
        next.token = static_cast<int32_t>(r.second++);
        next.finished = r.second == r.first;
        if (next.finished) {
          next.finish_reason = runtime::FinishReason::kLength;
          running_.erase(ev.request_id);
        }
        second.push_back(next);
      }
      std::reverse(out.begin(), out.end());
      std::reverse(second.begin(), second.end());
      out.insert(out.end(), second.begin(), second.end());
    }
    max_batch_ = std::max<int64_t>(max_batch_, static_cast<int64_t>(out.size()));
    return out;
  }
  Status cancel(int64_t id) override {
    running_.erase(id);
    multi_.erase(id);
    return ok_status();
  }
  bool idle() const override { return running_.empty() && multi_.empty(); }
  int64_t running() const override { return static_cast<int64_t>(running_.size() + multi_.size()); }
  int64_t waiting() const override { return 0; }
  double kv_usage() const override { return running_.empty() ? 0.0 : 0.5; }
  runtime::EngineCounters counters() const override { return {}; }
  Status health() const override {
    if (!stopped_) return ok_status();
    return Status(StatusCode::kUnavailable, "expert worker 1 (pid 42) was killed by signal 9");
  }

  std::atomic<int64_t> max_batch_{0};
  std::atomic<bool> held_{false};  // step() waits while set
  std::atomic<bool> in_held_step_{false};  // a step() has waited for held_
  std::atomic<bool> stopped_{false};
  bool scatter_ = false;  // set before the scheduler starts
  // Set before the scheduler starts: each step answers half the requests
  // (odd and even ids in turn, as micro-batches do) and adds two tokens of
  // requests that are not running.
  bool alternate_ = false;
  int64_t steps_ = 0;
  std::atomic<int64_t> stop_at_add_{0};

 private:
  std::map<int64_t, std::pair<int64_t, int64_t>> running_;  // id -> (max, produced)
  // id -> (max, produced per sequence) of a request with n > 1: sequence i
  // ends after max - i tokens, each at a step of its own.
  std::map<int64_t, std::pair<int64_t, std::vector<int64_t>>> multi_;
  size_t fail_when_;
  int64_t lose_id_;
};

// Collects one request's tokens; wait() blocks until it ended or `limit`.
class Collect final : public RequestSink {
 public:
  void on_tokens(std::span<runtime::TokenEvent> events) override {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& e : events) {
      tokens_.push_back(e.token);
      if (e.finished) done_ = true;
    }
    cv_.notify_all();
  }
  void on_error(const Status& s) override {
    std::lock_guard<std::mutex> l(mu_);
    error_ = s.message();
    done_ = true;
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return done_; });
  }
  bool wait_tokens(size_t n, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return tokens_.size() >= n || done_; });
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> l(mu_);
    return tokens_;
  }
  std::string error() {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::string error_;
  bool done_ = false;
};

runtime::GenerationRequest request(int64_t id, int max_tokens) {
  runtime::GenerationRequest r;
  r.id = id;
  r.prompt = {1, 2, 3};
  r.sampling.max_tokens = max_tokens;
  return r;
}

// A request with n sequences ends with its last sequence, not its first:
// sequences 2, 1, 0 end at steps 3, 4, 5 and every token reaches the sink;
// the request counts once, as a success.
TEST(SchedulerTest, ARequestWithNSequencesEndsWithItsLast) {
  Metrics metrics("m");
  Scheduler sched(std::make_unique<FakeBackend>(), SchedulerOptions{}, &metrics);
  struct Sequences final : RequestSink {
    void on_tokens(std::span<runtime::TokenEvent> events) override {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& e : events) {
        tokens[e.index].push_back(e.token);
        if (e.finished) ++finished;
      }
      cv.notify_all();
    }
    void on_error(const Status&) override {}
    std::mutex mu;
    std::condition_variable cv;
    std::map<int32_t, std::vector<int32_t>> tokens;
    int finished = 0;
  };
  auto sink = std::make_shared<Sequences>();
  runtime::GenerationRequest r = request(sched.next_id(), 5);
  r.n = 3;
  ASSERT_TRUE(sched.submit(r, sink).ok());
  {
    std::unique_lock<std::mutex> l(sink->mu);
    ASSERT_TRUE(sink->cv.wait_for(l, 30s, [&] { return sink->finished == 3; }));
    ASSERT_EQ(sink->tokens.size(), 3u);
    for (int32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(sink->tokens[i].size(), static_cast<size_t>(5 - i)) << "sequence " << i;
    }
  }
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  EXPECT_EQ(sched.snapshot().running, 0);
  const std::string text = metrics.render({});
  EXPECT_NE(
      text.find("msinfer:request_success_total{model_name=\"m\",finished_reason=\"length\"} 1"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("msinfer:generation_tokens_total{model_name=\"m\"} 12"), std::string::npos)
      << text;
}

TEST(SchedulerTest, ManyClientsShareTheBatch) {
  Metrics metrics("m");
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  SchedulerOptions o;
  o.max_num_seqs = 16;
  Scheduler sched(std::move(backend), o, &metrics);
  std::vector<std::shared_ptr<Collect>> sinks(64);
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = t; i < 64; i += 4) {
        sinks[i] = std::make_shared<Collect>();
        ASSERT_TRUE(sched.submit(request(sched.next_id(), 5 + i % 7), sinks[i]).ok());
      }
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(sinks[i]->wait(30s)) << i;
    const auto toks = sinks[i]->tokens();
    ASSERT_EQ(toks.size(), static_cast<size_t>(5 + i % 7)) << i;
    for (size_t k = 0; k < toks.size(); ++k) EXPECT_EQ(toks[k], static_cast<int32_t>(k));
  }
  EXPECT_GT(fake->max_batch_.load(), 1);   // shared steps
  EXPECT_LE(fake->max_batch_.load(), 16);  // never more than max_num_seqs
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  // The engine thread's time: steps inside the iterations that made them.
  const auto snap = sched.snapshot();
  EXPECT_GT(snap.engine_step_s, 0);
  EXPECT_GE(snap.engine_busy_s, snap.engine_step_s);
  // At most 16 of the 64 requests (5..11 tokens each) in a step: at least
  // total / 16 steps, and no more steps than tokens.
  int64_t total = 0;
  for (int i = 0; i < 64; ++i) total += 5 + i % 7;
  EXPECT_GE(snap.engine_steps, total / 16);
  EXPECT_LE(snap.engine_steps, total);
  const std::string text = metrics.render({});
  EXPECT_NE(
      text.find("msinfer:request_success_total{model_name=\"m\",finished_reason=\"length\"} 64"),
      std::string::npos);
}

// A scheduler with 8 seats over a FakeBackend that `setup` configures.
std::unique_ptr<Scheduler> eight_seats(Metrics* metrics,
                                       const std::function<void(FakeBackend&)>& setup) {
  auto backend = std::make_unique<FakeBackend>();
  setup(*backend);
  SchedulerOptions o;
  o.max_num_seqs = 8;
  return std::make_unique<Scheduler>(std::move(backend), o, metrics);
}

// A step's events out of request order, a request's two tokens apart: each
// sink still gets its tokens in order, both of a step in one call.
TEST(SchedulerTest, AStepsEventsReachEachSinkGroupedAndInOrder) {
  Metrics metrics("m");
  auto sched_ptr = eight_seats(&metrics, [](FakeBackend& b) { b.scatter_ = true; });
  Scheduler& sched = *sched_ptr;
  struct Calls final : RequestSink {
    void on_tokens(std::span<runtime::TokenEvent> events) override {
      std::lock_guard<std::mutex> l(mu);
      sizes.push_back(events.size());
      for (const auto& e : events) tokens.push_back(e.token);
      done = done || events.back().finished;
    }
    void on_error(const Status&) override {}
    std::mutex mu;
    std::vector<size_t> sizes;
    std::vector<int32_t> tokens;
    bool done = false;
  };
  std::vector<std::shared_ptr<Calls>> sinks;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(std::make_shared<Calls>());
    ASSERT_TRUE(sched.submit(request(sched.next_id(), 6 + (i % 2)), sinks.back()).ok());
  }
  ASSERT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 30s));
  for (int i = 0; i < 8; ++i) {
    std::lock_guard<std::mutex> l(sinks[i]->mu);
    const size_t n = 6 + (i % 2);
    ASSERT_EQ(sinks[i]->tokens.size(), n) << i;
    for (size_t k = 0; k < n; ++k) EXPECT_EQ(sinks[i]->tokens[k], static_cast<int32_t>(k)) << i;
    EXPECT_TRUE(sinks[i]->done);
    // Two tokens a step (the last step of an odd count: one).
    for (size_t c = 0; c < sinks[i]->sizes.size(); ++c) {
      EXPECT_EQ(sinks[i]->sizes[c], c + 1 < sinks[i]->sizes.size() || n % 2 == 0 ? 2u : 1u) << i;
    }
  }
  const std::string text = metrics.render({});
  EXPECT_NE(text.find("msinfer:generation_tokens_total{model_name=\"m\"} 52\n"), std::string::npos);
}

// Eight requests of 3..10 tokens, submitted in `order`, on a backend whose
// steps answer every other request and name requests the scheduler does not
// know: each sink gets every token of its own, in order.
void expect_each_sink_gets_its_tokens(Metrics* metrics, const std::vector<int>& order) {
  auto sched_ptr = eight_seats(metrics, [](FakeBackend& b) { b.alternate_ = true; });
  Scheduler& sched = *sched_ptr;
  std::vector<int64_t> ids;
  std::vector<std::shared_ptr<Collect>> sinks;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(sched.next_id());
    sinks.push_back(std::make_shared<Collect>());
  }
  for (int i : order) ASSERT_TRUE(sched.submit(request(ids[i], 3 + i), sinks[i]).ok());
  ASSERT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 30s));
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(sinks[i]->wait(1s)) << i;
    EXPECT_EQ(sinks[i]->error(), "") << i;
    std::vector<int32_t> want(static_cast<size_t>(3 + i));
    for (size_t k = 0; k < want.size(); ++k) want[k] = static_cast<int32_t>(k);
    EXPECT_EQ(sinks[i]->tokens(), want) << i;
  }
}

TEST(SchedulerTest, StepsThatAnswerSomeRequestsReachTheRightSinks) {
  Metrics metrics("m");
  expect_each_sink_gets_its_tokens(&metrics, {0, 1, 2, 3, 4, 5, 6, 7});
  // 3 + 4 + ... + 10 generated, the strays not counted.
  const std::string text = metrics.render({});
  EXPECT_NE(text.find("msinfer:generation_tokens_total{model_name=\"m\"} 52\n"), std::string::npos);
}

// Requests submitted out of id order (ids are taken before submitting, and
// two clients' submissions can cross): the running requests are kept in id
// order all the same, so each step's tokens reach their own sinks.
TEST(SchedulerTest, RequestsSubmittedOutOfIdOrderGetTheirOwnTokens) {
  Metrics metrics("m");
  expect_each_sink_gets_its_tokens(&metrics, {7, 2, 5, 0, 6, 1, 4, 3});
}

TEST(SchedulerTest, QueueBoundCancelAndDrain) {
  Metrics metrics("m");
  SchedulerOptions o;
  o.max_num_seqs = 1;
  o.max_queue = 1;
  Scheduler sched(std::make_unique<FakeBackend>(), o, &metrics);
  auto a = std::make_shared<Collect>(), b = std::make_shared<Collect>(),
       c = std::make_shared<Collect>();
  const int64_t ida = sched.next_id();
  ASSERT_TRUE(sched.submit(request(ida, 1000000), a).ok());
  ASSERT_TRUE(a->wait_tokens(1, 10s));  // a runs
  const int64_t idb = sched.next_id();
  ASSERT_TRUE(sched.submit(request(idb, 3), b).ok());  // b waits
  EXPECT_EQ(sched.submit(request(sched.next_id(), 3), c).code(), StatusCode::kResourceExhausted);
  sched.cancel(ida);  // a leaves; b runs and finishes
  ASSERT_TRUE(b->wait(10s));
  EXPECT_EQ(b->tokens().size(), 3u);
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  sched.start_draining();
  EXPECT_EQ(sched.submit(request(sched.next_id(), 3), c).code(), StatusCode::kUnavailable);
  EXPECT_EQ(sched.snapshot().running, 0);
}

// ...and says so once (on_failure, serve's --exit-on-failure), with the
// gauges set to what is true after the aborts: nothing running, no KV in use
// (they read 5 and 0.5 before: the backend still held the failed requests).
TEST(SchedulerTest, BackendFailureFailsEveryRequest) {
  Metrics metrics("m");
  std::mutex mu;
  std::vector<std::string> failures;  // GUARDED_BY(mu)
  SchedulerOptions o;
  o.on_failure = [&](const Status& s) {
    std::lock_guard<std::mutex> l(mu);
    failures.push_back(s.message());
  };
  Scheduler sched(std::make_unique<FakeBackend>(/*fail_when_running=*/5), o, &metrics);
  std::vector<std::shared_ptr<Collect>> sinks;
  for (int i = 0; i < 5; ++i) {
    sinks.push_back(std::make_shared<Collect>());
    ASSERT_TRUE(sched.submit(request(sched.next_id(), 1000000), sinks.back()).ok());
  }
  for (auto& s : sinks) {
    ASSERT_TRUE(s->wait(10s));
    EXPECT_NE(s->error().find("expert worker 1"), std::string::npos);
  }
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  const Scheduler::Snapshot snap = sched.snapshot();
  EXPECT_FALSE(snap.healthy);
  EXPECT_EQ(snap.running, 0);
  EXPECT_EQ(snap.waiting, 0);
  EXPECT_EQ(snap.kv_usage, 0.0);
  const Scheduler::Health h = sched.health();
  EXPECT_FALSE(h.healthy);
  EXPECT_NE(h.failure.find("expert worker 1"), std::string::npos);
  EXPECT_FALSE(h.workers.has_value());  // not a deployment
  auto late = std::make_shared<Collect>();
  EXPECT_EQ(sched.submit(request(sched.next_id(), 3), late).code(), StatusCode::kUnavailable);
  sched.stop();
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_NE(failures[0].find("expert worker 1"), std::string::npos);
}

// Sinks that gather into one SinkBatch (as the HTTP server's do) get one
// hand-over per step: every call of a step comes before that step's
// end_round(), each request at most once in a round, a round holds the whole
// step (its largest = the backend's largest batch), none is empty, and no call
// is left without its end_round(), a lost request's error included.
class RoundLog final : public SinkBatch {
 public:
  struct Call {
    int64_t id;
    int32_t token;  // -1: on_error
    bool last;
  };
  void add(Call c) {
    std::lock_guard<std::mutex> l(mu_);
    pending_.push_back(c);
  }
  void end_round() override {
    std::lock_guard<std::mutex> l(mu_);
    rounds_.push_back(std::move(pending_));
    pending_.clear();
    for (const Call& c : rounds_.back()) ended_ += c.last ? 1 : 0;
    cv_.notify_all();
  }
  bool wait_ended(int n, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return ended_ >= n; });
  }
  std::vector<std::vector<Call>> rounds() {
    std::lock_guard<std::mutex> l(mu_);
    return rounds_;
  }
  size_t pending() {
    std::lock_guard<std::mutex> l(mu_);
    return pending_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> pending_;
  std::vector<std::vector<Call>> rounds_;
  int ended_ = 0;
};

class Gathered final : public RequestSink {
 public:
  Gathered(RoundLog& log, int64_t id) : log_(log), id_(id) {}
  void on_tokens(std::span<runtime::TokenEvent> events) override {
    for (const auto& e : events) log_.add({id_, e.token, e.finished});
  }
  void on_error(const Status&) override { log_.add({id_, -1, true}); }
  SinkBatch* batch() override { return &log_; }

 private:
  RoundLog& log_;
  int64_t id_;
};

TEST(SchedulerTest, SinksOfOneBatchAreHandedOverOncePerStep) {
  Metrics metrics("m");
  RoundLog log;
  auto backend = std::make_unique<FakeBackend>(0, /*lose_id=*/3);
  FakeBackend* fake = backend.get();
  Scheduler sched(std::move(backend), SchedulerOptions{}, &metrics);
  constexpr int kRequests = 8;
  // Steps wait until every request is in: on a busy machine the engine
  // thread finished each request before the next was submitted, and no step
  // had two.
  fake->held_ = true;
  for (int i = 0; i < kRequests; ++i) {
    const int64_t id = sched.next_id();
    ASSERT_TRUE(sched.submit(request(id, 6 + i), std::make_shared<Gathered>(log, id)).ok());
  }
  fake->held_ = false;
  ASSERT_TRUE(log.wait_ended(kRequests, 10s));
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  EXPECT_EQ(log.pending(), 0u);
  std::map<int64_t, std::vector<int32_t>> tokens;
  size_t largest = 0;
  for (const auto& round : log.rounds()) {
    EXPECT_FALSE(round.empty());
    largest = std::max(largest, round.size());
    std::set<int64_t> seen;
    for (const auto& c : round) {
      EXPECT_TRUE(seen.insert(c.id).second) << "request " << c.id << " twice in a round";
      tokens[c.id].push_back(c.token);
    }
  }
  EXPECT_EQ(largest, static_cast<size_t>(fake->max_batch_.load()));
  EXPECT_GT(largest, 1u);
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kRequests));
  for (const auto& [id, t] : tokens) {
    if (id == 3) {
      EXPECT_EQ(t, (std::vector<int32_t>{0, 1, -1}));  // two tokens, then the error
      continue;
    }
    ASSERT_EQ(t.size(), static_cast<size_t>(6 + (id - 1))) << id;
    for (size_t k = 0; k < t.size(); ++k) EXPECT_EQ(t[k], static_cast<int32_t>(k)) << id;
  }
}

// A client that sends its next request as soon as its answer is handed over
// (an HTTP client reading its response) finds the seat that answer freed, and
// the running gauge no longer counts it:
// with one seat and no queue, none of a chain of requests, each submitted
// from the hand-over of the one before, is refused. (The seat was given back
// after the hand-over, and a fast client got 429 for a free server.)
class Chain final : public SinkBatch {
 public:
  Chain(Scheduler& sched, int length) : sched_(sched), left_(length) {}
  void start() {
    std::lock_guard<std::mutex> l(mu_);
    submit_next();
  }
  void end_round() override {
    std::lock_guard<std::mutex> l(mu_);
    if (!answered_) return;
    answered_ = false;
    // The gauges do not count the answered request either.
    const int64_t running = sched_.snapshot().running;
    if (running != 0) stale_gauges_.push_back(running);
    submit_next();
  }
  void answered() {
    std::lock_guard<std::mutex> l(mu_);
    answered_ = true;
  }
  bool wait_done(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return done_; });
  }
  std::vector<std::string> refusals() {
    std::lock_guard<std::mutex> l(mu_);
    return refusals_;
  }
  std::vector<int64_t> stale_gauges() {
    std::lock_guard<std::mutex> l(mu_);
    return stale_gauges_;
  }

 private:
  class Sink final : public RequestSink {
   public:
    explicit Sink(Chain& c) : c_(c) {}
    void on_tokens(std::span<runtime::TokenEvent> events) override {
      if (events.back().finished) c_.answered();
    }
    void on_error(const Status&) override { c_.answered(); }
    SinkBatch* batch() override { return &c_; }

   private:
    Chain& c_;
  };
  void submit_next() {  // under mu_
    if (left_ == 0) {
      done_ = true;
      cv_.notify_all();
      return;
    }
    --left_;
    const Status s = sched_.submit(request(sched_.next_id(), 2), std::make_shared<Sink>(*this));
    if (!s.ok()) {
      refusals_.push_back(s.message());
      submit_next();  // the next one goes on from here
    }
  }
  Scheduler& sched_;
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
  bool answered_ = false;
  bool done_ = false;
  std::vector<std::string> refusals_;
  std::vector<int64_t> stale_gauges_;  // `running` seen at a hand-over, when not 0
};

TEST(SchedulerTest, AnAnswerHandedOverHasFreedItsSeat) {
  Metrics metrics("m");
  SchedulerOptions o;
  o.max_num_seqs = 1;
  o.max_queue = 0;
  Scheduler sched(std::make_unique<FakeBackend>(), o, &metrics);
  Chain chain(sched, 20);
  chain.start();
  ASSERT_TRUE(chain.wait_done(10s));
  EXPECT_TRUE(chain.refusals().empty())
      << chain.refusals().size() << " of 20 refused; the first: " << chain.refusals().front();
  EXPECT_TRUE(chain.stale_gauges().empty())
      << chain.stale_gauges().size() << " of 20 answers went out while still counted running";
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
}

// The gauges count a request from the moment submit() accepts it, not from
// the engine thread's next publish (the end of the iteration that steps it):
// serve's ServeTest.FullQueueGets429AndApiKeyIsEnforced read /metrics as
// drained right after a cancel, while the cancelled request still held the
// only seat, and its next request got 429. The step is held, so the engine
// thread cannot publish in between: no timing decides the outcome.
TEST(SchedulerTest, GaugesCountAnAcceptedRequestUntilItsSeatIsFree) {
  Metrics metrics("m");
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  fake->held_ = true;
  SchedulerOptions o;
  o.max_num_seqs = 1;
  o.max_queue = 0;
  o.stats_interval = std::chrono::hours(1);  // no iteration but the one a submit wakes
  Scheduler sched(std::move(backend), o, &metrics);
  auto drained = [&] {
    const Scheduler::Snapshot s = sched.snapshot();
    return s.running == 0 && s.waiting == 0 && s.kv_usage == 0;
  };
  ASSERT_TRUE(drained());
  auto a = std::make_shared<Collect>(), b = std::make_shared<Collect>();
  const int64_t ida = sched.next_id();
  ASSERT_TRUE(sched.submit(request(ida, 1000000), a).ok());
  Scheduler::Snapshot s = sched.snapshot();
  EXPECT_EQ(s.running + s.waiting, 1);  // the engine thread may not have woken yet
  // The engine thread has taken it and steps it (the step is held).
  const auto step_deadline = std::chrono::steady_clock::now() + 10s;
  while (!fake->in_held_step_ && std::chrono::steady_clock::now() < step_deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(fake->in_held_step_);
  s = sched.snapshot();
  EXPECT_EQ(s.running + s.waiting, 1);
  EXPECT_EQ(sched.submit(request(sched.next_id(), 3), b).code(), StatusCode::kResourceExhausted);
  sched.cancel(ida);
  // Until the engine thread takes the cancel, the request holds its seat,
  // and the gauges say so.
  EXPECT_FALSE(drained());
  fake->held_ = false;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!drained() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(drained());
  // Drained by the gauges: the seat is free.
  auto c = std::make_shared<Collect>();
  ASSERT_TRUE(sched.submit(request(sched.next_id(), 3), c).ok());
  ASSERT_TRUE(c->wait(10s));
  EXPECT_EQ(c->tokens().size(), 3u);
}

// A request the deployment lost (an error event) fails alone: the others
// finish, the server stays healthy and takes new requests.
TEST(SchedulerTest, ALostRequestFailsAloneAndTheServerStaysHealthy) {
  Metrics metrics("m");
  Scheduler sched(std::make_unique<FakeBackend>(0, /*lose_id=*/2), SchedulerOptions{}, &metrics);
  std::vector<std::shared_ptr<Collect>> sinks;
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_shared<Collect>());
    ASSERT_TRUE(sched.submit(request(sched.next_id(), 6), sinks.back()).ok());
  }
  for (auto& s : sinks) ASSERT_TRUE(s->wait(10s));
  EXPECT_EQ(sinks[0]->error(), "");
  EXPECT_EQ(sinks[0]->tokens(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(sinks[1]->tokens(), (std::vector<int32_t>{0, 1}));  // no token -1
  EXPECT_NE(sinks[1]->error().find("attention worker 1"), std::string::npos) << sinks[1]->error();
  EXPECT_EQ(sinks[2]->tokens().size(), 6u);
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  EXPECT_TRUE(sched.snapshot().healthy);
  auto late = std::make_shared<Collect>();
  ASSERT_TRUE(sched.submit(request(sched.next_id(), 3), late).ok());
  ASSERT_TRUE(late->wait(10s));
  EXPECT_EQ(late->tokens().size(), 3u);
  const std::string text = metrics.render(Metrics::Gauges{});
  EXPECT_NE(text.find("msinfer:request_aborted_total{model_name=\"m\"} 1\n"), std::string::npos)
      << text;
}

// The backend stops while adding a request (serve's router found an expert
// worker dead there): that request fails with the cause, so does the one
// running, and the server turns unhealthy at once; nothing hangs.
TEST(SchedulerTest, ABackendThatStopsWhileAddingFailsEveryRequestAndTurnsUnhealthy) {
  Metrics metrics("m");
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  Scheduler sched(std::move(backend), SchedulerOptions{}, &metrics);
  auto a = std::make_shared<Collect>(), b = std::make_shared<Collect>();
  ASSERT_TRUE(sched.submit(request(sched.next_id(), 1000000), a).ok());
  ASSERT_TRUE(a->wait_tokens(1, 10s));
  const int64_t idb = sched.next_id();
  fake->stop_at_add_ = idb;
  ASSERT_TRUE(sched.submit(request(idb, 3), b).ok());
  ASSERT_TRUE(b->wait(10s));
  EXPECT_NE(b->error().find("expert worker 1"), std::string::npos) << b->error();
  ASSERT_TRUE(a->wait(10s));
  EXPECT_NE(a->error().find("expert worker 1"), std::string::npos) << a->error();
  EXPECT_TRUE(sched.wait_idle(std::chrono::steady_clock::now() + 10s));
  const Scheduler::Snapshot snap = sched.snapshot();
  EXPECT_FALSE(snap.healthy);
  EXPECT_NE(snap.failure.find("expert worker 1"), std::string::npos);
  auto late = std::make_shared<Collect>();
  EXPECT_EQ(sched.submit(request(sched.next_id(), 3), late).code(), StatusCode::kUnavailable);
}

// A backend that stops with nothing in flight turns the server unhealthy
// within a stats interval: /health does not wait for the next request.
TEST(SchedulerTest, AnIdleBackendThatStopsTurnsUnhealthy) {
  Metrics metrics("m");
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  SchedulerOptions o;
  o.stats_interval = 20ms;
  Scheduler sched(std::move(backend), o, &metrics);
  EXPECT_TRUE(sched.snapshot().healthy);
  fake->stopped_ = true;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (sched.snapshot().healthy && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_FALSE(sched.snapshot().healthy);
  EXPECT_NE(sched.snapshot().failure.find("expert worker 1"), std::string::npos);
}

}  // namespace
}  // namespace msinfer::server
