// An expert process of a disaggregated deployment (docs/RUNTIME.md): serves
// (micro-batch slot, layer) units as soon as every attention worker's message
// for them arrived, and answers the router's control commands between units.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "internal/worker_common.h"
#include "msinfer/core/process.h"
#include "msinfer/runtime/device_backend.h"

namespace msinfer::runtime {
namespace {

using internal::header_rows;
using internal::seconds_since;
using internal::wall_ns;

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

// One expert process: shard `tp_rank` of expert worker `index`. Single
// threaded but for an ExpertLoad's thread; run() returns when the router says
// Exit or closes the channel.
class ExpertWorker {
 public:
  ExpertWorker(const WorkerConfig& c, int index, int tp_rank, int in_fd, int out_fd)
      : c_(c),
        index_(index),
        tp_rank_(tp_rank),
        tp_(c.tp_expert),
        me_(expert_process_name(index, tp_rank, c.tp_expert)),
        channel_(in_fd, out_fd, me_) {}

  Status run(comm::Bootstrap& boot) {
    MSI_RETURN_IF_ERROR(load());
    MSI_RETURN_IF_ERROR(connect(boot));
    announce(" ready (pid " + std::to_string(::getpid()) + ")", control::Ready::of(index_));
    return serve();
  }

 private:
  // Where a unit's outputs go: the answer to each attention worker, or (a
  // shard > 0 under allreduce) one message to shard 0 with every attention
  // worker's answer rows, concatenated in attention-worker order.
  struct Replies {
    std::vector<int64_t> rows, base;
    int64_t total = 0;
  };

  Status load();
  Status connect(comm::Bootstrap& boot);
  Status serve();
  // Serves slot k's unit if every message for it arrived; *served says so.
  Status serve_unit(int k, bool* served);
  void note_transfer_time(int k, int layer, int64_t seen_ns, int64_t idle_since_ns);
  StatusOr<Replies> plan_replies(int k);
  Status compute_experts(int k, int layer, const Replies& replies);
  Status answer(int k, uint32_t seq, const Replies& replies);
  // Shard 0 under allreduce: adds the other shards' partials, in shard order.
  Status add_partials(int k, uint32_t seq, const Replies& replies);
  uint8_t* reply_at(int k, const Replies& replies, int a, int64_t row);
  // Says what this worker holds, at start and after each rebalance: a line
  // on stderr and `answer` (Ready or Switched, with its memory) to the router.
  void announce(const std::string& what, control::Event answer);
  // Commands other than GetStats and Exit (online rebalancing, a dead
  // attention worker, a replacement's unit counts).
  Status command(control::Command& cmd);
  void prepare(const Placement& p);
  void switch_experts();
  Status malformed(int a) const {
    return internal_error(me_ + ": malformed message from attention worker " + std::to_string(a));
  }

