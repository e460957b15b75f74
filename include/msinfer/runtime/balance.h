// Routing statistics and expert placement with replicas (docs/RUNTIME.md, "Routing statistics and balancing").
//
// RoutingStats is the document `msinfer generate --json` and `msinfer bench
// serve --json` print under "routing" and `msinfer balance --stats` reads
// (docs/RUNTIME.md, "Routing statistics and balancing"). balance_placement()
// is the greedy min-max placement `msinfer balance` writes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/runtime/placement.h"
#include "msinfer/runtime/worker_stats.h"   // RoutingWindow

namespace msinfer::runtime {

// Rows routed to each (layer, expert) and, in a disaggregated deployment, rows
// each expert worker computed per layer, over the routing window
// (RoutingWindow: the last ~1024 steps, or since the stats were last reset).
struct RoutingStats {
  int layers = 0, experts = 0;
  int64_t window_steps = 0, steps = 0;
  std::vector<int64_t> expert_tokens;  // [layer * experts + expert]
  int workers = 0;                     // expert workers; 0: co-located engine
  std::vector<int64_t> worker_tokens;  // [layer * workers + worker]
  std::optional<Placement> placement;  // the one in effect (disaggregated)
  // Disaggregated: placements online rebalancing switched to so far
  // (Router::rebalances); -1 when not known (not written then).
  int64_t placement_switches = -1;

  // The co-located engine's window.
  static RoutingStats from_window(const RoutingWindow& w);
  // From every worker's WorkerStats JSON (Router::stats): the expert workers'
  // "routed" windows, summed per expert over the workers holding a replica.
  static StatusOr<RoutingStats> from_workers(const std::vector<Json>& workers,
                                             const Placement& placement, int layers, int experts);
  // The document itself, or any object holding it under "routing" (a whole
  // `generate --json` answer). Errors name `source` and the field.
  static StatusOr<RoutingStats> from_json(const Json& j, const std::string& source);
  Json to_json() const;
  // Rows of each expert summed over layers.
  std::vector<double> expert_totals() const;
};

// Balancedness of one side (experts or expert workers) over a step: the
// busiest member sets the pace of every layer, so
//   sum_l max_j x[l][j] / sum_l mean_j x[l][j]     (x is [layers][n], row-major)
// 1 when balanced, n when one member takes everything; nullopt when x is all 0.
std::optional<double> balancedness(const std::vector<double>& x, int layers, int n);
// The same for one layer.
std::optional<double> layer_balancedness(const std::vector<double>& x, int layer, int n);

// Rows each worker would compute per layer under `p`: expert e's rows split
// over its replicas by share, plus `fixed_per_replica` for every replica the
// worker holds (the cost of running an expert at all, in rows). A layer that
// routed no rows (a DeepSeek dense layer has no routed experts) costs
// nothing, fixed part included. [layers * p.workers]
// Layers of expert_tokens ([layers * experts]) in which some expert got rows.
int layers_with_rows(const std::vector<int64_t>& expert_tokens, int layers, int experts);
std::vector<double> predicted_worker_loads(const std::vector<int64_t>& expert_tokens, int layers,
                                           const Placement& p, double fixed_per_replica = 0);

// How one attention worker splits one micro-batch's rows of each expert over
// its replicas (RemoteExperts::start): experts with one replica are fixed
// load on their worker; then each replicated expert, most rows first (ties:
// the lower index), hands its rows one at a time to the replica whose worker
// has the least predicted load (rows of this micro-batch so far; ties: the
// earlier replica). Returns rows per replica, [E][replicas of e], in the
// placement's replica order; rows of replica j follow those of j - 1.
std::vector<std::vector<int64_t>> split_rows(const Placement& p,
                                             const std::vector<int64_t>& expert_rows);

// Greedy min-max placement of E experts (E = expert_load.size(), load: rows
// over the window, summed over layers) on `workers` workers holding at most
// `slots_per_worker` experts each:
//  1. every expert gets one replica; the spare slots (workers * slots - E) go
//     one by one to the expert with the highest load per replica (ties: the
//     lower index), at most one replica per worker;
//  2. replicas, largest load first (load / replicas of its expert), each go
//     to the least-loaded worker with a free slot that does not hold that
//     expert yet (ties: fewer experts held, then the lower index): greedy
//     longest-processing-time under the slot limit. A replica no worker can
//     take is dropped (its expert's share goes to its other replicas).
// `fixed_cost` (>= 0, the units of the loads) is what running one replica
// costs whatever its rows (streaming the expert's weights: k4 of the stage
// model, as rows k4 / k3, times steps and layers); each replica's load is
// fixed_cost + load / replicas, and with fixed_cost > 0 a spare slot is used
// only while it lowers the predicted max (or a worker would be left empty).
// Shares of a replicated expert are equal. One placement for every layer (the
// runtime places an expert's weights of all layers together).
// INVALID_ARGUMENT: no experts, a negative or non-finite load, workers outside
// 1..Placement::kMaxExpertWorkers, slots < 1, workers * slots < E, or a
// worker left without an expert.
StatusOr<Placement> balance_placement(const std::vector<double>& expert_load, int workers,
                                      int slots_per_worker, double fixed_cost = 0);

}  // namespace msinfer::runtime
