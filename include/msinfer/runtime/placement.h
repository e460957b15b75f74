// Where the experts live in a disaggregated deployment: each expert's
// replicas over the expert workers with their shares of its tokens, the
// workers' tensor-parallel shape, and the JSON form (msinfer balance --out,
// --placement), and where the shared experts run. Implemented in
// src/runtime/placement.cc, which builds alone (the fuzzers read placements).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::runtime {

// How the tp_expert shards of an expert worker combine their row-parallel
// partial outputs (docs/RUNTIME.md, "Expert tensor parallelism"):
//  kAttentionSum: every shard answers the attention workers with its partial
//    output; the attention side adds the tp partials (in shard order) into the
//    results. No collective among the shards; N2M carries tp times the bytes.
//  kAllReduce: shards 1..tp-1 send their partials to shard 0 over M2N (the
//    same transport), which adds them (in shard order) and alone answers.
enum class ExpertReduce { kAttentionSum, kAllReduce };
const char* expert_reduce_name(ExpertReduce r);  // "attention-sum", "allreduce"
StatusOr<ExpertReduce> parse_expert_reduce(const std::string& s, const std::string& where);

// Expert e's replicas: (expert worker, share of e's tokens); shares sum to 1.
// Each expert worker is a tensor-parallel group of tp_expert processes (shards).
struct Placement {
  std::vector<std::vector<std::pair<int, double>>> replicas;  // [E]
  int workers = 0;
  // Optional in the JSON ("tp_expert": 1..kMaxTp, "tp_expert_reduce"); 0 and
  // unset when the file does not say (the flags or the plan decide then).
  int tp_expert = 0;
  std::optional<ExpertReduce> tp_expert_reduce;
  int tp_attention = 0;  // "tp_attention": 1..kMaxTp; 0 when the file does not say
  static constexpr int64_t kMaxTp = 64;

  static Placement round_robin(int experts, int workers);
  // {"expert_workers": N, "experts": [[[worker, share], ...], ...]} or, per
  // expert, a plain worker index. Errors name the file and entry. N is in
  // 1..kMaxExpertWorkers, worker indices in 0..N-1, shares finite and > 0.
  static constexpr int64_t kMaxExpertWorkers = 4096;
  static StatusOr<Placement> from_json(const Json& j, int experts, const std::string& source);
  std::vector<int> experts_on(int worker) const;  // ascending
  // The placement once expert worker `worker` is gone: its replicas are
  // removed, the other replicas of each expert share its tokens in their old
  // proportions, workers above it move down by one. FAILED_PRECONDITION
  // naming the experts that had no other replica.
  StatusOr<Placement> without(int worker) const;
  // The same, but every worker keeps its index and `worker` holds nothing:
  // the placement of a running deployment that lost it (its M2N peers are
  // numbered). Such a placement does not pass validate().
  StatusOr<Placement> emptied(int worker) const;
  // (expert, share) of every replica on `worker`, in expert order.
  std::vector<std::pair<int, double>> shares_on(int worker) const;
  // A replacement for an emptied `worker` takes `shares` (shares_on() of the
  // placement before it was lost) back: each of those experts' other
  // replicas keep their proportions within 1 - share. INVALID_ARGUMENT for an
  // expert or share out of range.
  StatusOr<Placement> with_worker(int worker,
                                  const std::vector<std::pair<int, double>>& shares) const;
  Json to_json() const;
  std::string describe() const;  // "expert worker 0: experts 0, 3 (x0.5); ..."
  Status validate(int experts) const;
};

// Where the shared experts of a MoE layer run (DeepSeek-V2/V3, GLM-4.5;
// docs/RUNTIME.md, "Shared experts"; --shared-experts):
//  kAttention: on the attention worker, on its own micro-batch (no M2N bytes).
//  kExpert: on the expert workers, as an always-selected expert with weight 1:
//    the shared experts of layer l live on expert worker
//    shared_expert_worker(l, N) (all its tp shards, each with 1/tp of the
//    width, like a routed expert), which runs them once on the rows of every
//    attention worker. Dense first layers stay on the attention worker.
enum class SharedExpertsOn { kAttention, kExpert };
const char* shared_experts_name(SharedExpertsOn s);  // "attention", "expert"
StatusOr<SharedExpertsOn> parse_shared_experts(const std::string& s, const std::string& where);
// The expert worker that holds layer l's shared experts under kExpert: l mod
// expert_workers (spreads them over the workers, one layer's on one worker).
inline int shared_expert_worker(int layer, int expert_workers) { return layer % expert_workers; }

}  // namespace msinfer::runtime