  const WorkerConfig& c_;
  const int index_, tp_rank_, tp_;
  const std::string me_;
  control::WorkerChannel channel_;
  model::LoadOptions lo_;
  std::unique_ptr<model::ModelWeights> w_;
  const ModelConfig* mc_ = nullptr;
  std::unique_ptr<ExpertCompute> runner_;
  std::vector<int> local_;  // changes only when the router rebalances
  // --shared-experts expert (internal::shared_experts_remote): each message
  // carries one more count, the rows of the shared experts (expert id
  // mc_->experts to the runner), which this worker holds for the layers
  // shared_expert_worker() gives it.
  bool shared_ = false;
  int64_t counts() const { return static_cast<int64_t>(local_.size()) + (shared_ ? 1 : 0); }
  int64_t hdr_ = 0, h_ = 0, row_bytes_ = 0;
  std::unique_ptr<comm::M2NEndpoint> ep_;
  std::unique_ptr<comm::M2NReceiver> dispatch_;
  std::unique_ptr<comm::M2NSender> combine_, reduce_send_;
  std::unique_ptr<comm::M2NReceiver> reduce_recv_;
  std::unique_ptr<WorkerStats> stats_;
  std::string card_;  // its dispatch region (comm::PeerCard), for a replacement attention worker
  std::vector<int64_t> served_;  // (slot, layer) units served per slot
  int64_t units_ = 0;            // (slot, layer) units served; a step has M * layers
  std::vector<float> in_, out_;
  double ffn_flops_per_row_ = 0;
  // Rows per (layer, expert) since the router last asked (GetRouted).
  std::vector<int64_t> routed_since_;
  std::unique_ptr<ExpertLoad> loading_;
};

Status ExpertWorker::load() {
  lo_.attention = false;
  lo_.all_experts = false;
  lo_.experts = c_.placement.experts_on(index_);
  lo_.weights = c_.weights;
  lo_.expert_tp_rank = tp_rank_;
  lo_.expert_tp_size = tp_;
  local_ = lo_.experts;
  {
    MSI_ASSIGN_OR_RETURN(ModelConfig mc, load_model_config(c_.model_dir));
    shared_ = internal::shared_experts_remote(c_, mc);
    if (shared_) {
      for (int l = 0; l < mc.layers; ++l) {
        if (mc.is_moe_layer(l) && shared_expert_worker(l, c_.expert_workers) == index_) {
          lo_.shared_expert_layers.push_back(l);
        }
      }
    }
  }
  if (tp_ > 1 && !is_cpu_device(c_.expert_device)) {
    return unimplemented(me_ + ": --tp-expert > 1 on " + c_.expert_device +
                         ": the GPU expert backend loads whole experts, not shards");
  }
  MSI_ASSIGN_OR_RETURN(
      w_, model::ModelWeights::load(c_.model_dir, host_load_options(lo_, c_.expert_device)));
  mc_ = &w_->config();
  MSI_ASSIGN_OR_RETURN(runner_, make_expert_compute(c_.expert_device, *w_, local_));
  h_ = mc_->hidden;
  row_bytes_ = h_ * 4;
  hdr_ = header_rows(counts(), row_bytes_);
  served_.assign(static_cast<size_t>(c_.engine.micro_batches), 0);
  stats_ = std::make_unique<WorkerStats>(c_.engine.micro_batches, mc_->layers, mc_->experts);
  ffn_flops_per_row_ = 2.0 * 3.0 * static_cast<double>(h_) * static_cast<double>(mc_->expert_ffn);
  routed_since_.assign(static_cast<size_t>(mc_->layers) * mc_->experts, 0);
  return ok_status();
}

Status ExpertWorker::connect(comm::Bootstrap& boot) {
  const ModelConfig& mc = *mc_;
  MSI_ASSIGN_OR_RETURN(auto transport, internal::make_transport(c_));
  ep_ = std::make_unique<comm::M2NEndpoint>(std::move(transport),
                                            std::chrono::milliseconds(c_.timeout_ms));
  ep_->set_yield_when_idle(comm::oversubscribed(comm::local_process_count(c_.processes())));
  // This shard answers the attention workers unless it sends its partials to
  // shard 0 (allreduce); shard 0 then also receives them.
  const bool reduce_channel = internal::has_reduce_channel(c_);
  const bool answers = !reduce_channel || tp_rank_ == 0;
  const int answer_index =
      c_.tp_expert_reduce == ExpertReduce::kAttentionSum ? index_ * tp_ + tp_rank_ : index_;
  dispatch_ =
      std::make_unique<comm::M2NReceiver>(internal::shape(c_, mc, 0), index_ * tp_ + tp_rank_);
  if (answers) {
    combine_ = std::make_unique<comm::M2NSender>(internal::shape(c_, mc, 1), answer_index);
  }
  MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, dispatch_->attach(*ep_));
  card_ = comm::PeerCard{ep_->transport().address(), region}.encode();
  if (combine_) MSI_RETURN_IF_ERROR(combine_->attach(*ep_));
  // Attention replica a answers from (and is answered at) its rank 0.
  MSI_RETURN_IF_ERROR(
      internal::wire(boot, *ep_, combine_.get(), region, 0, c_.attention_workers, c_.tp_attention));
  if (reduce_channel) {
    comm::RemoteRegion mine = region;  // what shards > 0 publish (nobody reads it)
    if (tp_rank_ == 0) {
      reduce_recv_ = std::make_unique<comm::M2NReceiver>(internal::reduce_shape(c_, mc), 0);
      MSI_ASSIGN_OR_RETURN(mine, reduce_recv_->attach(*ep_));
    } else {
      reduce_send_ =
          std::make_unique<comm::M2NSender>(internal::reduce_shape(c_, mc), tp_rank_ - 1);
      MSI_RETURN_IF_ERROR(reduce_send_->attach(*ep_));
    }
    // Shard 0 of this worker is bootstrap rank attention_processes() + index * tp.
    MSI_RETURN_IF_ERROR(internal::wire(boot, *ep_, reduce_send_.get(), mine,
                                       c_.attention_processes() + index_ * tp_,
                                       reduce_send_ ? 1 : 0));
  }
  if (c_.tp_attention > 1) MSI_RETURN_IF_ERROR(internal::wire(boot, *ep_, nullptr, region, 0, 0));
  return ok_status();
}

void ExpertWorker::announce(const std::string& what, control::Event answer) {
  std::string held;
  for (int e : local_) held += " " + std::to_string(e);
  if (!lo_.shared_expert_layers.empty()) {
    held +=
        "; shared experts of layer" + std::string(lo_.shared_expert_layers.size() > 1 ? "s" : "");
    for (int l : lo_.shared_expert_layers) held += " " + std::to_string(l);
  }
  const double rss_mb = read_process_memory().rss_bytes / 1048576.0;
  const double weights_mb = w_->packed_bytes() / 1048576.0;
  std::fprintf(stderr, "msinfer: %s%s: experts%s; RSS %.0f MiB (expert weights %.1f MiB)\n",
               me_.c_str(), what.c_str(), held.c_str(), rss_mb, weights_mb);
  std::visit(
      [&](auto& e) {
        if constexpr (requires { e.rss_mb; }) {
          e.rss_mb = rss_mb;
          e.weights_mb = weights_mb;
        }
      },
      answer);
  channel_.send(answer);
}

Status ExpertWorker::serve() {
  int64_t idle = 0, rounds = 0;
  int64_t idle_since_ns = wall_ns();  // when the last unit's work ended
  while (true) {
    if (idle > 64 || (++rounds & 1023) == 0) {
      MSI_ASSIGN_OR_RETURN(bool stop, internal::serve_commands(
                                          channel_, stats_.get(),
                                          [this](control::Command& cmd) { return command(cmd); }));
      if (stop) return ok_status();
    }
    size_t got = 0;
    MSI_RETURN_IF_ERROR(ep_->progress(&got));
    bool worked = false;
    for (int k = 0; k < c_.engine.micro_batches; ++k) {
      bool served = false;
      const int64_t seen_ns = wall_ns();
      if (dispatch_->all_arrived(k)) {
        note_transfer_time(k, static_cast<int>(served_[k] % mc_->layers), seen_ns, idle_since_ns);
      }
      MSI_RETURN_IF_ERROR(serve_unit(k, &served));
      if (served) {
        idle_since_ns = wall_ns();
        worked = true;
      }
    }
    // Idle: yield where the host is oversubscribed, else spin (ep.relax);
    // after 2000 empty polls sleep 0.2 ms; once idle for 50 ms (the
    // deployment has no work, not a gap between units) sleep 2 ms, so an idle
    // deployment costs next to no CPU and the first unit after it is at most
    // 2 ms late.
    if (worked || got > 0) {
      idle = 0;
    } else if (++idle > 2000) {
      internal::idle_pause(idle_since_ns);
    } else {
      ep_->relax(idle);
    }
  }
}

// A transfer time only when the last message was sent while this worker
// was polling: if it arrived during another unit's compute, seen - sent
// is mostly queueing (the worker progresses the fabric between units).
void ExpertWorker::note_transfer_time(int k, int layer, int64_t seen_ns, int64_t idle_since_ns) {
  int64_t last_sent_ns = 0;
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (dispatch_->dropped(a)) continue;
    int64_t t = 0;
    std::memcpy(&t, dispatch_->data(k, a) + hdr_ * row_bytes_ - 8, 8);
    last_sent_ns = std::max(last_sent_ns, t);
  }
  if (last_sent_ns >= idle_since_ns) {
    stats_->t_c.add(k, layer, std::max<int64_t>(0, seen_ns - last_sent_ns) * 1e-9);
  }
}

