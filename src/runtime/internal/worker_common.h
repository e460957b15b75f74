// What the worker processes of a disaggregated deployment share: the M2N
// shapes of their channels and the messages' headers, the wiring through the
// bootstrap, the transport options, the idle policy of a serve loop and its
// answers to the router's common commands. Private to runtime/.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/m2n.h"
#include "msinfer/runtime/control.h"
#include "msinfer/runtime/disaggregated.h"
#include "msinfer/runtime/worker_stats.h"

namespace msinfer::runtime::internal {

inline constexpr int kMaxRows = 65535;

// Message header: int32 row count per expert on the destination, then (in the
// header's last 8 bytes) the sender's system-clock send time in ns, for T_c.
inline int64_t header_rows(int64_t local_experts, int64_t row_bytes) {
  return (local_experts * 4 + 8 + row_bytes - 1) / row_bytes;
}

// Under --shared-experts expert, for a model with shared experts: every
// message carries one more count (the shared experts' rows) after the hosted
// experts', and every token of a MoE layer one more row.
inline bool shared_experts_remote(const WorkerConfig& c, const ModelConfig& mc) {
  return c.shared_experts == SharedExpertsOn::kExpert && mc.shared_expert_ffn > 0;
}

inline int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The answer to an Add: the request queued in `engine` (Added), or why not
// (Refused).
inline control::Event add_request(Engine& engine, const GenerationRequest& r) {
  const Status s = engine.add(r);
  if (s.ok()) return control::Added{r.id};
  return control::Refused{r.id, s.message()};
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// GEMM FLOPs per token of one layer on rank 0 of an attention replica.
double attention_layer_flops(const ModelConfig& mc, int tp, bool shared_on_experts);

// Connects the two channels of one process: `sender` (if any: a shard that
// answers through shard 0 sends nothing back) to every peer's receive region
// (peer p is bootstrap rank first_peer + p * stride), through one allgather of
// (address, region).
Status wire(comm::Bootstrap& boot, comm::M2NEndpoint& ep, comm::M2NSender* sender,
            const comm::RemoteRegion& region, int first_peer, int peers, int stride = 1);

// Expert tensor parallelism with kAllReduce: a second allgather, in which
// shard 0 of every expert worker publishes its reduce region (everyone else a
// card that nobody reads), so shards 1..tp-1 can write their partials to it.
// Every process of the deployment takes part (the allgather is collective).
bool has_reduce_channel(const WorkerConfig& c);

// Dispatch (channel 0: attention -> expert processes) and combine (channel 1:
// back). Slots are sized for the largest micro-batch: every token of a step
// routed to one destination K times, plus the row-count header.
comm::M2NShape shape(const WorkerConfig& c, const ModelConfig& mc, int channel);
// Shards 1..tp-1 -> shard 0 of one expert worker (kAllReduce): per (slot,
// layer) one message of every attention worker's answer rows, concatenated in
// attention-worker order, as partial sums. On channel 1.
comm::M2NShape reduce_shape(const WorkerConfig& c, const ModelConfig& mc);

// Attention tensor parallelism (tp_attention > 1), within one replica:
//  - broadcast, rank 0 -> ranks 1..tp-1, on channel 1: per layer one
//    message, [header][T rows of the normed input h, hidden floats each].
//    Header, int32 words padded to whole rows: layer, T, header rows, then per
//    token its position, its block count n = position / block_size + 1 and
//    the n block ids of its request's table.
//  - partials, ranks 1..tp-1 -> rank 0, on channel 0: T rows, the rank's
//    partial o_proj output.
// One slot: rank 0 waits for the partials before it sends the next layer.
comm::M2NShape tp_broadcast_shape(const WorkerConfig& c, const ModelConfig& mc);
comm::M2NShape tp_partial_shape(const WorkerConfig& c, const ModelConfig& mc);

// A serve loop with nothing to do for 2000 rounds sleeps 200 us a round, 2 ms
// once idle for 50 ms (an idle expert worker measured 1.2-1.6% of a core).
void idle_pause(int64_t idle_since_ns);

StatusOr<std::unique_ptr<comm::Transport>> make_transport(const WorkerConfig& c);

// The placement of a rebalancing command (Prepare, SetPlacement): valid for
// the model's `experts` and for this deployment's expert workers.
Status check_router_placement(const Placement& p, const WorkerConfig& c, int experts);

// A serve-loop worker's commands from the router (expert processes, attention
// tp ranks > 0): GetStats and Exit, or the router gone (end of input); any
// other command goes to `other` where given, else is answered with an error.
// Looks at what has arrived without waiting. True when the worker is to stop.
StatusOr<bool> serve_commands(control::WorkerChannel& ch, WorkerStats* stats,
                              const std::function<Status(control::Command&)>& other = {});

}  // namespace msinfer::runtime::internal
