// The server's Prometheus metrics, named as vLLM's so existing dashboards
// and scrapers work (prefix msinfer: instead of vllm:). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "msinfer/core/json.h"

namespace msinfer::server {

// Cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // The Prometheus text lines of `name` (bucket, sum, count), with `labels`
  // ("model_name=\"x\"") on every line.
  std::string render(const std::string& name, const std::string& labels) const;
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative
  int64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  void add_prompt_tokens(int64_t n);
  // One engine step's tokens under one lock: each generated token is a
  // request's first (its time to first token) or a later one (the gap since
  // its previous token); the generation counter grows by their sum.
  void observe_step(std::span<const double> ttft_s, std::span<const double> itl_s);
  void request_finished(const std::string& finished_reason, double e2e_s);  // a success
  void request_aborted();
  void http_response(int status);

  // The gauges the scheduler knows at scrape time.
  struct Gauges {
    int64_t running = 0, waiting = 0, preemptions = 0;
    int64_t prefix_queries = 0, prefix_hits = 0;  // prefix cache, in tokens
    int64_t connections = 0;  // open HTTP connections
    double http_loop_cpu_s = -1;  // the HTTP event loop thread's CPU time; < 0: not shown
    int64_t http_batched_writes = 0;  // socket writes sent through io_uring batches
    int64_t http_batch_submits = 0;   // the io_uring submits (system calls) that sent them
    int64_t http_loop_wakeups = 0;    // rounds for which the engine thread woke the loop
    int64_t http_engine_waits = 0;    // rounds after which the engine thread waited for the loop
    // Scheduler::Snapshot's engine_busy_s, engine_step_s and engine_steps.
    double engine_busy_s = 0, engine_step_s = 0;
    int64_t engine_steps = 0;
    double kv_usage = 0;
    std::vector<Json> workers;  // WorkerStats of a disaggregated deployment
    Json routing;               // runtime::RoutingStats::to_json of the recent window, or null
    // A deployment's workers by role (runtime::Router::health): empty when
    // co-located.
    struct Role {
      std::string role;  // "attention", "expert", "prefill" (with prefill workers)
      int64_t live = 0, expected = 0, deaths = 0, restarts = 0;
    };
    std::vector<Role> roles;
    // Prefill/decode disaggregation (runtime::DeploymentHealth): shown with
    // prefill workers only.
    struct KvTransfers {
      int64_t sequences = 0, bytes = 0, fallbacks = 0;
    };
    std::optional<KvTransfers> kv_transfers;
    // The process_* family of this process (read_process_stats), unless false.
    bool process = true;
  };
  // The whole exposition (text format 0.0.4).
  std::string render(const Gauges& g) const;

 private:
  mutable std::mutex mu_;
  std::string labels_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, aborted_ = 0;  // GUARDED_BY(mu_)
  std::map<std::string, int64_t> success_;                           // GUARDED_BY(mu_)
  std::map<int, int64_t> http_;                                      // GUARDED_BY(mu_)
  Histogram ttft_, itl_, e2e_;                                       // GUARDED_BY(mu_)
};

}  // namespace msinfer::server