Status ExpertWorker::serve_unit(int k, bool* served) {
  if (!dispatch_->all_arrived(k)) return ok_status();
  const auto unit_from = std::chrono::steady_clock::now();
  const uint32_t seq = static_cast<uint32_t>(served_[k]);
  MSI_RETURN_IF_ERROR(dispatch_->verify(k, seq));
  const int layer = static_cast<int>(served_[k] % mc_->layers);
  if (units_++ % (static_cast<int64_t>(c_.engine.micro_batches) * mc_->layers) == 0) {
    stats_->routed.begin_step();
  }
  if (combine_) MSI_RETURN_IF_ERROR(combine_->wait_sent(k));
  if (reduce_send_) MSI_RETURN_IF_ERROR(reduce_send_->wait_sent(k));
  MSI_ASSIGN_OR_RETURN(Replies replies, plan_replies(k));
  MSI_RETURN_IF_ERROR(compute_experts(k, layer, replies));
  MSI_RETURN_IF_ERROR(answer(k, seq, replies));
  dispatch_->release(k);
  const double unit_s = seconds_since(unit_from);
  stats_->t_e.add(k, layer, unit_s);
  stats_->busy_s += unit_s;
  ++served_[k];
  *served = true;
  return ok_status();
}

StatusOr<ExpertWorker::Replies> ExpertWorker::plan_replies(int k) {
  const int A = c_.attention_workers;
  Replies r;
  r.rows.assign(A, 0);
  r.base.assign(A, 0);
  for (int a = 0; a < A; ++a) {
    if (dispatch_->dropped(a)) continue;  // nothing from it, nothing to it
    r.rows[a] = dispatch_->rows(k, a) - hdr_;
    if (r.rows[a] < 0) return malformed(a);
    r.base[a] = r.total;
    r.total += r.rows[a];
  }
  if (reduce_send_ && r.total > reduce_send_->shape().max_rows) {
    return resource_exhausted(me_ + ": " + std::to_string(r.total) +
                              " rows exceed one reduce message");
  }
  return r;
}

