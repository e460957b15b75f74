#include "msinfer/server/scheduler.h"

#include <malloc.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>

namespace msinfer::server {

namespace {

using clock = std::chrono::steady_clock;

double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Scheduler::Scheduler(std::unique_ptr<GenerationBackend> backend, const SchedulerOptions& o,
                     Metrics* metrics)
    : backend_(std::move(backend)), options_(o), metrics_(metrics) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
  backend_.reset();
}

int64_t Scheduler::next_id() {
  std::lock_guard<std::mutex> l(mu_);
  return next_id_++;
}

// The engine thread is notified after the lock is released: notified while
// the caller held it, a sleeping engine thread woke only to block on the
// mutex, one more futex wait and wake on each side (strace of an idle server
// taking a request).
Status Scheduler::submit(runtime::GenerationRequest r, std::shared_ptr<RequestSink> sink) {
  std::unique_lock<std::mutex> l(mu_);
  if (!snap_.healthy) return Status(StatusCode::kUnavailable, snap_.failure);
  if (draining_ || stop_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  const int64_t free_seats = std::max<int64_t>(
      0, options_.max_num_seqs - static_cast<int64_t>(in_flight_ - inbox_.size()));
  const int64_t queued = static_cast<int64_t>(inbox_.size());  // the free seats' first
  if (queued >= options_.max_queue + free_seats) {
    return resource_exhausted("the server is at capacity: every seat is taken (--max-num-seqs " +
                              std::to_string(options_.max_num_seqs) + ") and " +
                              std::to_string(queued - free_seats) + " requests wait (--max-queue " +
                              std::to_string(options_.max_queue) + "); retry later");
  }
  Entry e;
  e.req = std::move(r);
  e.sink = std::move(sink);
  e.arrival = clock::now();
  inbox_.push_back(std::move(e));
  ++in_flight_;
  // Counted waiting from now on, not from the engine thread's next
  // publish_gauges (which counts it where it is then): a client that reads
  // /metrics after its request was accepted must not find the server idle
  // while the request holds its seat. (The engine thread publishes at the
  // end of an iteration, which may be a whole step after it took the
  // request: a request cancelled meanwhile was still seated when /metrics
  // said drained, and the next request got 429.)
  ++snap_.waiting;
  l.unlock();
  cv_.notify_one();
  return ok_status();
}

void Scheduler::cancel(int64_t id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu_);
    cancels_.emplace_back(id, reason);
  }
  cv_.notify_one();
}

Scheduler::Snapshot Scheduler::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  return snap_;
}

Scheduler::Health Scheduler::health() const {
  Health h;
  {
    std::lock_guard<std::mutex> l(mu_);
    h.healthy = snap_.healthy;
    if (!h.healthy) h.failure = snap_.failure;
  }
  h.workers = backend_->deployment_health();  // atomics: no lock of ours
  return h;
}

void Scheduler::start_draining() {
  std::lock_guard<std::mutex> l(mu_);
  draining_ = true;
}

