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
#include "msinfer/runtime/worker_config.h"
#include "msinfer/runtime/worker_stats.h"

namespace msinfer::runtime {

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

// A prefill worker (prefill_worker.cc; docs/RUNTIME.md, "Prefill/decode
// disaggregation"): a co-located engine that computes prompts and writes each
// sequence's K/V into the staging region of the attention worker the router
// names. No bootstrap rank.
Status run_prefill_worker(const WorkerConfig& c, int index, int in_fd, int out_fd);

}  // namespace msinfer::runtime