uint8_t* ExpertWorker::reply_at(int k, const Replies& replies, int a, int64_t row) {
  return combine_ ? combine_->buffer(k, a) + row * row_bytes_
                  : reduce_send_->buffer(k, 0) + (replies.base[a] + row) * row_bytes_;
}

// Per local expert: gather its rows from every attention worker, run the
// FFN once, scatter the outputs into each sender's answer.
Status ExpertWorker::compute_experts(int k, int layer, const Replies& replies) {
  const int A = c_.attention_workers;
  std::vector<int64_t> cursor(A, hdr_);
  std::vector<int32_t> n(A);
  for (size_t i = 0; i < static_cast<size_t>(counts()); ++i) {
    // The last count under shared_: the shared experts' rows.
    const bool shared = i == local_.size();
    const int expert = shared ? mc_->experts : local_[i];
    int64_t total = 0;
    for (int a = 0; a < A; ++a) {
      if (dispatch_->dropped(a)) {
        n[a] = 0;
        continue;
      }
      std::memcpy(&n[a], dispatch_->data(k, a) + i * 4, 4);
      if (n[a] < 0 || cursor[a] + n[a] > dispatch_->rows(k, a)) return malformed(a);
      total += n[a];
    }
    if (total == 0) continue;
    if (shared && shared_expert_worker(layer, c_.expert_workers) != index_) {
      return internal_error(me_ + ": shared-expert rows of layer " + std::to_string(layer) +
                            ", which expert worker " +
                            std::to_string(shared_expert_worker(layer, c_.expert_workers)) +
                            " holds");
    }
    in_.resize(total * h_);
    out_.resize(total * h_);
    int64_t at = 0;
    for (int a = 0; a < A; ++a) {
      std::memcpy(in_.data() + at * h_, dispatch_->data(k, a) + cursor[a] * row_bytes_,
                  static_cast<size_t>(n[a] * row_bytes_));
      at += n[a];
    }
    MSI_RETURN_IF_ERROR(
        runner_->forward_group(layer, {expert}, {0, total}, in_.data(), out_.data()));
    const double width =
        shared ? static_cast<double>(mc_->shared_expert_ffn) / static_cast<double>(mc_->expert_ffn)
               : 1.0;
    stats_->gemm_flops += ffn_flops_per_row_ * width * static_cast<double>(total) / tp_;
    // Rows are counted once per expert worker: by shard 0; the routing
    // statistics count routed experts only.
    if (tp_rank_ == 0 && shared) stats_->tokens += total;
    if (tp_rank_ == 0 && !shared) {
      stats_->tokens += total;
      stats_->expert_tokens[local_[i]] += total;
      stats_->routed.add(layer, local_[i], total);
      routed_since_[static_cast<size_t>(layer) * mc_->experts + local_[i]] += total;
    }
    at = 0;
    for (int a = 0; a < A; ++a) {
      std::memcpy(reply_at(k, replies, a, cursor[a] - hdr_), out_.data() + at * h_,
                  static_cast<size_t>(n[a] * row_bytes_));
      at += n[a];
      cursor[a] += n[a];
    }
  }
  return ok_status();
}