bool Scheduler::wait_idle(clock::time_point deadline) {
  std::unique_lock<std::mutex> l(mu_);
  return idle_cv_.wait_until(l, deadline, [&] { return in_flight_ == 0; });
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::note_batch(SinkBatch* b) {
  if (b == nullptr) return;
  // Usually one batch (the HTTP server's) for every sink: the last one noted.
  if (std::find(round_batches_.rbegin(), round_batches_.rend(), b) == round_batches_.rend()) {
    round_batches_.push_back(b);
  }
}

void Scheduler::send_error(RequestSink& sink, SinkBatch* batch, const Status& s) {
  sink.on_error(s);
  note_batch(batch);
}

void Scheduler::admit(Entry&& e) {
  Active a;
  a.id = e.req.id;
  a.batch = e.sink->batch();
  a.sink = std::move(e.sink);
  a.arrival = e.arrival;
  a.sequences = a.sequences_left = std::max(1, e.req.n);
  const auto at = std::upper_bound(active_.begin(), active_.end(), a.id,
                                   [](int64_t id, const Active& x) { return id < x.id; });
  active_.insert(at, std::move(a));
}

std::vector<Scheduler::Active>::iterator Scheduler::find_active(int64_t id) {
  auto it = std::lower_bound(active_.begin(), active_.end(), id,
                             [](const Active& a, int64_t v) { return a.id < v; });
  return it != active_.end() && it->id == id ? it : active_.end();
}

Scheduler::Snapshot Scheduler::backend_gauges() const {
  Snapshot s;
  s.running = backend_->running();
  s.kv_usage = backend_->kv_usage();
  s.counters = backend_->counters();
  return s;
}

void Scheduler::publish_gauges(const Snapshot& s) {
  snap_.running = s.running;
  snap_.waiting = backend_->waiting() + static_cast<int64_t>(inbox_.size());
  snap_.kv_usage = s.kv_usage;
  snap_.counters = s.counters;
}

void Scheduler::end_round() {
  for (SinkBatch* b : round_batches_) b->end_round();
  round_batches_.clear();
}

int64_t Scheduler::fail_all(const Status& s, bool in_backend) {
  std::deque<Entry> inbox;
  {
    std::lock_guard<std::mutex> l(mu_);
    inbox.swap(inbox_);
  }
  for (auto& e : inbox) send_error(*e.sink, e.sink->batch(), s);
  for (auto& a : active_) {
    // A failed backend may refuse; what it still counts is what it holds.
    if (in_backend) (void)backend_->cancel(a.id);
    send_error(*a.sink, a.batch, s);
  }
  const int64_t n = static_cast<int64_t>(inbox.size() + active_.size());
  for (int64_t i = 0; i < n; ++i) metrics_->request_aborted();
  active_.clear();
  {
    // Seats free before the answers go out, as in loop(); and with the
    // requests gone from the backend, the gauges say so by then too (a
    // client that reads /metrics on its error finds nothing running).
    // Without `in_backend` (stopping) the backend's gauges still count what
    // it holds; the waiting ones counted since submit() are gone either way.
    std::lock_guard<std::mutex> l(mu_);
    in_flight_ -= n;
    publish_gauges(backend_gauges());
  }
  end_round();
  idle_cv_.notify_all();
  return n;
}

void Scheduler::fail_backend(const Status& s) {
  {
    std::lock_guard<std::mutex> l(mu_);
    snap_.healthy = false;
    snap_.failure = s.message();
    snap_.workers.clear();  // their stats are of processes that are gone
  }
  // Its gauges are published as it hands the errors out: nothing running,
  // the KV cache as the backend holds it (a stopped deployment: none).
  const int64_t failed = fail_all(s, /*in_backend=*/true);
  // Once (the scheduler stays unhealthy), for the operator: the clients read
  // the cause in their error bodies, a scraper in /health, the log here.
  std::fprintf(stderr,
               "msinfer: server: serving stopped: %s; new requests are refused (%lld request(s) "
               "in flight failed)\n",
               s.message().c_str(), static_cast<long long>(failed));
  if (options_.on_failure) options_.on_failure(s);
}

bool Scheduler::wait_for_work(const LoopState& st, Cancels* cancels, std::vector<Entry>* admitted) {
  std::unique_lock<std::mutex> l(mu_);
  // Sleep while nothing runs; a disaggregated deployment's workers also
  // rest (the router steps them only with requests in flight).
  auto wait = options_.stats_interval;
  if (st.trim_pending) {
    wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(
                              std::max(st.last_busy + options_.trim_after_idle - clock::now(),
                                       clock::duration::zero())));
  }
  cv_.wait_for(l, wait, [&] {
    return stop_ || !cancels_.empty() || (!inbox_.empty() && snap_.healthy) ||
           (!backend_->idle() && snap_.healthy);
  });
  cancels->swap(cancels_);
  // Admit from the inbox while the batch has seats.
  const int64_t active = static_cast<int64_t>(active_.size());
  while (snap_.healthy && !inbox_.empty() &&
         active + static_cast<int64_t>(admitted->size()) < options_.max_num_seqs) {
    admitted->push_back(std::move(inbox_.front()));
    inbox_.pop_front();
  }
  return stop_;
}

