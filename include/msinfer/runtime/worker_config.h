// A disaggregated deployment's configuration (WorkerConfig): what the
// router runs and what each of its workers is told, and its JSON document.
#pragma once

#include <string>

#include "msinfer/comm/fabric_transport.h"
#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/placement.h"
#include "msinfer/runtime/routing_policy.h"

namespace msinfer::runtime {

// One deployment's configuration: what the router runs and what each of its
// workers is told. It travels to a forked worker as one JSON document (the
// Configure command, control.h); a rank started by mpirun / srun reads the
// job's own command line instead.
struct WorkerConfig {
  std::string model_dir;
  int attention_workers = 1, expert_workers = 1;
  // Every attention worker's engine: the KV cache budget, the step's token
  // budget (it also sizes the M2N messages: max_step_tokens_limit), the m
  // micro-batches (the expert workers' too), the attention cost model and
  // prefix caching. The engine's device is attention_device; what only a
  // process can set (attention peers, cache events, stepping when idle) the
  // attention worker sets.
  EngineOptions engine;
  // Expert tensor parallelism: each of the expert_workers is tp_expert
  // processes (bootstrap ranks attention workers, then expert worker w's shard
  // r at A + w * tp_expert + r). expert_workers * tp_expert <= 128.
  int tp_expert = 1;
  ExpertReduce tp_expert_reduce = ExpertReduce::kAttentionSum;
  // Where the shared experts run (no effect for a model without them).
  SharedExpertsOn shared_experts = SharedExpertsOn::kAttention;
  int expert_processes() const { return expert_workers * tp_expert; }
  // Attention tensor parallelism: each of the attention_workers (replicas) is
  // tp_attention processes, bootstrap ranks a * tp_attention + r, so the
  // expert processes start at attention_processes(). Rank 0 of a replica runs
  // the engine (scheduler, KV block tables, norms, gate, LM head, sampling)
  // and alone talks to the router and the expert workers; ranks 1.. compute
  // their heads' attention (docs/RUNTIME.md, "Attention tensor parallelism").
  int tp_attention = 1;
  int attention_processes() const { return attention_workers * tp_attention; }
  // Compute threads (OMP_NUM_THREADS) of every attention / expert process the
  // router forks; 0: the cores shared evenly over the processes (or the
  // environment's OMP_NUM_THREADS). A CPU plan document sets them.
  int attention_threads = 0, expert_threads = 0;
  int processes() const { return attention_processes() + expert_processes(); }
  Placement placement;
  comm::TransportKind transport = comm::TransportKind::kDirect;  // M2N (comm::make_transport)
  std::string address;  // local address for the fabric (multi-host); "" = the transport's choice
  int timeout_ms = 10000;
  kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16;  // GEMM weights
  std::string attention_device = "cpu", expert_device = "cpu";  // runtime/device_backend.h
  // The router's choice of attention replica for a request (routing_policy.h,
  // docs/RUNTIME.md, "Cache-aware routing"): the replica with the longest
  // cached prefix of its tokens unless its load exceeds the least-loaded
  // replica's by more than routing_load_slack tokens. Cache-aware without
  // prefix caching, or with one replica, is least-loaded.
  RoutingPolicy routing = RoutingPolicy::kCacheAware;
  int64_t routing_load_slack = kDefaultRoutingLoadSlack;
  // 2048 outstanding tokens: 8 steps' prefill at the default 256
  // max_step_tokens; a replica further ahead than that delays a request by
  // more than recomputing a prefix of a typical chat (a few blocks) costs.
  static constexpr int64_t kDefaultRoutingLoadSlack = 2048;
  // The router's: the requests of an attention worker that died go to
  // another one (prompt + tokens delivered) instead of failing.
  bool resubmit = false;
  // The router's: a worker death it cannot survive otherwise restarts the
  // deployment with the same shape (a replacement for the dead worker).
  bool respawn = false;
  // The router's online rebalancing (docs/RUNTIME.md, "Online rebalancing"):
  // every rebalance_every steps (0: never) it computes a placement from the
  // rows routed since the last look (balance_placement, at most
  // rebalance_slots experts per worker; 0: as many as the fullest worker of
  // the starting placement) and, when the predicted max/mean load of the
  // expert workers drops by the factor rebalance_gain or more, has the expert
  // workers load the experts they gain while serving, then switches every
  // worker to it between two steps. rebalance_fixed_rows: what running one
  // replica costs whatever its rows, in rows per step and layer (msinfer
  // balance's --expert-fixed-rows).
  int rebalance_every = 0;
  int rebalance_slots = 0;
  double rebalance_gain = 1.1;
  double rebalance_fixed_rows = 0;
  // Prefill/decode disaggregation (docs/RUNTIME.md): prefill_workers
  // processes, each a co-located engine with every weight, compute the
  // prompts; each sequence's K/V then moves over the M2N transport into a
  // staging region of kv_transfer_bytes on the attention worker the router
  // routes it to, which decodes it. 0: the attention workers prefill.
  int prefill_workers = 0;
  int64_t kv_transfer_bytes = 64ll << 20;
};

// The document a forked worker is configured with (control::Configure):
// every field above by its name, `engine` an object of the EngineOptions
// that travel (kv_cache_bytes, block_size, max_step_tokens, micro_batches,
// attention_cost_per_token / _per_position, prefix_caching,
// prefix_cache_salt), enums by their flag names, placement as
// Placement::to_json. Reading never throws: a missing field keeps its
// default, one of the wrong type or range is an INVALID_ARGUMENT naming it.
Json worker_config_json(const WorkerConfig& c);
StatusOr<WorkerConfig> worker_config_from_json(const Json& j, const std::string& where);

}  // namespace msinfer::runtime
