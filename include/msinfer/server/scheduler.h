// The server's engine loop: one thread owns the generation backend (the
// co-located Engine, or the Router of a disaggregated deployment) and runs
// its continuous batching for requests submitted from any thread. A request
// submitted while others decode joins at the next step. Bounded: at most
// max_num_seqs requests are in the backend, at most max_queue wait for a
// place; submit() refuses beyond that (the HTTP layer answers 429).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/router.h"
#include "msinfer/server/metrics.h"

namespace msinfer::server {

// What the scheduler drives. Called from the engine thread only.
class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  virtual Status add(const runtime::GenerationRequest& r) = 0;
  virtual StatusOr<std::vector<runtime::TokenEvent>> step() = 0;
  virtual Status cancel(int64_t id) = 0;
  virtual bool idle() const = 0;
  virtual int64_t running() const = 0;  // admitted into the batch
  virtual int64_t waiting() const = 0;  // queued inside the backend (e.g. for KV blocks)
  virtual double kv_usage() const = 0;
  // Preemptions and prefix cache lookups and hits so far.
  virtual runtime::EngineCounters counters() const = 0;
  // Why the backend can serve nothing more (a deployment that stopped on a
  // worker's death, seen by any call, add and cancel included); ok while it can.
  virtual Status health() const { return ok_status(); }
  // Live and expected workers of a deployment, their deaths and restarts
  // (runtime::Router::health); nullopt when co-located. Unlike the rest,
  // thread-safe: the HTTP loop reads it for /health and /metrics.
  virtual std::optional<runtime::DeploymentHealth> deployment_health() const {
    return std::nullopt;
  }
  // Every worker's WorkerStats (disaggregated); empty when co-located.
  virtual StatusOr<std::vector<Json>> worker_stats() { return std::vector<Json>{}; }
  // The routing statistics document (runtime::RoutingStats::to_json) of the
  // recent window, from `workers` (what worker_stats() just gave) or the
  // engine's own window; null when the backend keeps none.
  virtual StatusOr<Json> routing(const std::vector<Json>& workers) {
    (void)workers;
    return Json();
  }
};

std::unique_ptr<GenerationBackend> engine_backend(std::unique_ptr<runtime::Engine> e);
// `layers` and `experts` (and the router's current placement) read the expert
// workers' routing windows.
std::unique_ptr<GenerationBackend> router_backend(std::unique_ptr<runtime::Router> r, int layers,
                                                  int experts);

// Gathers the calls of many RequestSinks to hand them to another thread at
// once. Called on the engine thread.
class SinkBatch {
 public:
  virtual ~SinkBatch() = default;
  // The round's calls are all made (every request's tokens of one step, or the
  // failures of every request): hand them over now, one hand-over per round
  // instead of one per request.
  virtual void end_round() = 0;
};

// Receives one request's tokens. Called on the engine thread: implementations
// hand the work to their own thread and return at once.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // The request's tokens of one step, each sequence's in order (n > 1: the
  // sequences' events mixed, each with its index); the request's last
  // round has its last sequence's finished event. The sink may move from them.
  virtual void on_tokens(std::span<runtime::TokenEvent> events) = 0;
  // The request failed (a worker died, the server is stopping); nothing follows.
  virtual void on_error(const Status& s) = 0;
  // Where this sink gathers its calls, if it does: the scheduler calls
  // end_round() on it once the round's calls are made. Null: nothing to do.
  virtual SinkBatch* batch() { return nullptr; }
};

struct SchedulerOptions {
  int64_t max_num_seqs = 256;
  int64_t max_queue = 1024;
  // How often the engine thread refreshes the workers' stats for /metrics.
  std::chrono::milliseconds stats_interval{1000};
  // Once the engine has been idle this long, its freed heap pages go back to
  // the system (malloc_trim). Not at once: back-to-back bursts would each
  // pay the trim on the engine thread and fault the pages back in.
  std::chrono::milliseconds trim_after_idle{2000};
  // Called once, on the engine thread, after the backend failed (a failure it
  // cannot recover from) and every request in flight has been failed with
  // the error: serve's --exit-on-failure stops the server from there. Must
  // not wait for the engine thread.
  std::function<void(const Status&)> on_failure;
};

class Scheduler {
 public:
  Scheduler(std::unique_ptr<GenerationBackend> backend, const SchedulerOptions& o,
            Metrics* metrics);
  ~Scheduler();  // stop(), then destroys the backend (stops its workers)

  // Thread-safe. Queues the request (its id from next_id()).
  // RESOURCE_EXHAUSTED when max_queue requests already wait; UNAVAILABLE when
  // the backend has failed or the scheduler is draining.
  Status submit(runtime::GenerationRequest r, std::shared_ptr<RequestSink> sink);
  // Thread-safe, asynchronous: the request leaves the batch before the next
  // step and frees its KV blocks; its sink hears nothing more. `reason`
  // non-empty: the request ended normally (e.g. "stop" for a stop string) and
  // counts as a success with that reason; empty: it was aborted.
  void cancel(int64_t id, const std::string& reason = "");
  int64_t next_id();