int64_t Scheduler::apply_cancels(const Cancels& cancels, std::vector<Entry>* admitted,
                                 Status* failed) {
  int64_t ended = 0;
  for (const auto& [id, reason] : cancels) {
    auto it = find_active(id);
    if (it == active_.end()) {
      // Still in the admitted list or the inbox: drop it there.
      auto a = std::find_if(admitted->begin(), admitted->end(),
                            [&](const Entry& e) { return e.req.id == id; });
      if (a != admitted->end()) {
        admitted->erase(a);
        metrics_->request_aborted();
        ++ended;
      } else {
        std::lock_guard<std::mutex> l(mu_);
        auto q = std::find_if(inbox_.begin(), inbox_.end(),
                              [&](const Entry& e) { return e.req.id == id; });
        if (q != inbox_.end()) {
          inbox_.erase(q);
          metrics_->request_aborted();
          ++ended;
        }
      }
      continue;
    }
    Status s = backend_->cancel(id);
    if (reason.empty()) {
      metrics_->request_aborted();
    } else {
      metrics_->request_finished(reason, seconds(clock::now() - it->arrival));
    }
    active_.erase(it);
    ++ended;
    if (!s.ok() && failed->ok()) *failed = s;
  }
  return ended;
}

int64_t Scheduler::add_to_backend(std::vector<Entry>&& admitted) {
  int64_t ended = 0;
  for (auto& e : admitted) {
    Status s = backend_->add(e.req);
    if (!s.ok()) {
      send_error(*e.sink, e.sink->batch(), s);
      metrics_->request_aborted();
      ++ended;
      continue;
    }
    metrics_->add_prompt_tokens(static_cast<int64_t>(e.req.prompt.size()));
    admit(std::move(e));
  }
  return ended;
}

int64_t Scheduler::deliver_step(std::vector<runtime::TokenEvent>& all,
                                std::chrono::steady_clock::time_point now) {
  // Each request's events of the step, together and in order (a request may
  // have several: a disaggregated step, a resumed one). Sorted as (id,
  // index) pairs: moving the events themselves through a stable sort took
  // ~3 us a step for 64 (~1% of tiny-mixtral's); they move once, and only
  // when the order changes.
  step_order_.resize(all.size());
  for (size_t i = 0; i < all.size(); ++i) step_order_[i] = {all[i].request_id, i};
  if (!std::is_sorted(step_order_.begin(), step_order_.end())) {
    std::sort(step_order_.begin(), step_order_.end());
    step_sorted_.clear();
    for (const auto& [id, i] : step_order_) step_sorted_.push_back(std::move(all[i]));
    all.swap(step_sorted_);
  }
  // The requests in id order too: one walk through `active_` beside the
  // events. Each sink is a separate object the step has evicted from the
  // cache: their loads are started together first.
  for (const Active& a : active_) __builtin_prefetch(a.sink.get());
  int64_t ended = 0;
  auto next = active_.begin();
  for (size_t begin = 0, end = 0; begin < all.size(); begin = end) {
    const int64_t id = all[begin].request_id;
    end = begin + 1;
    while (end < all.size() && all[end].request_id == id) ++end;
    const std::span<runtime::TokenEvent> evs(all.data() + begin, end - begin);
    while (next != active_.end() && next->id < id) ++next;
    if (next == active_.end() || next->id != id) continue;  // cancelled meanwhile
    Active& a = *next++;
    if (evs.back().finish_reason == runtime::FinishReason::kError) {
      // The deployment lost it (a dead attention worker, not resubmitted):
      // this request fails, the others go on.
      send_error(*a.sink, a.batch, Status(StatusCode::kUnavailable, evs.back().error));
      metrics_->request_aborted();
      a.ended = true;
      ++ended;
      continue;
    }
    // n > 1: each sequence's token of this step is a first token (the
    // request's first step) or follows the request's previous step.
    const bool first_step = a.generated == 0;
    const auto previous = a.last_token;
    bool length = false;
    for (size_t i = 0; i < evs.size(); ++i) {
      if (a.generated == 0 || (first_step && a.sequences > 1)) {
        step_ttft_.push_back(seconds(now - a.arrival));
      } else if (a.sequences > 1) {
        step_itl_.push_back(seconds(now - previous));
      } else {
        step_itl_.push_back(seconds(now - a.last_token));
      }
      ++a.generated;
      a.last_token = now;
      if (evs[i].finished) {
        --a.sequences_left;
        length = evs[i].finish_reason == runtime::FinishReason::kLength;
      }
    }
    // Read before the sink, which may move from the events.
    const bool finished = a.sequences_left <= 0;
    a.sink->on_tokens(evs);
    note_batch(a.batch);
    if (finished) {
      metrics_->request_finished(length ? "length" : "stop", seconds(now - a.arrival));
      a.ended = true;
      ++ended;
    }
  }
  if (ended > 0) std::erase_if(active_, [](const Active& a) { return a.ended; });
  // One lock for the step's tokens, not one per token: with a lock each, the
  // engine thread spent ~1% of its time on them.
  metrics_->observe_step(step_ttft_, step_itl_);
  step_ttft_.clear();
  step_itl_.clear();
  return ended;
}

