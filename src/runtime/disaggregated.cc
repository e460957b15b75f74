#include "msinfer/runtime/disaggregated.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "internal/line_io.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/core/process.h"
#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/device_backend.h"

namespace msinfer::runtime {
namespace {

constexpr int kMaxRows = 65535;

// Message header: int32 row count per expert on the destination, then (in the
// header's last 8 bytes) the sender's system-clock send time in ns, for T_c.
int64_t header_rows(int64_t local_experts, int64_t row_bytes) {
  return (local_experts * 4 + 8 + row_bytes - 1) / row_bytes;
}

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// GEMM FLOPs per token of one layer on rank 0 of an attention replica: its
// heads' QKV and O, and the router. DeepSeek (MLA): the latent attention's
// projections and the router, plus the shared experts, on average over the
// layers (a dense layer's MLP instead of router and shared experts).
double attention_layer_flops(const ModelConfig& mc, int tp) {
  const double h = static_cast<double>(mc.hidden), hd = static_cast<double>(mc.head_dim);
  if (mc.kv_lora_rank > 0) {
    const double L = mc.layers, moe = mc.moe_layers;
    const double ffn = moe * (h * mc.experts + 3.0 * h * mc.shared_expert_ffn) +
                       (L - moe) * 3.0 * h * mc.dense_ffn;
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
            const comm::RemoteRegion& region, int first_peer, int peers, int stride = 1) {
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

// Slots are sized for the largest micro-batch: every token of a step routed to
// one destination K times, plus the row-count header.
comm::M2NShape shape(const WorkerConfig& c, const ModelConfig& mc, int channel) {
  comm::M2NShape s;
  // Dispatch reaches every shard of every expert worker; the answers come
  // from every shard (attention-sum) or from shard 0 of each worker (allreduce).
  const int answering =
      c.tp_expert_reduce == ExpertReduce::kAttentionSum ? c.expert_processes() : c.expert_workers;
  s.senders = channel == 0 ? c.attention_workers : answering;
  s.receivers = channel == 0 ? c.expert_processes() : c.attention_workers;
  s.slots = c.micro_batches;
  s.row_bytes = static_cast<int64_t>(mc.hidden) * 4;
  s.max_rows = std::min<int64_t>(
      kMaxRows, c.max_step_tokens * mc.top_k + header_rows(mc.experts, s.row_bytes));
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
int64_t tp_max_header_rows(const WorkerConfig& c, const ModelConfig& mc, int64_t row_bytes) {
  const int64_t blocks =
      (mc.max_position_embeddings + KvCache::kDefaultBlockSize - 1) / KvCache::kDefaultBlockSize;
  return ((3 + c.max_step_tokens * (2 + blocks)) * 4 + row_bytes - 1) / row_bytes;
}
comm::M2NShape tp_broadcast_shape(const WorkerConfig& c, const ModelConfig& mc) {
  comm::M2NShape s;
  s.senders = 1;
  s.receivers = c.tp_attention - 1;
  s.slots = 1;
  s.row_bytes = static_cast<int64_t>(mc.hidden) * 4;
  s.max_rows =
      std::min<int64_t>(kMaxRows, c.max_step_tokens + tp_max_header_rows(c, mc, s.row_bytes));
  s.channel = 1;
  return s;
}
comm::M2NShape tp_partial_shape(const WorkerConfig& c, const ModelConfig& mc) {
  comm::M2NShape s;
  s.senders = c.tp_attention - 1;
  s.receivers = 1;
  s.slots = 1;
  s.row_bytes = static_cast<int64_t>(mc.hidden) * 4;
  s.max_rows = std::min<int64_t>(kMaxRows, c.max_step_tokens);
  s.channel = 0;
  return s;
}

using internal::read_line;
using internal::write_line;

// A serve-loop worker's commands from the router (expert workers, attention
// tp ranks > 0): {"op": "stats", "reset": bool}, {"op": "exit"}, or the
// router gone (end of file); any other op goes to `other` where given.
// Looked at when idle and every 1024 rounds, so a poll() costs nothing.
// Answers every command waiting; true when the worker is to stop. `who` names
// the worker in errors.
StatusOr<bool> answer_router_commands(int in_fd, int out_fd, std::string* pending,
                                      WorkerStats* stats, const std::string& who,
                                      const std::function<Status(const Json&)>& other = {}) {
  std::string line;
  bool eof = false;
  while (read_line(in_fd, pending, &line, 0, &eof)) {
    auto cmd = parse_json(line, who + " command");
    if (!cmd.ok()) return cmd.status();
    const std::string op = cmd->value("op", "");
    if (op == "exit") return true;
    if (op == "stats") {
      stats->wait_s = std::max(0.0, stats->window_s() - stats->busy_s);  // nothing to serve
      write_line(out_fd, Json{{"stats", stats->to_json()}}.dump());
      if (cmd->value("reset", false)) stats->reset();
      continue;
    }
    if (other) {
      MSI_RETURN_IF_ERROR(other(*cmd));
      continue;
    }
    return invalid_argument(who + ": unknown command '" + op + "'");
  }
  return eof;
}

// A serve loop with nothing to do for 2000 rounds sleeps 200 us a round, 2 ms
// once idle for 50 ms (an idle expert worker measured 1.2–1.6% of a core).
void idle_pause(int64_t idle_since_ns) {
  ::usleep(wall_ns() - idle_since_ns > 50'000'000 ? 2000 : 200);
}

StatusOr<std::unique_ptr<comm::Transport>> make_transport(const WorkerConfig& c) {
  comm::FabricOptions fo;
  fo.provider = c.provider;
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

}  // namespace

namespace {

class RouterPipeBootstrap : public comm::Bootstrap {
 public:
  RouterPipeBootstrap(int in_fd, int out_fd, int rank, int size)
      : in_(in_fd), out_(out_fd), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  StatusOr<std::vector<std::string>> allgather(const std::string& blob) override {
    if (!write_line(out_, Json{{"allgather", internal::to_hex(blob)}}.dump())) {
      return unavailable("joining: the router's pipe is closed");
    }
    std::string line;
    char c = 0;
    while (true) {
      const ssize_t n = ::read(in_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return unavailable("joining: the router closed its pipe");
      if (c == '\n') break;
      line.push_back(c);
      if (line.size() > (64u << 20))
        return invalid_argument("joining: the router's answer is too long");
    }
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(line, "router (joining)"));
    if (!j.contains("blobs") || !j["blobs"].is_array() ||
        j["blobs"].size() != static_cast<size_t>(size_)) {
      return invalid_argument("joining: expected " + std::to_string(size_) +
                              " blobs from the router, got " + line.substr(0, 200));
    }
    std::vector<std::string> out(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const Json& b = j["blobs"][static_cast<size_t>(r)];
      if (!b.is_string() || !internal::from_hex(b.get<std::string>(), &out[r])) {
        return invalid_argument("joining: the router's blob " + std::to_string(r) + " is not hex");
      }
    }
    return out;
  }

 private:
  int in_, out_, rank_, size_;
};

}  // namespace

std::unique_ptr<comm::Bootstrap> router_pipe_bootstrap(int in_fd, int out_fd, int rank, int size) {
  return std::make_unique<RouterPipeBootstrap>(in_fd, out_fd, rank, size);
}

std::string expert_process_name(int worker, int tp_rank, int tp) {
  std::string n = "expert worker " + std::to_string(worker);
  if (tp > 1) n += " tp rank " + std::to_string(tp_rank);
  return n;
}

std::string attention_process_name(int worker, int tp_rank, int tp) {
  std::string n = "attention worker " + std::to_string(worker);
  if (tp > 1) n += " tp rank " + std::to_string(tp_rank);
  return n;
}

// ---- placement: placement.cc ----

// ---- attention side: RemoteExperts ----

class RemoteExperts : public ExpertBackend {
 public:
  RemoteExperts(const WorkerConfig& c, const ModelConfig& mc, int index, comm::M2NEndpoint& ep,
                WorkerStats* stats)
      : c_(c),
        index_(index),
        ep_(ep),
        hidden_(mc.hidden),
        layers_(mc.layers),
        layer_flops_(attention_layer_flops(mc, c.tp_attention)),
        stats_(stats),
        dispatch_(shape(c, mc, 0), index),
        combine_(shape(c, mc, 1), index) {
    set_placement(c.placement);
  }
  // Between steps only: the router switches every worker of the deployment
  // to a new placement at once (online rebalancing).
  void set_placement(const Placement& p) {
    placement_ = p;
    local_.clear();
    for (int w = 0; w < c_.expert_workers; ++w) local_.push_back(p.experts_on(w));
    expert_rows_.assign(p.replicas.size(), 0);
  }
  Status attach(comm::Bootstrap& boot) {
    MSI_RETURN_IF_ERROR(dispatch_.attach(ep_));
    MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, combine_.attach(ep_));
    combine_region_ = region;
    MSI_RETURN_IF_ERROR(
        wire(boot, ep_, &dispatch_, region, c_.attention_processes(), c_.expert_processes()));
    if (has_reduce_channel(c_)) {  // take part in the shards' wiring
      MSI_RETURN_IF_ERROR(wire(boot, ep_, nullptr, region, 0, 0));
    }
    return ok_status();
  }
  // Runs while finish() waits for the expert workers' answers: the worker
  // reads the router's commands there (drop_expert_worker).
  void set_between_polls(std::function<Status()> f) { between_polls_ = std::move(f); }
  // Expert worker w died (the router saw it) and every expert it held has a
  // replica on another one: its experts' rows go to those replicas from the
  // next message on, nothing more is sent to it or waited for. During a step
  // (`mid_step`) its answers for this step may be lost: the step finishes
  // with empty rows in their place, and discard_step() has the engine run it
  // again. The workers keep their numbers (Placement::emptied).
  // With `keep_placement` (its experts have no replica: the router runs no
  // step until a replacement joins) the routing stays as it was.
  Status drop_expert_worker(int w, bool mid_step, bool keep_placement) {
    if (w < 0 || w >= c_.expert_workers || c_.tp_expert != 1) {
      return invalid_argument("attention worker " + std::to_string(index_) +
                              ": cannot drop expert worker " + std::to_string(w));
    }
    if (!keep_placement) {
      MSI_ASSIGN_OR_RETURN(Placement p, placement_.emptied(w));
      set_placement(p);
    }
    combine_.drop_sender(w);
    dispatch_.drop_receiver(w);
    discard_ = discard_ || mid_step;
    return ok_status();
  }
  bool discard_step() const override { return discard_; }
  // For a replacement expert worker (Router, --respawn): where it writes this
  // worker's answers, and the units each slot has exchanged so far.
  std::string card() const {
    return comm::PeerCard{ep_.transport().address(), combine_region_}.encode();
  }
  std::vector<int64_t> units() const {
    std::vector<int64_t> n(static_cast<size_t>(c_.micro_batches), 0);
    for (const auto& [k, done] : steps_done_) n[static_cast<size_t>(k)] = done;
    return n;
  }
  // Between steps: a replacement for dropped expert worker w, at `card`,
  // takes back the experts' `shares` it held (Placement::with_worker).
  Status add_expert_worker(int w, const comm::PeerCard& card,
                           const std::vector<std::pair<int, double>>& shares) {
    if (w < 0 || w >= c_.expert_workers || !dispatch_.dropped(w)) {
      return invalid_argument("attention worker " + std::to_string(index_) + ": expert worker " +
                              std::to_string(w) + " was not dropped");
    }
    MSI_ASSIGN_OR_RETURN(Placement p, placement_.with_worker(w, shares));
    MSI_ASSIGN_OR_RETURN(int handle, ep_.transport().connect(card.address));
    dispatch_.set_receiver(w, handle, card.region);
    dispatch_.restore_receiver(w);
    combine_.restore_sender(w);
    set_placement(p);
    return ok_status();
  }
  Status begin_step() override {
    last_return_ = std::chrono::steady_clock::now();
    discard_ = false;
    return ok_status();
  }

  Status start(int k, int l, const kernels::cpu::RoutedBatch& r) override {
    // Since the previous call returned: micro-batch k's attention for layer l.
    stats_->t_a.add(k, l, seconds_since(last_return_));
    stats_->gemm_flops += layer_flops_ * static_cast<double>(r.tokens);
    if (l == 0) stats_->tokens += r.tokens;
    const int64_t sent_ns = wall_ns();
    const int W = c_.expert_workers, tp = c_.tp_expert;
    const int64_t row_bytes = hidden_ * 4;
    // Split each replicated expert's rows over its replicas by predicted
    // worker load (split_rows), then lay out each destination's message.
    for (int e = 0; e < static_cast<int>(expert_rows_.size()); ++e)
      expert_rows_[e] = r.expert_rows(e);
    const std::vector<std::vector<int64_t>> take = split_rows(placement_, expert_rows_);
    auto& plan = plans_[k];
    plan.assign(W, {});
    // Expert worker w's message goes to each of its tp shards (receiver
    // w * tp + r): every shard needs every row (column-parallel gate/up).
    std::vector<int64_t> rows(static_cast<size_t>(W) * tp, 0);
    for (int w = 0; w < W; ++w) {
      uint8_t* buf = dispatch_.buffer(k, w * tp);
      const int64_t hdr = header_rows(static_cast<int64_t>(local_[w].size()), row_bytes);
      std::vector<int32_t> counts(local_[w].size(), 0);
      int64_t at = hdr;
      for (size_t i = 0; i < local_[w].size(); ++i) {
        const int e = local_[w][i];
        const int64_t off = r.expert_offset[e];
        // This replica's [b, end) of the expert's rows.
        int64_t b = 0, end = 0;
        for (size_t j = 0; j < placement_.replicas[e].size(); ++j) {
          end = b + take[e][j];
          if (placement_.replicas[e][j].first == w) break;
          b = end;
        }
        counts[i] = static_cast<int32_t>(end - b);
        if (at + (end - b) > dispatch_.shape().max_rows) {
          return resource_exhausted("micro-batch too large for one M2N message (" +
                                    std::to_string(at + end - b) + " rows)");
        }
        if (end > b) {  // none: r.send may be empty, its data() null (memcpy's UB)
          std::memcpy(buf + at * row_bytes, r.send.data() + (off + b) * hidden_,
                      static_cast<size_t>((end - b) * row_bytes));
        }
        plan[w].push_back({off + b, end - b, at - hdr});
        at += end - b;
      }
      std::memset(buf, 0, static_cast<size_t>(hdr * row_bytes));
      if (!counts.empty()) std::memcpy(buf, counts.data(), counts.size() * 4);
      std::memcpy(buf + hdr * row_bytes - 8, &sent_ns, 8);
      for (int r = 0; r < tp; ++r) {
        if (r > 0)
          std::memcpy(dispatch_.buffer(k, w * tp + r), buf, static_cast<size_t>(at * row_bytes));
        rows[static_cast<size_t>(w) * tp + r] = at;
      }
    }
    const auto waited_from = std::chrono::steady_clock::now();
    MSI_RETURN_IF_ERROR(dispatch_.wait_sent(k));  // slot k's previous send (flow control)
    stats_->wait_s += seconds_since(waited_from);
    for (int64_t n : rows) stats_->m2n_bytes_sent += n * row_bytes;
    Status s = dispatch_.send(k, seq(k, l), rows);
    last_return_ = std::chrono::steady_clock::now();
    return s;
  }

  Status finish(int k, int l, const kernels::cpu::RoutedBatch& r, float* results) override {
    const auto waited_from = std::chrono::steady_clock::now();
    Status s = combine_.wait(k, seq(k, l), between_polls_);
    stats_->wait_s += seconds_since(waited_from);
    if (!s.ok()) {
      if (s.code() == StatusCode::kDeadlineExceeded) {
        std::string m;
        for (int sender : combine_.missing(k)) {
          m += (m.empty() ? "" : ", ") + answering_name(sender);
        }
        return Status(StatusCode::kUnavailable,
                      "attention worker " + std::to_string(index_) + ": no answer from " + m +
                          " for layer " + std::to_string(l) + ", micro-batch " + std::to_string(k) +
                          " within " + std::to_string(c_.timeout_ms) + " ms");
      }
      return s;
    }
    // With attention-sum every shard of worker w answered with its partial
    // output: they are added here in shard order (the allreduce mode's shard 0
    // adds in the same order, so both modes give the same bits).
    const int shards = c_.tp_expert_reduce == ExpertReduce::kAttentionSum ? c_.tp_expert : 1;
    for (int w = 0; w < c_.expert_workers; ++w) {
      for (int r = 0; r < shards; ++r) {
        const auto* data = reinterpret_cast<const float*>(combine_.data(k, w * shards + r));
        for (const auto& piece : plans_[k][w]) {
          if (piece.rows == 0) continue;  // (results may be null then)
          float* dst = results + piece.send_row * hidden_;
          const float* src = data + piece.reply_row * hidden_;
          if (r == 0) {
            std::memcpy(dst, src, static_cast<size_t>(piece.rows * hidden_) * 4);
          } else {
            for (int64_t i = 0; i < piece.rows * hidden_; ++i) dst[i] += src[i];
          }
        }
      }
    }
    combine_.release(k);
    ++steps_done_[k];
    (void)r;
    last_return_ = std::chrono::steady_clock::now();
    return ok_status();
  }

 private:
  struct Piece {
    int64_t send_row, rows, reply_row;
  };
  // The combine channel's sender s: an expert worker, or one shard of it.
  std::string answering_name(int s) const {
    if (c_.tp_expert > 1 && c_.tp_expert_reduce == ExpertReduce::kAttentionSum) {
      return expert_process_name(s / c_.tp_expert, s % c_.tp_expert, c_.tp_expert);
    }
    return "expert worker " + std::to_string(s);
  }
  // Every (slot, layer) unit has its own sequence number; all workers count alike.
  uint32_t seq(int k, int /*layer*/) { return static_cast<uint32_t>(steps_done_[k]); }

  const WorkerConfig& c_;
  int index_;
  comm::M2NEndpoint& ep_;
  int64_t hidden_;
  int layers_;
  double layer_flops_;
  WorkerStats* stats_;
  std::chrono::steady_clock::time_point last_return_ = std::chrono::steady_clock::now();
  comm::M2NSender dispatch_;
  comm::M2NReceiver combine_;
  Placement placement_;
  std::vector<std::vector<int>> local_;  // experts on each expert worker
  std::vector<int64_t> expert_rows_;     // this micro-batch's rows per expert
  std::map<int, std::vector<std::vector<Piece>>> plans_;
  std::map<int, int64_t> steps_done_;
  std::function<Status()> between_polls_;
  bool discard_ = false;  // an expert worker was dropped during this step
  comm::RemoteRegion combine_region_;
};

// ---- expert worker ----

namespace {
// The placement the router sends with a rebalancing command ("prepare" to
// the expert workers, "placement" to the attention workers): valid for the
// model's `experts` and for this deployment's expert workers.
StatusOr<Placement> placement_from_router(const Json& cmd, const WorkerConfig& c, int experts) {
  MSI_ASSIGN_OR_RETURN(Placement p,
                       Placement::from_json(cmd.value("placement", Json()), experts, "router"));
  if (p.workers != c.expert_workers) {
    return invalid_argument("router: a placement for " + std::to_string(p.workers) +
                            " expert workers, not " + std::to_string(c.expert_workers));
  }
  return p;
}

// The experts an expert worker gains by a rebalance, loaded on a thread of
// their own (from the mapped checkpoint) while it serves.
struct ExpertLoad {
  std::vector<int> keep;   // the worker's experts once it switches
  std::vector<int> added;  // those of them it does not hold yet
  std::unique_ptr<model::ModelWeights> weights;
  Status status = ok_status();
  std::atomic<bool> done{false};
  std::thread thread;
  ~ExpertLoad() {
    if (thread.joinable()) thread.join();
  }
};
}  // namespace

Status run_expert_worker(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                         int in_fd, int out_fd) {
  const int tp = c.tp_expert;
  const std::string me = expert_process_name(index, tp_rank, tp);
  model::LoadOptions lo;
  lo.attention = false;
  lo.all_experts = false;
  lo.experts = c.placement.experts_on(index);
  lo.weights = c.weights;
  lo.expert_tp_rank = tp_rank;
  lo.expert_tp_size = tp;
  std::vector<int> local = lo.experts;  // changes only when the router rebalances
  if (tp > 1 && !is_cpu_device(c.expert_device)) {
    return unimplemented(me + ": --tp-expert > 1 on " + c.expert_device +
                         ": the GPU expert backend loads whole experts, not shards");
  }
  MSI_ASSIGN_OR_RETURN(
      auto w, model::ModelWeights::load(c.model_dir, host_load_options(lo, c.expert_device)));
  const ModelConfig& mc = w->config();
  MSI_ASSIGN_OR_RETURN(std::unique_ptr<ExpertCompute> runner,
                       make_expert_compute(c.expert_device, *w, local));
  MSI_ASSIGN_OR_RETURN(auto transport, make_transport(c));
  comm::M2NEndpoint ep(std::move(transport), std::chrono::milliseconds(c.timeout_ms));
  ep.set_yield_when_idle(comm::oversubscribed(comm::local_process_count(c.processes())));
  // This shard answers the attention workers unless it sends its partials to
  // shard 0 (allreduce); shard 0 then also receives them.
  const bool reduce_channel = has_reduce_channel(c);
  const bool answers = !reduce_channel || tp_rank == 0;
  const int answer_index =
      c.tp_expert_reduce == ExpertReduce::kAttentionSum ? index * tp + tp_rank : index;
  comm::M2NReceiver dispatch(shape(c, mc, 0), index * tp + tp_rank);
  std::unique_ptr<comm::M2NSender> combine, reduce_send;
  std::unique_ptr<comm::M2NReceiver> reduce_recv;
  if (answers) combine = std::make_unique<comm::M2NSender>(shape(c, mc, 1), answer_index);
  MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, dispatch.attach(ep));
  if (combine) MSI_RETURN_IF_ERROR(combine->attach(ep));
  // Attention replica a answers from (and is answered at) its rank 0.
  MSI_RETURN_IF_ERROR(
      wire(boot, ep, combine.get(), region, 0, c.attention_workers, c.tp_attention));
  if (reduce_channel) {
    comm::RemoteRegion mine = region;  // what shards > 0 publish (nobody reads it)
    if (tp_rank == 0) {
      reduce_recv = std::make_unique<comm::M2NReceiver>(reduce_shape(c, mc), 0);
      MSI_ASSIGN_OR_RETURN(mine, reduce_recv->attach(ep));
    } else {
      reduce_send = std::make_unique<comm::M2NSender>(reduce_shape(c, mc), tp_rank - 1);
      MSI_RETURN_IF_ERROR(reduce_send->attach(ep));
    }
    // Shard 0 of this worker is bootstrap rank attention_processes() + index * tp.
    MSI_RETURN_IF_ERROR(wire(boot, ep, reduce_send.get(), mine,
                             c.attention_processes() + index * tp, reduce_send ? 1 : 0));
  }
  if (c.tp_attention > 1) MSI_RETURN_IF_ERROR(wire(boot, ep, nullptr, region, 0, 0));
  // Says what this worker holds, at start and after each rebalance: a line
  // on stderr ("msinfer: <me><what>: experts ...") and `answer` to the
  // router with its memory.
  auto announce = [&](const std::string& what, Json answer) {
    std::string held;
    for (int e : local) held += " " + std::to_string(e);
    const double rss_mb = read_process_memory().rss_bytes / 1048576.0;
    const double weights_mb = w->packed_bytes() / 1048576.0;
    std::fprintf(stderr, "msinfer: %s%s: experts%s; RSS %.0f MiB (expert weights %.1f MiB)\n",
                 me.c_str(), what.c_str(), held.c_str(), rss_mb, weights_mb);
    answer["rss_mb"] = rss_mb;
    answer["weights_mb"] = weights_mb;
    write_line(out_fd, answer.dump());
  };
  announce(" ready (pid " + std::to_string(::getpid()) + ")", Json{{"ready", index}});

  const int A = c.attention_workers, M = c.micro_batches;
  const int64_t h = mc.hidden, row_bytes = h * 4;
  int64_t hdr = header_rows(static_cast<int64_t>(local.size()), row_bytes);
  std::vector<int64_t> served(M, 0);  // (slot, layer) units served per slot
  std::vector<float> in, out;
  std::string pending;
  WorkerStats stats(M, mc.layers, mc.experts);
  int64_t units = 0;  // (slot, layer) units served; every step has M * layers of them
  const double ffn_flops_per_row =
      2.0 * 3.0 * static_cast<double>(h) * static_cast<double>(mc.expert_ffn);
  // {"op": "drop_attention", "worker": a}: attention worker a died (the
  // router saw it); wait for it and answer it no more, serve the others.
  auto drop_attention = [&](const Json& cmd) -> Status {
    const int a = cmd.value("worker", -1);
    if (cmd.value("op", "") != "drop_attention" || a < 0 || a >= A) {
      return invalid_argument(me + ": unknown command " + cmd.dump());
    }
    std::fprintf(stderr, "msinfer: %s: attention worker %d is gone; serving the others\n",
                 me.c_str(), a);
    dispatch.drop_sender(a);
    if (combine) combine->drop_receiver(a);
    return ok_status();
  };
  // Online rebalancing (Router, docs/RUNTIME.md "Online rebalancing"):
  //  {"op": "routed"}: rows per (layer, expert) since the last such question
  //    (shard 0 counts), {"routed": [layer * E + e]};
  //  {"op": "prepare", "placement": P}: load the experts P gives this worker
  //    that it lacks, on a thread of their own while units go on being served,
  //    {"preparing": n};
  //  {"op": "prepared"}: {"ready": bool}, or {"error"} when the load failed;
  //  {"op": "switch"} (between steps, once every worker is ready): serve P's
  //    experts from the next unit on and free the ones P moved away,
  //    {"switched": [experts]};
  //  {"op": "abandon"}: forget a prepared placement, {"abandoned": true}.
  std::vector<int64_t> routed_since(static_cast<size_t>(mc.layers) * mc.experts, 0);
  std::unique_ptr<ExpertLoad> loading;
  auto rebalance_command = [&](const Json& cmd) -> Status {
    const std::string op = cmd.value("op", "");
    auto answer_error = [&](const std::string& m) {
      write_line(out_fd, Json{{"error", me + ": " + m}}.dump());
      return ok_status();
    };
    if (op == "routed") {
      write_line(out_fd, Json{{"routed", routed_since}}.dump());
      std::fill(routed_since.begin(), routed_since.end(), 0);
      return ok_status();
    }
    if (op == "prepare") {
      if (!is_cpu_device(c.expert_device)) {
        return answer_error("online rebalancing runs on CPU expert workers only");
      }
      if (loading) return answer_error("a rebalance is already being prepared");
      auto p = placement_from_router(cmd, c, static_cast<int>(mc.experts));
      if (!p.ok()) return answer_error(p.status().message());
      loading = std::make_unique<ExpertLoad>();
      loading->keep = p->experts_on(index);
      for (int e : loading->keep) {
        if (std::find(local.begin(), local.end(), e) == local.end()) loading->added.push_back(e);
      }
      if (loading->added.empty()) {
        loading->done = true;
      } else {
        model::LoadOptions more = lo;
        more.experts = loading->added;
        loading->thread = std::thread([dir = c.model_dir, more, l = loading.get()] {
          auto loaded = model::ModelWeights::load(dir, more);
          if (loaded.ok()) {
            l->weights = std::move(loaded).value();
          } else {
            l->status = loaded.status();
          }
          l->done = true;
        });
      }
      write_line(out_fd, Json{{"preparing", loading->added.size()}}.dump());
      return ok_status();
    }
    if (op == "prepared") {
      if (!loading) return answer_error("no rebalance is being prepared");
      if (loading->done && !loading->status.ok()) {
        const std::string m = "loading experts: " + loading->status.message();
        loading.reset();
        return answer_error(m);
      }
      write_line(out_fd, Json{{"ready", loading->done.load()}}.dump());
      return ok_status();
    }
    if (op == "abandon") {
      loading.reset();  // waits for a load still running
      write_line(out_fd, Json{{"abandoned", true}}.dump());
      return ok_status();
    }
    if (op == "units") {
      // A replacement joining a running deployment (Router, --respawn): the
      // (micro-batch, layer) units each slot has served so far, which the
      // sequence numbers continue from. Before its first unit only.
      const auto n = cmd.value("served", std::vector<int64_t>{});
      if (units != 0 || n.size() != served.size()) {
        return answer_error("units: expected " + std::to_string(served.size()) +
                            " counts before the first unit");
      }
      served = n;
      units = n.empty() ? 0 : n[0] * M;
      write_line(out_fd, Json{{"units_set", true}}.dump());
      return ok_status();
    }
    if (op == "switch") {
      if (!loading || !loading->done || !loading->status.ok()) {
        return answer_error("switch before the new experts were loaded");
      }
      if (loading->thread.joinable()) loading->thread.join();
      w->replace_experts(loading->weights.get(), loading->keep);
      local = loading->keep;
      hdr = header_rows(static_cast<int64_t>(local.size()), row_bytes);
      loading.reset();
      announce(": rebalanced", Json{{"switched", local}});
      return ok_status();
    }
    return drop_attention(cmd);
  };
  auto handle_commands = [&] {
    return answer_router_commands(in_fd, out_fd, &pending, &stats, "expert worker",
                                  rebalance_command);
  };
  int64_t idle = 0, rounds = 0;
  int64_t idle_since_ns = wall_ns();  // when the last unit's work ended
  while (true) {
    if (idle > 64 || (++rounds & 1023) == 0) {
      MSI_ASSIGN_OR_RETURN(bool stop, handle_commands());
      if (stop) return ok_status();
    }
    size_t got = 0;
    MSI_RETURN_IF_ERROR(ep.progress(&got));
    bool worked = false;
    for (int k = 0; k < M; ++k) {
      if (!dispatch.all_arrived(k)) continue;
      const auto unit_from = std::chrono::steady_clock::now();
      const int64_t seen_ns = wall_ns();
      const uint32_t seq = static_cast<uint32_t>(served[k]);
      MSI_RETURN_IF_ERROR(dispatch.verify(k, seq));
      const int layer = static_cast<int>(served[k] % mc.layers);
      if (units++ % (static_cast<int64_t>(M) * mc.layers) == 0) stats.routed.begin_step();
      int64_t last_sent_ns = 0;
      for (int a = 0; a < A; ++a) {
        if (dispatch.dropped(a)) continue;
        int64_t t = 0;
        std::memcpy(&t, dispatch.data(k, a) + hdr * row_bytes - 8, 8);
        last_sent_ns = std::max(last_sent_ns, t);
      }
      // A transfer time only when the last message was sent while this worker
      // was polling: if it arrived during another unit's compute, seen - sent
      // is mostly queueing (the worker progresses the fabric between units).
      if (last_sent_ns >= idle_since_ns) {
        stats.t_c.add(k, layer, std::max<int64_t>(0, seen_ns - last_sent_ns) * 1e-9);
      }
      if (combine) MSI_RETURN_IF_ERROR(combine->wait_sent(k));
      if (reduce_send) MSI_RETURN_IF_ERROR(reduce_send->wait_sent(k));
      // Where the outputs go: the answer to each attention worker, or (a shard
      // > 0 under allreduce) one message to shard 0 with every attention
      // worker's answer rows, concatenated in attention-worker order.
      std::vector<int64_t> reply_rows(A, 0), reply_base(A, 0);
      int64_t reply_total = 0;
      for (int a = 0; a < A; ++a) {
        if (dispatch.dropped(a)) continue;  // nothing from it, nothing to it
        reply_rows[a] = dispatch.rows(k, a) - hdr;
        if (reply_rows[a] < 0) {
          return internal_error(me + ": malformed message from attention worker " +
                                std::to_string(a));
        }
        reply_base[a] = reply_total;
        reply_total += reply_rows[a];
      }
      if (reduce_send && reply_total > reduce_send->shape().max_rows) {
        return resource_exhausted(me + ": " + std::to_string(reply_total) +
                                  " rows exceed one reduce message");
      }
      auto reply_at = [&](int a, int64_t row) -> uint8_t* {
        return combine ? combine->buffer(k, a) + row * row_bytes
                       : reduce_send->buffer(k, 0) + (reply_base[a] + row) * row_bytes;
      };
      // Per local expert: gather its rows from every attention worker, run the
      // FFN once, scatter the outputs into each sender's answer.
      std::vector<int64_t> cursor(A, hdr);
      for (size_t i = 0; i < local.size(); ++i) {
        int64_t total = 0;
        std::vector<int32_t> n(A);
        for (int a = 0; a < A; ++a) {
          if (dispatch.dropped(a)) {
            n[a] = 0;
            continue;
          }
          std::memcpy(&n[a], dispatch.data(k, a) + i * 4, 4);
          if (n[a] < 0 || cursor[a] + n[a] > dispatch.rows(k, a)) {
            return internal_error(me + ": malformed message from attention worker " +
                                  std::to_string(a));
          }
          total += n[a];
        }
        if (total == 0) continue;
        in.resize(total * h);
        out.resize(total * h);
        int64_t at = 0;
        for (int a = 0; a < A; ++a) {
          std::memcpy(in.data() + at * h, dispatch.data(k, a) + cursor[a] * row_bytes,
                      static_cast<size_t>(n[a] * row_bytes));
          at += n[a];
        }
        MSI_RETURN_IF_ERROR(
            runner->forward_group(layer, {local[i]}, {0, total}, in.data(), out.data()));
        stats.gemm_flops += ffn_flops_per_row * static_cast<double>(total) / tp;
        // Rows are counted once per expert worker: by shard 0.
        if (tp_rank == 0) {
          stats.tokens += total;
          stats.expert_tokens[local[i]] += total;
          stats.routed.add(layer, local[i], total);
          routed_since[static_cast<size_t>(layer) * mc.experts + local[i]] += total;
        }
        at = 0;
        for (int a = 0; a < A; ++a) {
          std::memcpy(reply_at(a, cursor[a] - hdr), out.data() + at * h,
                      static_cast<size_t>(n[a] * row_bytes));
          at += n[a];
          cursor[a] += n[a];
        }
      }
      if (reduce_send) {
        stats.tp_reduce_bytes_sent += reply_total * row_bytes;
        MSI_RETURN_IF_ERROR(reduce_send->send(k, seq, {reply_total}));
      } else {
        if (reduce_recv) {
          // Shard 0: add the other shards' partials, in shard order.
          Status s = reduce_recv->wait(k, seq);
          if (s.code() == StatusCode::kDeadlineExceeded) {
            std::string m;
            for (int r : reduce_recv->missing(k)) {
              m += (m.empty() ? "" : ", ") + expert_process_name(index, r + 1, tp);
            }
            return Status(StatusCode::kUnavailable, me + ": no partial output from " + m +
                                                        " within " + std::to_string(c.timeout_ms) +
                                                        " ms");
          }
          MSI_RETURN_IF_ERROR(s);
          for (int r = 0; r + 1 < tp; ++r) {
            if (reduce_recv->rows(k, r) != reply_total) {
              return internal_error(me + ": " + expert_process_name(index, r + 1, tp) + " sent " +
                                    std::to_string(reduce_recv->rows(k, r)) + " rows, expected " +
                                    std::to_string(reply_total));
            }
            const auto* part = reinterpret_cast<const float*>(reduce_recv->data(k, r));
            for (int a = 0; a < A; ++a) {
              auto* dst = reinterpret_cast<float*>(combine->buffer(k, a));
              const float* src = part + reply_base[a] * h;
              for (int64_t x = 0; x < reply_rows[a] * h; ++x) dst[x] += src[x];
            }
          }
          reduce_recv->release(k);
        }
        stats.m2n_bytes_sent += reply_total * row_bytes;
        MSI_RETURN_IF_ERROR(combine->send(k, seq, reply_rows));
      }
      dispatch.release(k);
      const double unit_s = seconds_since(unit_from);
      stats.t_e.add(k, layer, unit_s);
      stats.busy_s += unit_s;
      idle_since_ns = wall_ns();
      ++served[k];
      worked = true;
    }
    // Idle: yield where the host is oversubscribed, else spin (ep.relax);
    // after 2000 empty polls sleep 0.2 ms; once idle for 50 ms (the
    // deployment has no work, not a gap between units) sleep 2 ms, so an idle
    // deployment costs next to no CPU and the first unit after it is at most
    // 2 ms late.
    if (worked || got > 0) {
      idle = 0;
    } else if (++idle > 2000) {
      idle_pause(idle_since_ns);
    } else {
      ep.relax(idle);
    }
  }
}

// ---- attention tensor parallelism ----

namespace {

// Rank 0's side of the replica's tp channels (the format above tp_broadcast_shape).
class AttentionTpLeader : public AttentionPeers {
 public:
  AttentionTpLeader(const WorkerConfig& c, const ModelConfig& mc, int index, WorkerStats* stats,
                    comm::M2NEndpoint& ep)
      : c_(c),
        index_(index),
        hidden_(mc.hidden),
        stats_(stats),
        ep_(ep),
        broadcast_(tp_broadcast_shape(c, mc), 0),
        partials_(tp_partial_shape(c, mc), 0) {}

  // Third allgather of the deployment (after the experts' wiring).
  Status attach(comm::Bootstrap& boot) {
    MSI_RETURN_IF_ERROR(broadcast_.attach(ep_));
    MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, partials_.attach(ep_));
    return wire(boot, ep_, &broadcast_, region, index_ * c_.tp_attention + 1, c_.tp_attention - 1);
  }

  Status start(int l, const TokenBatch& b, const float* h) override {
    const int64_t T = b.size(), row_bytes = hidden_ * 4;
    MSI_RETURN_IF_ERROR(broadcast_.wait_sent(0));
    words_.assign({l, static_cast<int32_t>(T), 0});
    for (int64_t t = 0; t < T; ++t) {
      const int32_t pos = b.positions[t];
      const int32_t n = static_cast<int32_t>(pos / KvCache::kDefaultBlockSize + 1);
      words_.push_back(pos);
      words_.push_back(n);
      words_.insert(words_.end(), b.block_tables[t], b.block_tables[t] + n);
    }
    const int64_t hdr = (static_cast<int64_t>(words_.size()) * 4 + row_bytes - 1) / row_bytes;
    words_[2] = static_cast<int32_t>(hdr);
    if (hdr + T > broadcast_.shape().max_rows) {
      return resource_exhausted(attention_process_name(index_, 0, c_.tp_attention) + ": " +
                                std::to_string(hdr + T) + " rows exceed one tp message");
    }
    uint8_t* buf = broadcast_.buffer(0, 0);
    std::memset(buf, 0, static_cast<size_t>(hdr * row_bytes));
    std::memcpy(buf, words_.data(), words_.size() * 4);
    std::memcpy(buf + hdr * row_bytes, h, static_cast<size_t>(T * row_bytes));
    for (int r = 1; r + 1 < c_.tp_attention; ++r) {
      std::memcpy(broadcast_.buffer(0, r), buf, static_cast<size_t>((hdr + T) * row_bytes));
    }
    stats_->tp_reduce_bytes_sent += (hdr + T) * row_bytes * (c_.tp_attention - 1);
    return broadcast_.send(0, seq_, std::vector<int64_t>(c_.tp_attention - 1, hdr + T));
  }

  Status add_partials(int l, int64_t T, float* o) override {
    Status s = partials_.wait(0, seq_);
    if (s.code() == StatusCode::kDeadlineExceeded) {
      std::string m;
      for (int r : partials_.missing(0)) {
        m += (m.empty() ? "" : ", ") + attention_process_name(index_, r + 1, c_.tp_attention);
      }
      return Status(StatusCode::kUnavailable, attention_process_name(index_, 0, c_.tp_attention) +
                                                  ": no partial attention output from " + m +
                                                  " for layer " + std::to_string(l) + " within " +
                                                  std::to_string(c_.timeout_ms) + " ms");
    }
    MSI_RETURN_IF_ERROR(s);
    for (int r = 0; r + 1 < c_.tp_attention; ++r) {
      if (partials_.rows(0, r) != T) {
        return internal_error(attention_process_name(index_, r + 1, c_.tp_attention) + " sent " +
                              std::to_string(partials_.rows(0, r)) + " rows, expected " +
                              std::to_string(T));
      }
      const auto* p = reinterpret_cast<const float*>(partials_.data(0, r));
      for (int64_t i = 0; i < T * hidden_; ++i) o[i] += p[i];
    }
    partials_.release(0);
    ++seq_;
    return ok_status();
  }

 private:
  const WorkerConfig& c_;
  int index_;
  int64_t hidden_;
  WorkerStats* stats_;
  comm::M2NEndpoint& ep_;
  comm::M2NSender broadcast_;
  comm::M2NReceiver partials_;
  uint32_t seq_ = 0;
  std::vector<int32_t> words_;
};

// Ranks 1..tp-1 of attention replica `index`: serve rank 0's layers until
// the router says exit (or closes the command channel).
Status run_attention_tp_rank(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                             int in_fd, int out_fd) {
  const int tp = c.tp_attention;
  const std::string me = attention_process_name(index, tp_rank, tp);
  model::LoadOptions lo;
  lo.all_experts = false;
  lo.weights = c.weights;
  lo.attention_tp_rank = tp_rank;
  lo.attention_tp_size = tp;
  MSI_ASSIGN_OR_RETURN(auto w, model::ModelWeights::load(c.model_dir, lo));
  const ModelConfig& mc = w->config();
  MSI_ASSIGN_OR_RETURN(KvCache kv, KvCache::create(attention_tp_config(*w), c.kv_cache_bytes));
  AttentionRunner runner(*w);
  MSI_ASSIGN_OR_RETURN(auto transport, make_transport(c));
  comm::M2NEndpoint ep(std::move(transport), std::chrono::milliseconds(c.timeout_ms));
  ep.set_yield_when_idle(comm::oversubscribed(comm::local_process_count(c.processes())));
  comm::M2NReceiver broadcast(tp_broadcast_shape(c, mc), tp_rank - 1);
  comm::M2NSender partial(tp_partial_shape(c, mc), tp_rank - 1);
  MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, broadcast.attach(ep));
  MSI_RETURN_IF_ERROR(partial.attach(ep));
  // The deployment's allgathers, in order: the experts' wiring (a card
  // nobody reads), the expert shards' reduce channel, then this replica's.
  MSI_RETURN_IF_ERROR(wire(boot, ep, nullptr, region, 0, 0));
  if (has_reduce_channel(c)) MSI_RETURN_IF_ERROR(wire(boot, ep, nullptr, region, 0, 0));
  MSI_RETURN_IF_ERROR(wire(boot, ep, &partial, region, index * tp, 1));
  std::fprintf(
      stderr, "msinfer: %s ready (pid %d): heads %d..%d; RSS %.0f MiB (weights %.1f MiB)\n",
      me.c_str(), ::getpid(), tp_rank * (mc.heads / tp), (tp_rank + 1) * (mc.heads / tp) - 1,
      read_process_memory().rss_bytes / 1048576.0, w->packed_bytes() / 1048576.0);
  write_line(out_fd, Json{{"ready", index},
                          {"rss_mb", read_process_memory().rss_bytes / 1048576.0},
                          {"weights_mb", w->packed_bytes() / 1048576.0}}
                         .dump());

  const int64_t h = mc.hidden, row_bytes = h * 4;
  WorkerStats stats(c.micro_batches, mc.layers);
  std::string pending;
  auto handle_commands = [&] {
    return answer_router_commands(in_fd, out_fd, &pending, &stats, me);
  };
  auto malformed = [&](const std::string& what) {
    return internal_error(me + ": malformed message from " + attention_process_name(index, 0, tp) +
                          ": " + what);
  };
  TokenBatch b;
  std::vector<std::vector<int32_t>> tables;
  uint32_t seq = 0;
  int64_t idle = 0, rounds = 0, idle_since_ns = wall_ns();
  while (true) {
    if (idle > 64 || (++rounds & 1023) == 0) {
      MSI_ASSIGN_OR_RETURN(bool stop, handle_commands());
      if (stop) return ok_status();
    }
    size_t got = 0;
    MSI_RETURN_IF_ERROR(ep.progress(&got));
    if (broadcast.all_arrived(0)) {
      const auto unit_from = std::chrono::steady_clock::now();
      MSI_RETURN_IF_ERROR(broadcast.verify(0, seq));
      const uint8_t* msg = broadcast.data(0, 0);
      const int64_t rows = broadcast.rows(0, 0);
      auto word = [&](int64_t i) {
        int32_t v;
        std::memcpy(&v, msg + i * 4, 4);
        return v;
      };
      if (rows < 1 || rows * row_bytes < 12) return malformed("no header");
      const int32_t layer = word(0), T = word(1), hdr = word(2);
      if (layer < 0 || layer >= mc.layers || T < 1 || hdr < 1 || hdr + int64_t{T} != rows) {
        return malformed("bad header");
      }
      b.clear();
      tables.assign(static_cast<size_t>(T), {});
      int64_t at = 3;
      const int64_t words = hdr * row_bytes / 4;
      for (int32_t t = 0; t < T; ++t) {
        if (at + 2 > words) return malformed("header too short");
        const int32_t pos = word(at), n = word(at + 1);
        at += 2;
        if (pos < 0 || pos >= mc.max_position_embeddings ||
            n != pos / KvCache::kDefaultBlockSize + 1 || at + n > words) {
          return malformed("bad position or block table");
        }
        for (int32_t i = 0; i < n; ++i) {
          const int32_t blk = word(at + i);
          if (blk < 0 || blk >= kv.total_blocks()) return malformed("block id out of range");
          tables[t].push_back(blk);
        }
        at += n;
        b.ids.push_back(0);  // unused: rank 0 embeds
        b.positions.push_back(pos);
        b.block_tables.push_back(tables[t].data());
      }
      MSI_RETURN_IF_ERROR(partial.wait_sent(0));
      MSI_RETURN_IF_ERROR(runner.attention_partial(
          layer, b, kv, reinterpret_cast<const float*>(msg + hdr * row_bytes),
          reinterpret_cast<float*>(partial.buffer(0, 0))));
      broadcast.release(0);
      stats.tokens += layer == 0 ? T : 0;
      stats.tp_reduce_bytes_sent += T * row_bytes;
      MSI_RETURN_IF_ERROR(partial.send(0, seq, {T}));
      ++seq;
      stats.busy_s += seconds_since(unit_from);
      idle_since_ns = wall_ns();
      idle = 0;
      continue;
    }
    if (got > 0) {
      idle = 0;
    } else if (++idle > 2000) {
      idle_pause(idle_since_ns);
    } else {
      ep.relax(idle);
    }
  }
}

}  // namespace

// ---- attention worker ----

Status run_attention_worker(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                            int in_fd, int out_fd) {
  if (c.tp_attention > 1 && !is_cpu_device(c.attention_device)) {
    return unimplemented(attention_process_name(index, tp_rank, c.tp_attention) +
                         ": --tp-attention > 1 on " + c.attention_device +
                         ": attention tensor parallelism runs on the CPU only");
  }
  if (tp_rank > 0) return run_attention_tp_rank(c, index, tp_rank, boot, in_fd, out_fd);
  model::LoadOptions lo;
  lo.all_experts = false;  // attention workers map no expert weights
  lo.weights = c.weights;
  lo.attention_tp_size = c.tp_attention;
  MSI_ASSIGN_OR_RETURN(
      auto w, model::ModelWeights::load(c.model_dir, host_load_options(lo, c.attention_device)));
  std::shared_ptr<const model::ModelWeights> weights = std::move(w);
  MSI_ASSIGN_OR_RETURN(auto transport, make_transport(c));
  comm::M2NEndpoint ep(std::move(transport), std::chrono::milliseconds(c.timeout_ms));
  ep.set_yield_when_idle(comm::oversubscribed(comm::local_process_count(c.processes())));
  WorkerStats stats(c.micro_batches, weights->config().layers);
  auto remote = std::make_unique<RemoteExperts>(c, weights->config(), index, ep, &stats);
  MSI_RETURN_IF_ERROR(remote->attach(boot));
  RemoteExperts* experts = remote.get();  // the engine owns it
  std::unique_ptr<AttentionTpLeader> peers;
  if (c.tp_attention > 1) {
    peers = std::make_unique<AttentionTpLeader>(c, weights->config(), index, &stats, ep);
    MSI_RETURN_IF_ERROR(peers->attach(boot));
  }
  EngineOptions eo;
  eo.attention_peers = peers.get();
  eo.kv_cache_bytes = c.kv_cache_bytes;
  eo.micro_batches = c.micro_batches;
  eo.max_step_tokens = c.max_step_tokens;
  eo.step_when_idle = true;
  eo.device = c.attention_device;
  eo.attention_cost_per_token = c.attention_cost_per_token;
  eo.attention_cost_per_position = c.attention_cost_per_position;
  MSI_ASSIGN_OR_RETURN(auto engine, Engine::create(weights, eo, std::move(remote)));
  write_line(out_fd, Json{{"ready", index},
                          {"rss_mb", read_process_memory().rss_bytes / 1048576.0},
                          {"weights_mb", weights->packed_bytes() / 1048576.0}}
                         .dump());
  std::string line, pending;
  // {"op": "drop_expert", "worker": w} (no answer): expert worker w died and
  // its experts have replicas. Read between steps, or mid-step while waiting
  // for the expert workers (then the step is run again). An exit read
  // mid-step ends the step and the worker (the router is stopping the
  // deployment, perhaps because an expert worker died without replicas);
  // other commands read mid-step wait for the step's end.
  std::deque<std::string> deferred;
  bool exit_mid_step = false;
  auto drop_expert = [&](const Json& cmd, bool mid_step) -> Status {
    const int w = cmd.value("worker", -1);
    const bool keep = cmd.value("keep_placement", false);
    MSI_RETURN_IF_ERROR(experts->drop_expert_worker(w, mid_step, keep));
    std::fprintf(stderr, "msinfer: attention worker %d: expert worker %d is gone; %s%s\n", index, w,
                 keep ? "waiting for its replacement" : "its experts' rows go to their replicas",
                 mid_step ? " (the step in flight runs again)" : "");
    return ok_status();
  };
  experts->set_between_polls([&]() -> Status {
    std::string l;
    while (read_line(in_fd, &pending, &l, 0)) {
      auto cmd = parse_json(l, "attention worker command");
      const std::string op = cmd.ok() ? cmd->value("op", "") : "";
      if (op == "drop_expert") {
        MSI_RETURN_IF_ERROR(drop_expert(*cmd, /*mid_step=*/true));
      } else if (op == "exit") {
        exit_mid_step = true;
        return unavailable("the router asked the worker to exit");
      } else {
        deferred.push_back(std::move(l));
      }
    }
    return ok_status();
  });
  auto next_command = [&] {
    if (deferred.empty()) return read_line(in_fd, &pending, &line, /*timeout_ms=*/-1);
    line = std::move(deferred.front());
    deferred.pop_front();
    return true;
  };
  while (next_command()) {
    auto cmd = parse_json(line, "attention worker command");
    if (!cmd.ok()) return cmd.status();
    const std::string op = cmd->value("op", "");
    if (op == "exit") return ok_status();
    if (op == "drop_expert") {
      MSI_RETURN_IF_ERROR(drop_expert(*cmd, /*mid_step=*/false));
      continue;
    }
    // A replacement expert worker joins (Router, --respawn): {"op": "card"}
    // gives it this worker's combine card (hex) and unit counts;
    // {"op": "add_expert", "worker": w, "card": hex, "shares": [[e, share]]}
    // routes to it from the next step on.
    if (op == "card") {
      write_line(
          out_fd,
          Json{{"card", internal::to_hex(experts->card())}, {"units", experts->units()}}.dump());
      continue;
    }
    if (op == "add_expert") {
      const int w = cmd->value("worker", -1);
      std::string blob;
      Status s = internal::from_hex(cmd->value("card", std::string()), &blob)
                     ? ok_status()
                     : invalid_argument("add_expert: the card is not hex");
      if (s.ok()) {
        auto card = comm::PeerCard::decode(blob, "expert worker " + std::to_string(w));
        s = card.ok() ? experts->add_expert_worker(
                            w, *card, cmd->value("shares", std::vector<std::pair<int, double>>{}))
                      : card.status();
      }
      if (!s.ok()) {
        write_line(out_fd, Json{{"error", s.message()}}.dump());
        return s;
      }
      std::fprintf(stderr, "msinfer: attention worker %d: expert worker %d is back\n", index, w);
      write_line(out_fd, Json{{"expert_added", w}}.dump());
      continue;
    }
    if (op == "add") {
      GenerationRequest r;
      r.id = cmd->value("id", 0);
      r.prompt = cmd->value("prompt", std::vector<int32_t>{});
      SamplingParams& sp = r.sampling;
      sp.max_tokens = cmd->value("max_tokens", 16);
      sp.temperature = cmd->value("temperature", 0.0f);
      sp.top_k = cmd->value("top_k", 0);
      sp.top_p = cmd->value("top_p", 1.0f);
      sp.seed = cmd->value("seed", uint64_t{0});
      sp.ignore_eos = cmd->value("ignore_eos", false);
      sp.stop_token_ids = cmd->value("stop_token_ids", std::vector<int32_t>{});
      sp.frequency_penalty = cmd->value("frequency_penalty", 0.0f);
      sp.presence_penalty = cmd->value("presence_penalty", 0.0f);
      sp.min_p = cmd->value("min_p", 0.0f);
      sp.repetition_penalty = cmd->value("repetition_penalty", 1.0f);
      sp.min_tokens = cmd->value("min_tokens", 0);
      sp.logprobs = cmd->value("logprobs", -1);
      Status s = engine->add(r);
      write_line(out_fd, s.ok() ? Json{{"added", r.id}}.dump()
                                : Json{{"refused", r.id}, {"error", s.message()}}.dump());
      continue;
    }
    if (op == "placement") {
      // Online rebalancing: the expert workers have switched; route by the
      // new placement from the next step on.
      auto p = placement_from_router(*cmd, c, static_cast<int>(weights->config().experts));
      if (!p.ok()) {
        write_line(out_fd, Json{{"error", p.status().message()}}.dump());
        return p.status();
      }
      experts->set_placement(*p);
      write_line(out_fd, Json{{"placement_set", true}}.dump());
      continue;
    }
    if (op == "cancel") {
      const bool found = engine->cancel(cmd->value("id", int64_t{0}));
      write_line(out_fd, Json{{"cancelled", found}, {"kv_usage", engine->kv_usage()}}.dump());
      continue;
    }
    if (op == "stats") {
      Json st = stats.to_json();
      st["micro_batch_balance"] = engine->micro_batch_balance();
      write_line(out_fd, Json{{"stats", st}}.dump());
      if (cmd->value("reset", false)) stats.reset();
      continue;
    }
    if (op == "step") {
      const auto step_from = std::chrono::steady_clock::now();
      const double wait_before = stats.wait_s;
      auto events = engine->step();
      stats.busy_s += seconds_since(step_from) - (stats.wait_s - wait_before);
      if (!events.ok()) {
        if (exit_mid_step) return ok_status();
        write_line(out_fd, Json{{"error", events.status().message()}}.dump());
        return events.status();
      }
      Json ev = Json::array();
      for (const auto& e : *events) {
        Json je{{"id", e.request_id},
                {"token", e.token},
                {"finished", e.finished},
                {"reason", e.finish_reason}};
        if (!e.top_logprobs.empty() || e.logprob != 0.f) {
          je["logprob"] = e.logprob;
          je["top"] = e.top_logprobs;
        }
        ev.push_back(std::move(je));
      }
      Json answer{{"events", ev},
                  {"running", engine->running() + engine->waiting()},
                  {"kv_usage", engine->kv_usage()},
                  {"preemptions", engine->preemptions()}};
      if (experts->discard_step()) answer["discarded"] = true;
      write_line(out_fd, answer.dump());
      continue;
    }
    return invalid_argument("attention worker: unknown command '" + op + "'");
  }
  return ok_status();  // the router closed the pipe
}

}  // namespace msinfer::runtime
