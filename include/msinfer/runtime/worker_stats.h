// What each worker of a disaggregated deployment measures about itself over a
// window (reset by the router), for `msinfer bench serve` and for comparing
// with the planner (SPEC.md sections 3-4):
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

struct WorkerStats {
  WorkerStats() = default;
  WorkerStats(int slots, int layers);
  double busy_s = 0, wait_s = 0, gemm_flops = 0;
  int64_t tokens = 0;  // rows computed (attention: tokens; expert: token-expert pairs)
  // Expert workers: rows each hosted expert computed, summed over layers.
  std::map<int, int64_t> expert_tokens;
  UnitTimes t_a, t_e, t_c;
  double cpu_at_reset = 0;
  std::chrono::steady_clock::time_point reset_at = std::chrono::steady_clock::now();
  double window_s() const;  // wall time since the last reset
  // The figures with window_s and the rates.
  Json to_json() const;
  void reset();
};

}  // namespace msinfer::runtime