void Scheduler::trim_when_idle(LoopState* st) {
  // Idle for trim_after_idle: hand freed heap pages back to the system, so a
  // burst of connections does not leave the process larger than before it.
  // (Trimming at once cost the engine thread up to 2 ms a burst, and the
  // next burst faulted the pages back in.)
  if (!backend_->idle() || !active_.empty()) {
    st->last_busy = clock::now();
    st->trim_pending = true;
  } else if (st->trim_pending && clock::now() - st->last_busy >= options_.trim_after_idle) {
    ::malloc_trim(0);
    st->trim_pending = false;
  }
}

void Scheduler::loop() {
  ::pthread_setname_np(::pthread_self(), "msinfer-engine");
  LoopState st;
  st.last_stats = clock::now() - options_.stats_interval;
  st.last_busy = clock::now();
  for (;;) {
    Cancels cancels;
    std::vector<Entry> admitted;
    if (wait_for_work(st, &cancels, &admitted)) {
      for (auto& e : admitted) admit(std::move(e));
      fail_all(Status(StatusCode::kUnavailable, "the server is shutting down"));
      return;
    }
    const auto iteration_start = clock::now();
    double step_s = -1;           // the backend's step() this iteration; < 0: none
    Status failed = ok_status();  // the backend's failure, found by a cancel
    int64_t ended = apply_cancels(cancels, &admitted, &failed);
    ended += add_to_backend(std::move(admitted));
    // A backend that stopped outside a step (the router found an expert
    // worker dead while adding a request, or in the last stats call while
    // idle) fails every request now, and /health says so even with none in
    // flight. An add that failed on it has failed its own request above.
    if (failed.ok()) failed = backend_->health();
    bool healthy;
    {
      std::lock_guard<std::mutex> l(mu_);
      healthy = snap_.healthy;
    }
    if (healthy && !failed.ok()) {
      fail_backend(failed);
      healthy = false;
    }
    if (healthy && !backend_->idle()) {
      const auto step_start = clock::now();
      auto events = backend_->step();
      const auto now = clock::now();  // the step's end: its tokens' time
      step_s = seconds(now - step_start);
      if (!events.ok()) {
        fail_backend(events.status());
      } else {
        ended += deliver_step(*events, now);
      }
    }
    // The gauges, published below (and now and then the workers' stats).
    Snapshot s = backend_gauges();
    // The ended requests' seats are free, and the gauges count them no
    // more, before their answers go out: a client that sends its next
    // request on reading one finds its seat (given back after the
    // hand-over, a fast client got 429 from a server with a free seat), and
    // one that reads /metrics then does not find its request running.
    if (ended > 0) {
      std::lock_guard<std::mutex> l(mu_);
      in_flight_ -= ended;
      publish_gauges(s);
    }
    end_round();  // this iteration's tokens and failures, handed over at once
    const bool refresh = clock::now() - st.last_stats >= options_.stats_interval;
    std::vector<Json> workers;
    Json routing;
    if (refresh && healthy) {
      auto w = backend_->worker_stats();
      if (w.ok()) workers = std::move(w).value();
      auto r = backend_->routing(workers);
      if (r.ok()) routing = std::move(r).value();
      st.last_stats = clock::now();
      // The stats call is where an idle deployment finds a death: one it
      // cannot recover from fails the server now, not a stats interval later
      // (its /health says so from the router's side meanwhile).
      if (Status h = backend_->health(); !h.ok()) {
        fail_backend(h);
        healthy = false;
        workers.clear();
        s = backend_gauges();
      }
    }
    trim_when_idle(&st);
    std::lock_guard<std::mutex> l(mu_);
    if (step_s >= 0) {
      snap_.engine_busy_s += seconds(clock::now() - iteration_start);
      snap_.engine_step_s += step_s;
      ++snap_.engine_steps;
    }
    publish_gauges(s);
    if (refresh && !workers.empty()) snap_.workers = std::move(workers);
    if (refresh && !routing.is_null()) snap_.routing = std::move(routing);
    if (ended > 0 && in_flight_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace msinfer::server
