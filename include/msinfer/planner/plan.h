// Deployment plans and the search of docs/PLANNER.md section 4 (Algorithm 1 of the
// MegaScale-Infer paper): for each (attention GPU, expert GPU) pair, tp_e, tp_a,
// n_a near balance and m <= max, the largest global batch B that meets the SLO
// and the memory constraint; plans are ranked by throughput per cost, per GPU
// or per watt. Also the co-located baselines the plan is compared with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/planner/catalog.h"
#include "msinfer/core/model_config.h"
#include "msinfer/planner/perf_model.h"

namespace msinfer::planner {

enum class Objective { kCost, kGpu, kPower };
StatusOr<Objective> parse_objective(const std::string& s);
const char* objective_name(Objective o);

// One disaggregated deployment: what the simulator and the runtime need.
// The E routed experts are spread evenly over n_e = E / shape.experts_per_node
// expert nodes of tp_expert GPUs each (n_e = E: one expert per node).
struct Deployment {
  ModelConfig model;
  DeploymentShape shape;
  int attention_nodes = 1;  // n_a
  int micro_batches = 1;    // m
  int64_t batch_per_micro_batch = 1;  // b_a: requests in one micro-batch of one attention node
  StageModel stage;
  double seq_len = 0;
  double max_context = 0;  // longest context a request reaches (0: seq_len)

  int64_t global_batch() const { return batch_per_micro_batch * micro_batches * attention_nodes; }
  double tokens_per_expert() const;  // b_e = b_a n_a K / E
  // Rows one expert node gets per micro-batch and layer: b_a n_a K / n_e (the
  // top-K rows landing on any of its experts, balanced load).
  double rows_per_expert_node() const;
  int experts_per_node() const { return shape.experts_per_node > 0 ? shape.experts_per_node : 1; }
  int expert_nodes() const { return model.experts / experts_per_node(); }  // n_e
  int attention_gpus() const { return attention_nodes * shape.tp_attention; }
  int expert_gpus() const { return expert_nodes() * shape.tp_expert; }
  int gpus() const { return attention_gpus() + expert_gpus(); }
  double cost() const;     // sum of normalised GPU prices
  double power_w() const;  // sum of TDPs
  StageTimes stage_times() const;
};

// What the closed forms predict for a deployment.
struct Prediction {
  double t_attention = 0, t_expert = 0, t_comm = 0;  // per layer, per micro-batch (s)
  double iteration = 0;         // time between tokens (s)
  double spec_iteration = 0;    // the closed-form T_total (docs/PLANNER.md 3b) (equal under full overlap)
  double throughput = 0;        // tokens/s of the whole deployment
  double per_gpu = 0, per_cost = 0, per_watt = 0;
  double tokens_per_expert = 0;
  double expert_gemm_utilization = 0;
  bool full_overlap = false;
  int min_micro_batches = 1;
  double attention_memory_bytes = 0, attention_memory_capacity = 0;
  double expert_memory_bytes = 0, expert_memory_capacity = 0;
  double rows_per_expert_node = 0;
  // Expected busiest expert node over the mean under uniform random top-K
  // routing of one micro-batch (normal approximation of the hypergeometric node
  // counts): the straggler a balancer has to remove. Reported, not charged:
  // the plan assumes balanced load (docs/RUNTIME.md, "Routing statistics and balancing").
  double expert_node_imbalance = 1;

  double objective(Objective o) const;
  Json to_json() const;  // the plan document's `predicted` (docs/PLANNER.md section 7), plus details
};
Prediction predict(const Deployment& d);

struct Plan {
  Deployment deployment;
  Prediction predicted;
  double slo = 0;
  int max_gpus = 0;  // 0 = uncapped
  std::string binding;  // which constraint stopped B from growing: "slo", "attention_memory", ...
  double balance_attention_nodes = 0;  // k1 E / (k3 K)

