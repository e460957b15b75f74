// Planning msinfer's own CPU deployments (docs/PLANNER.md section 8): how many
// attention and expert worker processes, each with how many compute threads,
// m micro-batches and b_a requests per micro-batch, on one machine of `cores`
// cores, from a profile measured on it (`msinfer profile` + `msinfer bench m2n
// --profile-into`). The objective is decode tokens/s of the machine under the
// TBT SLO (the machine is the unit of cost: every plan uses the same cores).
// `bench serve --offline --plan` runs the document `cpu_plan_document` writes.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/model_config.h"
#include "msinfer/core/status.h"
#include "msinfer/planner/catalog.h"
#include "msinfer/planner/plan.h"

namespace msinfer::planner {

// A profile file as the CPU planner reads it. Times in seconds, measured with
// `threads` compute threads in one process at context `seq_len`.
struct CpuProfile {
  double k1 = 0, k2 = 0, k3 = 0, k4 = 0;
  // The step's tail outside the layers (final norm, LM head, greedy pick) over
  // the b requests of one attention worker: head_per_token * b + head.
  double head_per_token = 0, head = 0;
  bool has_head = false;  // profiles written before the head term lack it
  std::vector<std::pair<double, double>> attention_points, expert_points, head_points;
  // An expert's FFN in a micro-batch after the first (the layer's experts ran
  // just before; section 8); empty in profiles before it.
  std::vector<std::pair<double, double>> expert_next_points;
  // The attention stage of a micro-batch after the first (the layer's stage
  // ran just before on other requests); empty in profiles before it.
  std::vector<std::pair<double, double>> attention_next_points;
  int threads = 1;
  int cores = 0;            // of the machine profiled (0: not recorded)
  double memory_bytes = 0;  // physical memory of the machine profiled (0: not recorded)
  double seq_len = 0;
  // CPU time the profile got / (wall time x threads): below 1 when other
  // processes shared the cores while it measured (section 8, shared cores).
  double cpu_share = 1;
  // Cores a group of group_threads busy threads got (measure_group_cores;
  // 0: not measured, profiles before it): G(r) of predict_cpu.
  int group_threads = 0;
  double group_cores = 0;
  std::string weights = "bf16";
  std::optional<UtilCurve> nic_util;    // bench m2n --profile-into
  std::optional<double> nic_bandwidth;  // bytes/s
  std::string source;
};
StatusOr<CpuProfile> parse_cpu_profile(const Json& j, const std::string& source);

// A line through the measured points where a plan runs: the two measured
// batches bracketing `b` (the nearest two outside the measured range). Falls
// back to `global` with fewer than two points.
LinearFit local_fit(const std::vector<std::pair<double, double>>& points, double b,
                    LinearFit global);

struct CpuSearchOptions {
  ModelConfig model;
  CpuProfile profile;
  int cores = 0;              // compute threads of all workers together may not exceed this
                              // unless every worker has one thread (then the cores are shared)
  double memory_bytes = 0;    // weights + KV budgets of all workers must fit
  double slo = 0.150;         // seconds
  Workload workload;          // the requests: input and output lengths
  int max_micro_batches = 4;  // the runtime runs up to 16
  int64_t max_batch = 256;    // global batch cap (requests in flight)
  int64_t kv_cache_mb = 256;  // KV budget of one attention worker (the runtime's --kv-cache-mb)
  bool local_fit = true;      // refit k's from the profile's points where the plan runs
  // Fixed parts of the shape (0: searched).
  int attention_workers = 0, expert_workers = 0, micro_batches = 0, tp_expert = 0;
  int attention_threads = 0, expert_threads = 0;
  int64_t batch_per_micro_batch = 0;
};

struct CpuDeployment {
  int attention_workers = 1, expert_workers = 1, micro_batches = 1, tp_expert = 1;
  int attention_threads = 1, expert_threads = 1;
  int64_t batch_per_micro_batch = 1;  // b_a: requests in one micro-batch of one attention worker
  int64_t global_batch() const { return batch_per_micro_batch * micro_batches * attention_workers; }
  int processes() const { return attention_workers + expert_workers * tp_expert; }
  int threads() const {
    return attention_workers * attention_threads + expert_workers * tp_expert * expert_threads;
  }
};

struct CpuPrediction {
  double k1 = 0, k2 = 0, k3 = 0, k4 = 0;             // at the workers' thread counts (s, s/token)
  double t_attention = 0, t_expert = 0, t_comm = 0;  // per layer and micro-batch (s)
  double t_head = 0;                                 // once per step on each attention worker (s)
  // One dense layer of one micro-batch on an attention worker (0: none);
  // t_attention holds the dense layers' share, spread over the MoE layers.
  double t_dense_layer = 0;
  // t_expert of the first micro-batch and of each later one (equal at m = 1
  // or without the profile's next-micro-batch points); t_expert is their mean.
  double t_expert_first = 0, t_expert_next = 0;
  // The same for t_attention (dense layers' share included).
  double t_attention_first = 0, t_attention_next = 0;
  double layers_time = 0;                            // iteration_time over the layers (s)
  double cpu_seconds = 0;                            // CPU time all workers compute per step
  double cpu_bound = 0;        // cpu_seconds / cores: the step cannot be shorter
  double tbt = 0;              // time between tokens (s)
  double throughput = 0;       // decode tokens/s of the machine
  double rows_per_expert = 0;  // b_e per micro-batch and layer
  double memory_bytes = 0, memory_capacity = 0;
  double kv_bytes_per_worker = 0, kv_budget_bytes = 0;
  bool shares_cores = false;  // more threads than cores
  // The cores the deployment's scheduling group gets (the profile's), and the
  // factor the stage times grow by from the profile's share to each stage's.
  double group_cores = 0;
  double share_factor_attention = 1, share_factor_expert = 1, share_factor_head = 1;
  std::string binds;  // what stops the batch from growing
  Json to_json() const;
};

// The stage model of section 8 for one deployment.
CpuPrediction predict_cpu(const CpuSearchOptions& o, const CpuDeployment& d);
// Whether the deployment fits the cores, the memory, the KV budget and the SLO;
// reasons name the numbers.
std::vector<std::string> check_cpu_deployment(const CpuSearchOptions& o, const CpuDeployment& d,
                                              const CpuPrediction& p);

struct CpuPlan {
  CpuDeployment deployment;
  CpuPrediction predicted;
};
// Best first by tokens/s. INVALID_ARGUMENT when nothing fits.
StatusOr<std::vector<CpuPlan>> search_cpu_plans(const CpuSearchOptions& o);

// {"devices": "cpu", "plan", "predicted", "constraints", "model", "machine",
//  "stage_model", "search", "alternatives"}.
Json cpu_plan_document(const CpuSearchOptions& o, const std::vector<CpuPlan>& plans,
                       size_t alternatives);
bool is_cpu_plan_document(const Json& j);
// Reads a CPU plan document's `plan` back; every field range-checked.
StatusOr<CpuDeployment> cpu_deployment_from_plan_document(const Json& j, const std::string& source,
                                                          const ModelConfig& model);

}  // namespace msinfer::planner
