// `msinfer profile`: measures a model's stage times on this machine and fits
// docs/PLANNER.md 3b's linear model, T_a = k1 b_a + k2 (one layer of one
// micro-batch on an attention worker: norms, QKV, attention over b_a requests of
// `seq_len` context, O, router, fused gate, combine) and T_e = k3 b_e + k4 (one
// expert's FFN on b_e tokens). Calls cycle through layers and experts so weights
// stream from memory as they do in serving; the attention stage is timed in a
// walk over the layers that streams each layer's experts between two stages,
// as an expert worker does in a deployment. The result is the file
// `msinfer plan --profile` reads.
#pragma once

#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/gemm.h"

namespace msinfer::bench {

struct ProfileOptions {
  std::string model_dir;
  int64_t seq_len = 512;
  std::vector<int64_t> attention_batches = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> expert_batches = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  std::vector<int64_t> head_batches = {1, 4, 16, 64, 256};
  int64_t kv_cache_mb = 1024;
  double min_seconds = 0.3;  // per point
  kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16;
  // "cpu" or "cuda[:N]" (runtime/device_backend.h): where T_a and T_e run. On
  // a GPU they include the runners' host copies of the hidden states.
  std::string device = "cpu";
};

struct LinearFit {
  double slope = 0, intercept = 0;  // seconds per token, seconds
  double r2 = 0, max_rel_error = 0;
};
// Least squares y = slope x + intercept with both kept >= 0 (when one would be
// negative, the other is fitted alone).
LinearFit fit_line(const std::vector<std::pair<double, double>>& points);

struct ProfileResult {
  // One layer's attention stage for the first micro-batch of a step (the
  // layer's weights went through the caches since they last ran) and for a
  // later one, right after the first on other requests.
  std::vector<std::pair<double, double>> attention;       // (b_a, seconds)
  std::vector<std::pair<double, double>> attention_next;  // (b_a, seconds)
  std::vector<std::pair<double, double>> expert;     // (b_e, seconds)
  // The same FFNs for a micro-batch after the first: a layer's experts run
  // again right after they ran (the caches hold part of their weights).
  std::vector<std::pair<double, double>> expert_next;  // (b_e, seconds)
  // Once per step, outside the layers: final norm, LM head over the step's
  // rows and a greedy pick per row (the attention worker's, over all its
  // micro-batches' requests): T_head = head_per_token * b + head.
  std::vector<std::pair<double, double>> head;  // (requests, seconds)
  LinearFit attention_fit, expert_fit, head_fit;
  // CPU time the process got over the measurements / (wall time x threads):
  // 1 on cores of its own; below 1 when other processes shared them, and the
  // times above are then that much longer than the work (docs/PLANNER.md 8).
  double cpu_share = 1;
  // Cores that `group_threads` busy threads (the machine's cores) got
  // together, measured after the points: what a deployment whose workers
  // compute at once gets from the machine (docs/PLANNER.md 8, shared cores).
  // group_threads on an idle machine.
  int group_threads = 0;
  double group_cores = 0;
  Json to_json(const ProfileOptions& o) const;  // the --profile file format
};

// The cores `threads` busy threads of this process get together over
// `seconds` of wall time: CPU time over wall time, in [0, threads].
double measure_group_cores(int threads, double seconds);

// `progress` receives one line per measured point (may be null).
StatusOr<ProfileResult> profile_model(const ProfileOptions& o,
                                      void (*progress)(const std::string&) = nullptr);

}  // namespace msinfer::bench
