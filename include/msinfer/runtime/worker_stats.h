// What each worker of a disaggregated deployment measures about itself over a
// window (reset by the router), for `msinfer bench serve` and for comparing
// with the planner (docs/PLANNER.md, section 3b):
//  - busy_s: computing; wait_s: waiting on the network (attention: blocked for
//    the experts' answers; expert: nothing to serve while a step runs);
//  - gemm_flops: FLOPs of the worker's GEMMs in the window (attention: QKV, O
//    and router GEMMs of every layer, not the LM head; expert: the SwiGLU
//    FFNs), so gemm_flops / busy_s is the achieved rate;
//  - per (micro-batch slot, layer) means: T_a (attention compute of the
//    micro-batch between its previous answer and its next send), T_e (expert
//    compute of the unit), T_c (dispatch: the last attention worker's send to
//    the expert worker seeing every message, sampled only when that send came
//    while the expert worker was idle, else it would be queueing behind
//    another unit; system clock, so across hosts it includes their offset);
//  - cpu_s: the process's CPU time in the window (all threads), which shows
//    whether an idle deployment really idles.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "msinfer/core/json.h"

namespace msinfer::runtime {

class UnitTimes {
 public:
  UnitTimes() = default;
  UnitTimes(int slots, int layers) : layers_(layers), sum_(slots * layers, 0.0), n_(slots * layers, 0) {}
  void add(int slot, int layer, double seconds) {
    sum_[slot * layers_ + layer] += seconds;
    ++n_[slot * layers_ + layer];
  }
  int64_t count() const;
  double mean() const;                // over every unit
  Json to_json() const;               // [[mean per layer] per slot], seconds; null where none
  void reset();

 private:
  int layers_ = 0;
  std::vector<double> sum_;
  std::vector<int64_t> n_;
};

// Rows routed to each (layer, expert) over a sliding window of the last
// kWindowSteps steps, kept as kBuckets buckets of kWindowSteps / kBuckets
// steps: the oldest bucket is dropped whole, so the window covers the last
// 993..1024 steps once that many ran. begin_step() is called before the
// first rows of every step. Not thread-safe.
class RoutingWindow {
 public:
  static constexpr int kWindowSteps = 1024, kBuckets = 32;
  RoutingWindow() = default;
  RoutingWindow(int layers, int experts);
  void begin_step();
  void add(int layer, int expert, int64_t rows) {
    buckets_[current_][static_cast<size_t>(layer) * experts_ + expert] += rows;
  }
  int layers() const { return layers_; }
  int experts() const { return experts_; }
  int64_t steps() const;                // steps begun within the window
  std::vector<int64_t> counts() const;  // [layer * experts + expert], summed over the window
  // {"window_steps", "steps", "layer_expert_tokens": [[rows per expert] per layer]}
  Json to_json() const;
  void reset();

 private:
  int layers_ = 0, experts_ = 0;
  std::vector<std::vector<int64_t>> buckets_;  // [kBuckets][layers * experts]
  std::vector<int64_t> bucket_steps_;          // [kBuckets]
  int current_ = 0;
};

struct WorkerStats {
  WorkerStats() = default;
  // `experts` > 0 (expert workers): also keep the routing window.
  WorkerStats(int slots, int layers, int experts = 0);
  double busy_s = 0, wait_s = 0, gemm_flops = 0;
  int64_t tokens = 0;  // rows computed (attention: tokens; expert: token-expert pairs)
  // Bytes this process wrote over M2N: dispatch (headers and rows) or answers
  // (rows); and, a shard > 0 of an allreduce expert worker, partial outputs
  // to shard 0 (tp_reduce_bytes_sent, not in the first).
  int64_t m2n_bytes_sent = 0, tp_reduce_bytes_sent = 0;
  // Expert workers: rows each hosted expert computed, summed over layers.
  std::map<int, int64_t> expert_tokens;
  // Expert workers: rows each hosted (layer, expert) computed, sliding window.
  RoutingWindow routed;
  UnitTimes t_a, t_e, t_c;
  double cpu_at_reset = 0;
  std::chrono::steady_clock::time_point reset_at = std::chrono::steady_clock::now();
  double window_s() const;  // wall time since the last reset
  // The figures with window_s and the rates.
  Json to_json() const;
  void reset();
};

}  // namespace msinfer::runtime