  struct Snapshot {
    // A request counts from the moment submit() accepts it until its seat
    // is free again (the backend's running and waiting, and the requests
    // the backend has not taken yet): running == waiting == 0 means a
    // submit() now finds every seat free.
    int64_t running = 0, waiting = 0;
    runtime::EngineCounters counters;
    double kv_usage = 0;
    // The engine thread's wall time in iterations that stepped the backend
    // (admission, the step, handing its tokens to the sinks, the gauges),
    // and the part of it inside the backend's step(): the difference is
    // the server's own cost on the engine thread.
    double engine_busy_s = 0, engine_step_s = 0;
    int64_t engine_steps = 0;  // the backend's step() calls
    bool healthy = true;
    std::string failure;
    std::vector<Json> workers;
    Json routing;  // GenerationBackend::routing(), refreshed with the workers' stats
  };
  Snapshot snapshot() const;
  // What /health answers from, without the snapshot's copies of the workers'
  // stats: cheap enough for every probe. Thread-safe.
  struct Health {
    bool healthy = true;
    std::string failure;
    std::optional<runtime::DeploymentHealth> workers;  // a deployment's
  };
  Health health() const;
  // Refuses new requests from now on (submit gives UNAVAILABLE).
  void start_draining();
  // Waits until no request is in flight, or `deadline`; true when none is.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  // Fails what is still in flight ("server shutting down"), stops the thread.
  void stop();

 private:
  // A submitted request, until the backend has it.
  struct Entry {
    std::shared_ptr<RequestSink> sink;
    std::chrono::steady_clock::time_point arrival;
    runtime::GenerationRequest req;
  };
  // A request in the backend: what each step reads, one cache line, kept in
  // id order in a vector (a step walks them beside its events, sorted by id:
  // contiguous, where a std::map's nodes, evicted by the step, cost a cache
  // miss each).
  struct Active {
    int64_t id = 0;
    std::shared_ptr<RequestSink> sink;
    SinkBatch* batch = nullptr;  // sink->batch(), asked once
    std::chrono::steady_clock::time_point arrival, last_token;
    int64_t generated = 0;
    int32_t sequences = 1;       // GenerationRequest::n
    int32_t sequences_left = 1;  // of those, not finished
    bool ended = false;          // this step: removed after the walk
  };
  // Into active_, in id order (usually at the end: ids grow with submission).
  void admit(Entry&& e);
  // The running request `id`, or active_.end().
  std::vector<Active>::iterator find_active(int64_t id);
  // The engine thread: each iteration waits for work, applies cancels, adds
  // the admitted requests, steps the backend, hands the tokens out and
  // publishes the gauges.
  void loop();
  using Cancels = std::vector<std::pair<int64_t, std::string>>;  // (id, reason)
  struct LoopState {
    std::chrono::steady_clock::time_point last_stats;
    // The last busy iteration; with `trim_pending`, freed heap pages go back
    // at last_busy + trim_after_idle (nothing to trim before the first request).
    std::chrono::steady_clock::time_point last_busy;
    bool trim_pending = false;
  };
  // Sleeps until there is work; takes the cancels and the requests the batch
  // has seats for. True when the scheduler is stopping.
  bool wait_for_work(const LoopState& st, Cancels* cancels, std::vector<Entry>* admitted);
  // Each returns how many requests it ended. A cancel's backend failure goes
  // to `failed` (the first one).
  int64_t apply_cancels(const Cancels& cancels, std::vector<Entry>* admitted, Status* failed);
  int64_t add_to_backend(std::vector<Entry>&& admitted);
  // A step's events to their requests' sinks (grouped by request), with the
  // step's TTFT / inter-token latencies.
  int64_t deliver_step(std::vector<runtime::TokenEvent>& all,
                       std::chrono::steady_clock::time_point now);
  void trim_when_idle(LoopState* st);
  // The round's calls to a sink; end_round() hands every batch noted over.
  // `batch`: the sink's (a running request's record keeps it; sink.batch()
  // for one not admitted).
  void send_error(RequestSink& sink, SinkBatch* batch, const Status& s);
  void note_batch(SinkBatch* b);
  void end_round();
  // The backend's running count, KV usage and counters, as it has them now
  // (engine thread).
  Snapshot backend_gauges() const;
  // The backend's gauges `s` (running, KV usage, preemptions) and the
  // waiting count into snap_; under mu_.
  void publish_gauges(const Snapshot& s);
  // Returns how many requests it failed. With `in_backend`, each running
  // request is also cancelled in the backend, so that its gauges (running,
  // KV usage) count it no more.
  int64_t fail_all(const Status& s, bool in_backend = false);
  // The backend failed: the server turns unhealthy (/health 503, submit
  // refused) and every request in flight fails with `s`.
  void fail_backend(const Status& s);

  std::unique_ptr<GenerationBackend> backend_;
  SchedulerOptions options_;
  Metrics* metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Entry> inbox_;                // GUARDED_BY(mu_): submitted, not in the backend
  Cancels cancels_;                        // GUARDED_BY(mu_)
  bool stop_ = false, draining_ = false;   // GUARDED_BY(mu_)
  Snapshot snap_;                          // GUARDED_BY(mu_)
  int64_t in_flight_ = 0;                  // GUARDED_BY(mu_): inbox + active
  int64_t next_id_ = 1;                    // GUARDED_BY(mu_)
  std::vector<Active> active_;             // engine thread only, by id
  std::vector<SinkBatch*> round_batches_;  // engine thread only
  // A step's latencies, handed to Metrics at once; engine thread only.
  std::vector<double> step_ttft_, step_itl_;
  // A step's events grouped by request: (request id, index) sorted, and the
  // events in that order when it differs. Engine thread only.
  std::vector<std::pair<int64_t, size_t>> step_order_;
  std::vector<runtime::TokenEvent> step_sorted_;
  std::thread thread_;
};

}  // namespace msinfer::server