Status ExpertWorker::answer(int k, uint32_t seq, const Replies& replies) {
  if (reduce_send_) {
    stats_->tp_reduce_bytes_sent += replies.total * row_bytes_;
    return reduce_send_->send(k, seq, {replies.total});
  }
  if (reduce_recv_) MSI_RETURN_IF_ERROR(add_partials(k, seq, replies));
  stats_->m2n_bytes_sent += replies.total * row_bytes_;
  return combine_->send(k, seq, replies.rows);
}

Status ExpertWorker::add_partials(int k, uint32_t seq, const Replies& replies) {
  Status s = reduce_recv_->wait(k, seq);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    std::string m;
    for (int r : reduce_recv_->missing(k)) {
      m += (m.empty() ? "" : ", ") + expert_process_name(index_, r + 1, tp_);
    }
    return Status(StatusCode::kUnavailable, me_ + ": no partial output from " + m + " within " +
                                                std::to_string(c_.timeout_ms) + " ms");
  }
  MSI_RETURN_IF_ERROR(s);
  for (int r = 0; r + 1 < tp_; ++r) {
    if (reduce_recv_->rows(k, r) != replies.total) {
      return internal_error(me_ + ": " + expert_process_name(index_, r + 1, tp_) + " sent " +
                            std::to_string(reduce_recv_->rows(k, r)) + " rows, expected " +
                            std::to_string(replies.total));
    }
    const auto* part = reinterpret_cast<const float*>(reduce_recv_->data(k, r));
    for (int a = 0; a < c_.attention_workers; ++a) {
      auto* dst = reinterpret_cast<float*>(combine_->buffer(k, a));
      const float* src = part + replies.base[a] * h_;
      for (int64_t x = 0; x < replies.rows[a] * h_; ++x) dst[x] += src[x];
    }
  }
  reduce_recv_->release(k);
  return ok_status();
}

