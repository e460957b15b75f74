// Discrete-event simulator of one disaggregated deployment (docs/PLANNER.md, section 5):
// n_a attention workers, E expert workers, m micro-batches, L MoE layers, many
// decoding iterations. Jobs: attention compute, M2N transfer, expert compute,
// N2M transfer, timed by the plan's stage model. Every worker's compute and each
// NIC direction (send, receive) is a resource that jobs queue for, first come
// first served. An attention worker starts iteration t+1 for all its
// micro-batches once all of them finished iteration t (continuous batching
// recomposes micro-batches between iterations), so without jitter and with
// balanced load the iteration time equals T_total of docs/PLANNER.md section 3b under full overlap.
// Single-threaded; deterministic for a given seed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/planner/plan.h"

namespace msinfer::planner {

struct SimOptions {
  int iterations = 8;
  double jitter = 0;     // fraction: each duration is scaled by U[1-jitter, 1+jitter]
  double zipf_s = 0;     // per-expert load skew (0 = balanced)
  // An expert placement with replicas (msinfer balance): per expert node, the
  // fraction of all routed rows each expert replica it holds computes (each
  // replica one GEMM: T_e of the node = sum over its replicas of
  // t_expert(rows)). Empty: one expert per node with the zipf_s shares.
  // The fractions sum to 1 over all nodes; the node count must be the
  // model's expert count (the deployment's expert nodes).
  std::vector<std::vector<double>> node_replica_shares;
  uint64_t seed = 1;
  int gantt_iterations = 1;  // iterations whose job intervals are recorded
  int gantt_layers = 1 << 30;  // ... and, within them, layers (0-based) below this
  // Called now and then (every 2^16 jobs) with the fraction of the jobs done,
  // for progress lines; may be empty.
  std::function<void(double)> progress;
};

// A row of the timeline.
enum class Lane { kAttention, kDispatch, kCombine, kExpert };

struct Interval {
  Lane lane;
  int worker;  // attention worker (kAttention, kDispatch) or expert worker (kCombine, kExpert)
  int iteration, micro_batch, layer;
  double start, end;  // seconds
};

struct SimResult {
  double makespan = 0;  // seconds
  int64_t tokens = 0;
  double throughput = 0, per_gpu = 0, per_cost = 0, per_watt = 0;
  double tbt_mean = 0, tbt_p50 = 0, tbt_p99 = 0;
  double attention_busy = 0;  // mean busy fraction of attention workers
  double expert_busy = 0;     // mean busy fraction of expert workers
  double expert_busy_max = 0;
  double attention_nic_busy = 0;  // mean busy fraction of attention send NICs
  double attention_bubble = 0;    // idle time of an attention worker per iteration (s)
  double expert_bubble = 0;
  double t_attention = 0, t_expert = 0, t_comm = 0;  // measured means (s)
  std::vector<double> expert_load_share;  // fraction of routed tokens per expert node
  std::vector<Interval> intervals;

  Json to_json() const;  // the plan document's `predicted` names (docs/PLANNER.md section 7), plus the simulator's own
};

// Load share per expert under Zipf(s) skew, capped at 1/K (a token visits an
// expert at most once) with the excess spread over the others; sums to 1.
std::vector<double> zipf_expert_shares(int experts, int top_k, double s);

StatusOr<SimResult> simulate(const Deployment& d, const SimOptions& options);
// Jobs (compute and transfer) that simulate() would queue: its cost. One
// simulation, and a whole sweep together, may queue at most kMaxSimulationJobs.
double simulation_jobs(const Deployment& d, const SimOptions& options);
inline constexpr double kMaxSimulationJobs = 6e7;

// Timeline of the recorded intervals: one row per attention worker, per link
// direction (dispatch from each attention worker, combine from each expert
// worker) and per expert worker; micro-batches coloured.
Status write_gantt_svg(const Deployment& d, const SimResult& r, const std::string& path);

enum class SweepParameter { kAttentionNodes, kMicroBatches };
struct SweepRow {
  int value = 0;
  Deployment deployment;
  SimResult sim;
  Prediction closed_form;
};
// Parses "attention-nodes=1..16" or "micro-batches=1..4".
Status parse_sweep(const std::string& spec, SweepParameter* p, int* from, int* to);
const char* sweep_parameter_name(SweepParameter p);  // "attention_nodes" | "micro_batches"
// Varies one parameter with b_a held fixed, so the global batch grows with it.
// The total work is checked first (INVALID_ARGUMENT beyond kMaxSimulationJobs);
// `progress`, when given, is called with each value before it is simulated.
StatusOr<std::vector<SweepRow>> sweep(const Deployment& base, SweepParameter p, int from, int to,
                                      const SimOptions& options,
                                      const std::function<void(int)>& progress = {});
Status write_sweep_svg(SweepParameter p, const std::vector<SweepRow>& rows,
                       const std::string& path);

}  // namespace msinfer::planner