  Json to_json() const;  // {plan, predicted, constraints}
};

// The decode workload: prompt (input) and generated (output) lengths in tokens.
// A request decoding its j-th token reads a context of input + j; averaged over
// the output, and over the requests of a continuously batched micro-batch (each
// at a uniformly random point of its decode), the context is input + output/2.
struct Workload {
  std::string name;       // preset name, "custom" or "seq-len"
  double input_len = 0;   // tokens
  double output_len = 0;  // tokens
  double mean_decode_context() const { return input_len + output_len / 2; }
};
// Named presets: "paper-trace" (MegaScale-Infer's production trace: median input
// 571, median output 159 tokens). NOT_FOUND names the presets.
StatusOr<Workload> workload_preset(const std::string& name);

struct SearchOptions {
  ModelConfig model;
  // The longest context a request reaches (input + output, or seq_len with
  // --seq-len); checked against model.max_position_embeddings. 0: seq_len.
  double max_context = 0;
  std::vector<std::pair<GpuSpec, GpuSpec>> gpu_pairs;  // (attention GPU, expert GPU)
  double slo = 0.150;       // seconds
  double seq_len = 2048;    // mean decode context (Workload::mean_decode_context or --seq-len)
  Workload workload;        // what seq_len came from (reported only)
  int max_micro_batches = 4;
  int max_gpus = 0;         // 0 = uncapped
  Objective objective = Objective::kCost;
  UtilCurve nic_util;
  const Profile* profile = nullptr;
  // Sensitivity analysis multiplies k1 and k3 by these.
  double k1_scale = 1.0, k3_scale = 1.0;
};

// A co-located baseline: every GPU holds attention and experts (no disaggregation).
struct Baseline {
  std::string name;         // "tensor-parallel" or "expert-parallel"
  std::string description;
  std::string gpu;
  int tp = 1;               // tensor-parallel size of one rank
  int ep = 1;               // expert-parallel ranks (1 for tensor-parallel)
  int64_t batch = 0;        // requests per replica
  int gpus = 0;
  double iteration = 0;     // time between tokens (s)
  double throughput = 0, per_gpu = 0, per_cost = 0, per_watt = 0;
  double objective(Objective o) const;
  Json to_json() const;
};

struct SearchResult {
  std::vector<Plan> plans;          // feasible plans, best first (distinct shapes)
  std::vector<Baseline> baselines;  // best of each kind over the candidate GPUs
  int64_t evaluated = 0;            // batch-size evaluations made
};

// The recommendation: the best disaggregated plan, or the best co-located
// bound when it beats every disaggregated plan under the same objective.
struct Verdict {
  bool colocated_wins = false;
  int best_baseline = -1;      // index into SearchResult::baselines; -1: none fits
  double ratio = 0;            // disaggregated best / co-located best objective (0: no baseline)
  std::string recommended;     // "disaggregated" or the baseline's name
  std::string best_colocated;  // the best baseline's name ("" when none fits)
  // {recommended, colocated_wins, disaggregated_over_best_colocated, best_colocated}
  Json to_json() const;
};
Verdict verdict(const SearchResult& r, Objective objective);

// Whether a deployment holds under its constraints: memory (attention node:
// weights + KV at its batch and context; expert node: its experts' weights),
// the TBT SLO (closed form), the model's context length and the plan
// format's batch bound (global batch <= kMaxPlanGlobalBatch). `search_plans`
// only returns deployments that hold; `simulate` checks overrides and sweep
// points with it.
struct Feasibility {
  bool slo = true, attention_memory = true, expert_memory = true, context = true, batch = true;
  std::vector<std::string> reasons;  // one line per violation, naming the numbers
  bool ok() const { return reasons.empty(); }
  std::string violated() const;  // "slo,attention_memory" or ""
  Json to_json() const;
};
Feasibility check_deployment(const Deployment& d, double slo);

StatusOr<SearchResult> search_plans(const SearchOptions& options);

// The stage model every planner path evaluates a shape with: build_stage_model
// under the options' context length, NIC curve and profile, with k1 and k3
// scaled as the options say.
StageModel search_stage_model(const SearchOptions& options, const ModelConfig& model,
                              const DeploymentShape& shape, const FitRange& fit = FitRange{});

// The largest b_a for a fixed deployment shape (n_a, m, GPUs, tp); NOT_FOUND if even
// b_a = 1 breaks the SLO or memory. Without a profile, k1..k4 are then refitted
// over [b/2, 2b] around the batch found (b_a for k1, k2; b_e for k3, k4) and the
// batch searched again, until it moves by less than 1% (at most 4 rounds).
StatusOr<Plan> best_batch(const SearchOptions& options, Deployment d, int64_t* evaluations = nullptr);

// All-reduce of `bytes` per GPU over tp GPUs, hierarchically: reduce-scatter and
// all-gather over NVLink/PCIe inside a node, the 1/g shard all-reduced across
// nodes over every GPU's NIC in parallel (ring; NIC utilisation per message).
double hierarchical_allreduce_time(const GpuSpec& gpu, int tp, double bytes,
                                   const UtilCurve& nic_util);

// The co-located baselines for one GPU type under the same SLO and model: ideal
// bounds (roofline GEMMs, whole-batch collectives, no stragglers) under the same
// efficiency factors, not models of particular serving systems.
std::vector<Baseline> colocated_baselines(const SearchOptions& options, const GpuSpec& gpu);

// Tensor-parallel sizes tried for a GPU: powers of two up to its GPUs per node.
std::vector<int> tp_candidates(const GpuSpec& gpu);

// The whole plan document (docs/PLANNER.md section 7) (plus model, stage model,
// hardware, alternatives, baselines), as written by `msinfer plan --out`.
Json plan_document(const SearchOptions& options, const SearchResult& result, size_t alternatives);
// The plan document's `plan` object of a deployment.
Json deployment_plan_json(const Deployment& d);
// Reads a plan document back into a Deployment (for simulate and serve). Every
// field it uses is range-checked (plan.tp_* 1..kMaxGpusPerNode, attention_nodes
// 1..kMaxPlanAttentionNodes, micro_batches 1..kMaxPlanMicroBatches, global_batch
// 1..kMaxPlanGlobalBatch, model, stage model and GPUs as in their own readers),
// and the derived fields (batch_per_micro_batch, expert_nodes, *_gpus, the GPU
// names, the stage model's bytes per token) must agree with what they derive from.
inline constexpr int64_t kMaxPlanAttentionNodes = 100000;
inline constexpr int64_t kMaxPlanMicroBatches = 64;
inline constexpr int64_t kMaxPlanGlobalBatch = int64_t{1} << 32;
// The largest b_a the search tries and simulate accepts for n_a attention
// nodes and m micro-batches: the global batch stays within kMaxPlanGlobalBatch
// (and b_a within 2^24), so every plan written can be read back.
int64_t max_batch_per_micro_batch(int attention_nodes, int micro_batches);
StatusOr<Deployment> deployment_from_plan_document(const Json& j, const std::string& source);

}  // namespace msinfer::planner

namespace msinfer::planner {

// "A100-80G x9 (tp 1) + A100-80G x8 (tp 1), m=2": the shape of a plan without its batch.
std::string shape_summary(const Deployment& d);

// One perturbation of the sensitivity analysis: a price or k1/k3 scaled by `factor`.
struct SensitivityRow {
  std::string parameter;  // "price:A100-80G", "k1", "k3"
  double factor = 1;
  bool plan_changed = false;
  std::string new_plan;       // shape_summary of the best plan under the perturbation
  double original_loss = 0;   // 1 - objective(original shape) / objective(new best), both perturbed
  bool original_feasible = true;
};

// Re-runs the search with each GPU price and k1, k3 moved by -20% and +20%.
// The chosen shape keeps its GPUs, tp, n_a and m; its batch is re-searched.
StatusOr<std::vector<SensitivityRow>> sensitivity(const SearchOptions& options, const Plan& chosen);
Json sensitivity_to_json(const std::vector<SensitivityRow>& rows);

}  // namespace msinfer::planner
