// The disaggregated runtime's worker side (docs/RUNTIME.md): attention
// workers run the engine with RemoteExperts; expert workers hold only their
// experts' weights and serve (micro-batch slot, layer) units as soon as every
// attention worker's message for them arrived. Data moves through the M2N
// library (dispatch: attention -> expert workers; combine: back).
//
// Message from attention worker a to expert worker w for (slot k, layer l):
//   [header: int32 row count per expert hosted on w, in placement order,
//    under --shared-experts expert one more count: the shared experts' rows
//    (0 unless w holds layer l's), padded to whole rows, its last 8 bytes the
//    send time][rows, expert by expert, the shared experts' last, each hidden floats]
// The answer carries the outputs of the same rows in the same order.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/m2n.h"
#include "msinfer/core/json.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/expert_backend.h"
#include "msinfer/runtime/placement.h"
#include "msinfer/runtime/routing_policy.h"
#include "msinfer/runtime/worker_stats.h"

namespace msinfer::runtime {

struct WorkerConfig {
  std::string model_dir;
  int attention_workers = 1, expert_workers = 1, micro_batches = 1;
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
  int64_t kv_cache_bytes = 256ll << 20;
  // Every attention worker's EngineOptions::max_step_tokens; it also sizes
  // the M2N messages (max_step_tokens_limit).
  int64_t max_step_tokens = EngineOptions::kDefaultMaxStepTokens;
  std::string provider = "direct";  // M2N transport (comm::make_transport)
  std::string address;  // local address for the fabric (multi-host); "" = provider's choice
  int timeout_ms = 10000;
  kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16;  // GEMM weights
  std::string attention_device = "cpu", expert_device = "cpu";  // runtime/device_backend.h
  // EngineOptions::attention_cost_per_token / _per_position (0: from the model).
  double attention_cost_per_token = 0, attention_cost_per_position = 0;
  // EngineOptions::prefix_caching of every attention worker's engine.
  bool prefix_caching = true;
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
};

// The largest max_step_tokens whose messages fit every M2N channel of `c`
// with `mc` (a message carries at most 65535 rows: a micro-batch's tokens
// routed top_k times to one expert worker, with its header; under
// allreduce one expert worker's answers to every attention worker; under
// tp_attention the layer's broadcast with its block tables). The receive
// regions grow linearly with max_step_tokens up to this bound.
int64_t max_step_tokens_limit(const WorkerConfig& c, const ModelConfig& mc);

// Rows per expert worker and MoE layer (on average) a rebalancing decision
// needs; the router's looks add up their rows until there are this many.
inline constexpr int64_t kRebalanceMinRows = 128;

// The rebalancing settings of `c` for a model with `experts` experts:
// UNIMPLEMENTED on a GPU expert device, INVALID_ARGUMENT for a gain below 1 or
// rebalance_slots x expert workers < experts. OK when rebalancing is off.
Status check_rebalancing(const WorkerConfig& c, int experts);

// "expert worker 3", or with tp > 1 "expert worker 3 tp rank 1": how errors
// and the router name one expert process.
std::string expert_process_name(int worker, int tp_rank, int tp);
// "attention worker 1", or with tp > 1 "attention worker 1 tp rank 1".
std::string attention_process_name(int worker, int tp_rank, int tp);

// The bootstrap of a replacement expert worker that joins a running
// deployment (Router, --respawn): each allgather goes to the router over the
// control pipes (control::JoinAllgather on `out`, control::JoinBlobs back on
// `in`), and the router answers with the running workers' cards. Reads
// byte by byte, so no command after the answer is taken from the pipe.
std::unique_ptr<comm::Bootstrap> router_pipe_bootstrap(int in_fd, int out_fd, int rank, int size);

// The two kinds of worker process; each reads the router's commands and
// answers with events (runtime/control.h) on in_fd / out_fd until Exit or
// the end of the input. Errors name the process and the peer at fault.
// `tp_rank` is the process's shard of expert worker `index` (0 without
// tensor parallelism): expert_worker.cc.
Status run_expert_worker(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                         int in_fd, int out_fd);
// An attention worker (attention_worker.cc): its engine with remote experts.
// With tp_attention > 1, `tp_rank` > 0 makes the process one of the
// replica's other ranks: it computes its heads' attention for rank 0 and
// answers only GetStats and Exit.
Status run_attention_worker(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                            int in_fd, int out_fd);

}  // namespace msinfer::runtime
