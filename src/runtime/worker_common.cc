#include "internal/worker_common.h"

#include <unistd.h>

#include <algorithm>

#include "msinfer/comm/fabric_transport.h"
#include "msinfer/runtime/kv_cache.h"

namespace msinfer::runtime::internal {

// GEMM FLOPs per token of one layer on rank 0 of an attention replica: its
// heads' QKV and O, and the router. DeepSeek (MLA): the latent attention's
// projections and the router, plus the shared experts, on average over the
// layers (a dense layer's MLP instead of router and shared experts; without
// the shared experts when they run on the expert workers).
double attention_layer_flops(const ModelConfig& mc, int tp, bool shared_on_experts) {
  const double h = static_cast<double>(mc.hidden), hd = static_cast<double>(mc.head_dim);
  if (mc.kv_lora_rank > 0) {
    const double L = mc.layers, moe = mc.moe_layers;
    const double shared = shared_on_experts ? 0.0 : static_cast<double>(mc.shared_expert_ffn);
    const double ffn =
        moe * (h * mc.experts + 3.0 * h * shared) + (L - moe) * 3.0 * h * mc.dense_ffn;
    return 2.0 * mc.attention_params_per_layer() / tp + 2.0 * ffn / L;
  }
  const double heads = static_cast<double>(mc.heads) / tp, kv = mc.kv_heads_per_attention_rank(tp);
  return 2.0 * h * (heads + 2.0 * kv) * hd + 2.0 * heads * hd * h + 2.0 * h * mc.experts;
}

// Connects the two channels of one process: `sender` (if any: a shard that
// answers through shard 0 sends nothing back) to every peer's receive region
// (peer p is bootstrap rank first_peer + p * stride), through one allgather of
// (address, region).
Status wire(comm::Bootstrap& boot, comm::M2NEndpoint& ep, comm::M2NSender* sender,
            const comm::RemoteRegion& region, int first_peer, int peers, int stride) {
  MSI_ASSIGN_OR_RETURN(std::vector<std::string> blobs,
                       boot.allgather(comm::PeerCard{ep.transport().address(), region}.encode()));
  for (int p = 0; sender != nullptr && p < peers; ++p) {
    const int rank = first_peer + p * stride;
    MSI_ASSIGN_OR_RETURN(comm::PeerCard card,
                         comm::PeerCard::decode(blobs[rank], "rank " + std::to_string(rank)));
    MSI_ASSIGN_OR_RETURN(int handle, ep.transport().connect(card.address));
    sender->set_receiver(p, handle, card.region);
  }
  return boot.barrier();
}

// Expert tensor parallelism with kAllReduce: a second allgather, in which
// shard 0 of every expert worker publishes its reduce region (everyone else a
// card that nobody reads), so shards 1..tp-1 can write their partials to it.
// Every process of the deployment takes part (the allgather is collective).
bool has_reduce_channel(const WorkerConfig& c) {
  return c.tp_expert > 1 && c.tp_expert_reduce == ExpertReduce::kAllReduce;
}

namespace {

// Rows of the largest dispatch message: every token of a step routed to one
// destination K times (+1 for remote shared experts), plus the header.
int64_t dispatch_rows(const WorkerConfig& c, const ModelConfig& mc) {
  const int64_t shared = shared_experts_remote(c, mc) ? 1 : 0;
  return c.engine.max_step_tokens * (mc.top_k + shared) +
         header_rows(mc.experts + shared, static_cast<int64_t>(mc.hidden) * 4);
}

int64_t tp_max_header_rows(const WorkerConfig& c, const ModelConfig& mc, int64_t row_bytes) {
  const int64_t blocks =
      (mc.max_position_embeddings + c.engine.block_size - 1) / c.engine.block_size;
  return ((3 + c.engine.max_step_tokens * (2 + blocks)) * 4 + row_bytes - 1) / row_bytes;
}

// The most rows any channel of `c` may carry in one message.
int64_t largest_message_rows(const WorkerConfig& c, const ModelConfig& mc) {
  int64_t rows = dispatch_rows(c, mc);
  if (has_reduce_channel(c)) rows *= c.attention_workers;
  if (c.tp_attention > 1) {
    rows = std::max(rows, c.engine.max_step_tokens +
                              tp_max_header_rows(c, mc, static_cast<int64_t>(mc.hidden) * 4));
  }
  return rows;
}

}  // namespace

// Slots are sized for the largest micro-batch (dispatch_rows); the CLI keeps
// max_step_tokens within max_step_tokens_limit, so the cap never bites there.
comm::M2NShape shape(const WorkerConfig& c, const ModelConfig& mc, int channel) {
  comm::M2NShape s;
  // Dispatch reaches every shard of every expert worker; the answers come
  // from every shard (attention-sum) or from shard 0 of each worker (allreduce).
  const int answering =
      c.tp_expert_reduce == ExpertReduce::kAttentionSum ? c.expert_processes() : c.expert_workers;
  s.senders = channel == 0 ? c.attention_workers : answering;
  s.receivers = channel == 0 ? c.expert_processes() : c.attention_workers;
  s.slots = c.engine.micro_batches;
  s.row_bytes = static_cast<int64_t>(mc.hidden) * 4;
  s.max_rows = std::min<int64_t>(kMaxRows, dispatch_rows(c, mc));
  s.channel = channel;
  return s;
}

// Shards 1..tp-1 -> shard 0 of one expert worker (kAllReduce): per (slot,
// layer) one message of every attention worker's answer rows, concatenated in
// attention-worker order, as partial sums. On channel 1, where shard 0 only
// sends (the combine) and never receives otherwise.
comm::M2NShape reduce_shape(const WorkerConfig& c, const ModelConfig& mc) {
  comm::M2NShape s = shape(c, mc, 1);
  s.senders = c.tp_expert - 1;
  s.receivers = 1;
  s.max_rows = std::min<int64_t>(kMaxRows, s.max_rows * c.attention_workers);
  return s;
}

// Attention tensor parallelism (tp_attention > 1), within one replica:
//  - broadcast, rank 0 -> ranks 1..tp-1, on channel 1 (rank 0 only receives
//    there otherwise; ranks > 0 are on no other channel): per layer one
//    message, [header][T rows of the normed input h, hidden floats each].
//    Header, int32 words padded to whole rows: layer, T, header rows, then per
//    token its position, its block count n = position / block_size + 1 and
//    the n block ids of its request's table.
//  - partials, ranks 1..tp-1 -> rank 0, on channel 0 (rank 0 only sends
//    there otherwise): T rows, the rank's partial o_proj output.
// One slot: rank 0 waits for the partials before it sends the next layer.
comm::M2NShape tp_broadcast_shape(const WorkerConfig& c, const ModelConfig& mc) {
  comm::M2NShape s;
  s.senders = 1;
  s.receivers = c.tp_attention - 1;
  s.slots = 1;
  s.row_bytes = static_cast<int64_t>(mc.hidden) * 4;
  s.max_rows = std::min<int64_t>(kMaxRows,
                                 c.engine.max_step_tokens + tp_max_header_rows(c, mc, s.row_bytes));
  s.channel = 1;
  return s;
}
comm::M2NShape tp_partial_shape(const WorkerConfig& c, const ModelConfig& mc) {
  comm::M2NShape s;
  s.senders = c.tp_attention - 1;
  s.receivers = 1;
  s.slots = 1;
  s.row_bytes = static_cast<int64_t>(mc.hidden) * 4;
  s.max_rows = std::min<int64_t>(kMaxRows, c.engine.max_step_tokens);
  s.channel = 0;
  return s;
}

// A serve loop with nothing to do for 2000 rounds sleeps 200 us a round, 2 ms
// once idle for 50 ms (an idle expert worker measured 1.2–1.6% of a core).
void idle_pause(int64_t idle_since_ns) {
  ::usleep(wall_ns() - idle_since_ns > 50'000'000 ? 2000 : 200);
}

StatusOr<std::unique_ptr<comm::Transport>> make_transport(const WorkerConfig& c) {
  comm::FabricOptions fo;
  fo.transport = c.transport;
  fo.write_timeout_ms = c.timeout_ms;
  fo.address = c.address;
  // A send must not wait for the receiver: an expert worker progresses the
  // fabric only between units, and shm's bounce buffers need the receiver's
  // progress to drain, so an attention worker's send blocked ~3 ms per unit
  // while the experts computed (small-mixtral, 1+1, m=3: busy 52% -> 11%).
  fo.shm_single_copy = comm::FabricOptions::SingleCopy::kOn;
  // A dead peer's connection must not end this worker before the router
  // tells it to drop the peer (docs/RUNTIME.md, "Failures"); an M2N wait
  // for it still times out naming it.
  fo.tolerate_peer_loss = true;
  return comm::make_transport(fo);
}

Status check_router_placement(const Placement& p, const WorkerConfig& c, int experts) {
  if (static_cast<int>(p.replicas.size()) != experts) {
    return invalid_argument("router: a placement for " + std::to_string(p.replicas.size()) +
                            " experts, not " + std::to_string(experts));
  }
  if (p.workers != c.expert_workers) {
    return invalid_argument("router: a placement for " + std::to_string(p.workers) +
                            " expert workers, not " + std::to_string(c.expert_workers));
  }
  return ok_status();
}

StatusOr<bool> serve_commands(control::WorkerChannel& ch, WorkerStats* stats,
                              const std::function<Status(control::Command&)>& other) {
  bool eof = false;
  while (auto cmd = ch.next(0, &eof)) {
    if (std::holds_alternative<control::Exit>(*cmd)) return true;
    if (auto* st = std::get_if<control::GetStats>(&*cmd)) {
      stats->wait_s = std::max(0.0, stats->window_s() - stats->busy_s);  // nothing to serve
      ch.send(control::StatsReport{stats->to_json()});
      if (st->reset) stats->reset();
      continue;
    }
    if (other) {
      MSI_RETURN_IF_ERROR(other(*cmd));
      continue;
    }
    ch.send(control::Error{ch.who() + ": unexpected command '" + control::op_name(*cmd) + "'"});
  }
  return eof;
}

}  // namespace msinfer::runtime::internal

namespace msinfer::runtime {

int64_t max_step_tokens_limit(const WorkerConfig& c, const ModelConfig& mc) {
  WorkerConfig t = c;
  int64_t lo = 0, hi = internal::kMaxRows;  // rows grow with tokens: the last that fits
  while (lo < hi) {
    t.engine.max_step_tokens = (lo + hi + 1) / 2;
    if (internal::largest_message_rows(t, mc) <= internal::kMaxRows) {
      lo = t.engine.max_step_tokens;
    } else {
      hi = t.engine.max_step_tokens - 1;
    }
  }
  return lo;
}

}  // namespace msinfer::runtime