// Online rebalancing (Router, docs/RUNTIME.md "Online rebalancing"): GetRouted,
// Prepare (load on a thread while units go on being served), GetPrepared,
// Switch (between steps, once every worker is ready), Abandon. Plus
// DropAttention (attention worker a died: serve the others) and SetUnits (a
// replacement joining a running deployment, before its first unit). A command
// that cannot be carried out is answered with an Error; the worker goes on.
Status ExpertWorker::command(control::Command& cmd) {
  auto error = [&](const std::string& m) { channel_.send(control::Error{me_ + ": " + m}); };
  if (std::holds_alternative<control::GetRouted>(cmd)) {
    channel_.send(control::RoutedRows{routed_since_});
    std::fill(routed_since_.begin(), routed_since_.end(), 0);
  } else if (auto* p = std::get_if<control::Prepare>(&cmd)) {
    if (!is_cpu_device(c_.expert_device)) {
      error("online rebalancing runs on CPU expert workers only");
    } else if (loading_) {
      error("a rebalance is already being prepared");
    } else if (Status s = internal::check_router_placement(p->placement, c_,
                                                           static_cast<int>(mc_->experts));
               !s.ok()) {
      error(s.message());
    } else {
      prepare(p->placement);
    }
  } else if (std::holds_alternative<control::GetPrepared>(cmd)) {
    if (!loading_) {
      error("no rebalance is being prepared");
    } else if (loading_->done && !loading_->status.ok()) {
      const std::string m = "loading experts: " + loading_->status.message();
      loading_.reset();
      error(m);
    } else {
      channel_.send(control::PreparedState{loading_->done.load()});
    }
  } else if (std::holds_alternative<control::Abandon>(cmd)) {
    loading_.reset();  // waits for a load still running
    channel_.send(control::Abandoned{});
  } else if (auto* u = std::get_if<control::SetUnits>(&cmd)) {
    // The (micro-batch, layer) units each slot has served so far, which the
    // sequence numbers continue from. Before the first unit only.
    if (units_ != 0 || u->served.size() != served_.size()) {
      error("units: expected " + std::to_string(served_.size()) + " counts before the first unit");
    } else {
      served_ = u->served;
      units_ = served_.empty() ? 0 : served_[0] * c_.engine.micro_batches;
      channel_.send(control::UnitsSet{});
    }
  } else if (std::holds_alternative<control::Switch>(cmd)) {
    if (!loading_ || !loading_->done || !loading_->status.ok()) {
      error("switch before the new experts were loaded");
    } else {
      switch_experts();
    }
  } else if (std::holds_alternative<control::GetCard>(cmd)) {
    channel_.send(control::CardInfo{card_, served_});
  } else if (auto* aa = std::get_if<control::AddAttention>(&cmd)) {
    // A replacement for dropped attention worker `worker` (Router,
    // --respawn), between steps: its dispatch counts again and the answers
    // go to its combine region, from the next unit on.
    const int a = aa->worker;
    auto card = comm::PeerCard::decode(aa->card, "attention worker " + std::to_string(a));
    if (a < 0 || a >= c_.attention_workers || !dispatch_->dropped(a)) {
      error("attention worker " + std::to_string(a) + " was not dropped");
    } else if (!card.ok()) {
      error(card.status().message());
    } else {
      Status s = ok_status();
      if (combine_) {
        auto handle = ep_->transport().connect(card->address);
        if (handle.ok()) {
          combine_->set_receiver(a, *handle, card->region);
          combine_->restore_receiver(a);
        } else {
          s = handle.status();
        }
      }
      if (s.ok()) {
        dispatch_->restore_sender(a);
        std::fprintf(stderr, "msinfer: %s: attention worker %d is back\n", me_.c_str(), a);
        channel_.send(control::AttentionAdded{a});
      } else {
        error(s.message());
      }
    }
  } else if (auto* d = std::get_if<control::DropAttention>(&cmd)) {
    if (d->worker < 0 || d->worker >= c_.attention_workers) {
      error("no attention worker " + std::to_string(d->worker) + " to drop");
    } else {
      std::fprintf(stderr, "msinfer: %s: attention worker %d is gone; serving the others\n",
                   me_.c_str(), d->worker);
      dispatch_->drop_sender(d->worker);
      if (combine_) combine_->drop_receiver(d->worker);
    }
  } else {
    error(std::string("unexpected command '") + control::op_name(cmd) + "'");
  }
  return ok_status();
}

void ExpertWorker::prepare(const Placement& p) {
  loading_ = std::make_unique<ExpertLoad>();
  loading_->keep = p.experts_on(index_);
  for (int e : loading_->keep) {
    if (std::find(local_.begin(), local_.end(), e) == local_.end()) loading_->added.push_back(e);
  }
  if (loading_->added.empty()) {
    loading_->done = true;
  } else {
    model::LoadOptions more = lo_;
    more.experts = loading_->added;
    more.shared_expert_layers.clear();  // held already, and kept by replace_experts
    loading_->thread = std::thread([dir = c_.model_dir, more, l = loading_.get()] {
      auto loaded = model::ModelWeights::load(dir, more);
      if (loaded.ok()) {
        l->weights = std::move(loaded).value();
      } else {
        l->status = loaded.status();
      }
      l->done = true;
    });
  }
  channel_.send(control::Preparing{static_cast<int64_t>(loading_->added.size())});
}

void ExpertWorker::switch_experts() {
  if (loading_->thread.joinable()) loading_->thread.join();
  w_->replace_experts(loading_->weights.get(), loading_->keep);
  local_ = loading_->keep;
  hdr_ = header_rows(counts(), row_bytes_);
  loading_.reset();
  announce(": rebalanced", control::Switched{local_});
}

}  // namespace

Status run_expert_worker(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                         int in_fd, int out_fd) {
  ExpertWorker worker(c, index, tp_rank, in_fd, out_fd);
  return worker.run(boot);
}

}  // namespace msinfer::runtime
