// An attention worker of a disaggregated deployment (rank 0 of its replica):
// the engine with RemoteExperts as its expert backend, driven by the router's
// commands (docs/RUNTIME.md).
#include <algorithm>
#include <deque>
#include <map>

#include "internal/attention_tp.h"
#include "internal/remote_experts.h"
#include "internal/worker_common.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/core/process.h"
#include "msinfer/runtime/device_backend.h"

namespace msinfer::runtime {
namespace {

// Reads one command at a time and answers it with one event (DropExpert and
// Exit have none). DropExpert and Exit are also read mid-step, while the
// engine waits for the expert workers' answers; other commands read then wait
// for the step's end. Single threaded: everything runs on the caller's thread.
class AttentionWorker {
 public:
  AttentionWorker(const WorkerConfig& c, int index, int in_fd, int out_fd)
      : c_(c),
        index_(index),
        me_(attention_process_name(index, 0, c.tp_attention)),
        channel_(in_fd, out_fd, me_) {}

  Status run(comm::Bootstrap& boot) {
    MSI_RETURN_IF_ERROR(start(boot));
    while (auto cmd = next_command()) {
      bool exit = false;
      MSI_RETURN_IF_ERROR(handle(*cmd, &exit));
      if (exit) return ok_status();
    }
    return ok_status();  // the router closed the channel
  }

 private:
  Status start(comm::Bootstrap& boot);
  std::optional<control::Command> next_command();
  // What runs while finish() waits for the expert workers' answers.
  Status between_polls();
  Status handle(control::Command& cmd, bool* exit);
  Status drop_expert(const control::DropExpert& d, bool mid_step);
  Status add_expert(const control::AddExpert& a);
  Status step();
  // A prefilled sequence whose K/V a prefill worker is to write: blocks in
  // the pool when they are free now, else the staging region.
  control::Event add_prefilled(control::AddPrefilled& a);
  // Its K/V are being written: waits for the immediate, then decodes it.
  control::Event commit_kv(const control::CommitKv& c);
  // Waits up to the timeout for immediate `imm` from a prefill worker.
  Status wait_for_kv(uint32_t imm, int64_t id);

  const WorkerConfig& c_;
  const int index_;
  const std::string me_;
  control::WorkerChannel channel_;
  std::shared_ptr<const model::ModelWeights> weights_;
  std::unique_ptr<comm::M2NEndpoint> ep_;
  std::unique_ptr<WorkerStats> stats_;
  internal::RemoteExperts* experts_ = nullptr;  // owned by engine_
  std::unique_ptr<internal::AttentionTpLeader> peers_;
  // With prefill workers: a transport of its own for the K/V they write
  // (its immediates are theirs only), its staging region, and the KV
  // pool's region when the engine's pool is the transport's memory
  // (RemoteRegion bytes; empty: everything goes through the staging region).
  // Before engine_: the pool's memory may outlive the transport, not the
  // other way round.
  std::unique_ptr<comm::Transport> kv_transport_;
  std::unique_ptr<comm::RegionMemory> kv_region_;
  std::string pool_region_;
  std::vector<uint32_t> kv_arrived_;  // immediates seen, not yet taken
  // AddPrefilled sequences until their CommitKv, by (id, index): placed in
  // the pool (the engine holds them), or staged (their sequence here).
  std::map<std::pair<int64_t, int>, std::optional<control::AddPrefilled>> pending_kv_;
  std::unique_ptr<Engine> engine_;
  std::deque<control::Command> deferred_;  // read mid-step, handled after it
  // An Exit read mid-step ends the step and the worker (the router is
  // stopping the deployment, perhaps because an expert worker died without
  // replicas).
  bool exit_mid_step_ = false;
};

Status AttentionWorker::start(comm::Bootstrap& boot) {
  model::LoadOptions lo;
  lo.all_experts = false;  // attention workers map no expert weights
  lo.weights = c_.weights;
  lo.attention_tp_size = c_.tp_attention;
  lo.shared_experts_with_attention = c_.shared_experts == SharedExpertsOn::kAttention;
  MSI_ASSIGN_OR_RETURN(
      auto w, model::ModelWeights::load(c_.model_dir, host_load_options(lo, c_.attention_device)));
  weights_ = std::move(w);
  const ModelConfig& mc = weights_->config();
  MSI_ASSIGN_OR_RETURN(auto transport, internal::make_transport(c_));
  ep_ = std::make_unique<comm::M2NEndpoint>(std::move(transport),
                                            std::chrono::milliseconds(c_.timeout_ms));
  ep_->set_yield_when_idle(comm::oversubscribed(comm::local_process_count(c_.processes())));
  stats_ = std::make_unique<WorkerStats>(c_.engine.micro_batches, mc.layers);
  auto remote = std::make_unique<internal::RemoteExperts>(c_, mc, index_, *ep_, stats_.get());
  MSI_RETURN_IF_ERROR(remote->attach(boot));
  experts_ = remote.get();
  if (c_.tp_attention > 1) {
    peers_ = std::make_unique<internal::AttentionTpLeader>(c_, mc, index_, stats_.get(), *ep_);
    MSI_RETURN_IF_ERROR(peers_->attach(boot));
  }
  EngineOptions eo = c_.engine;  // the deployment's, plus what only this process sets
  if (c_.prefill_workers > 0) {
    MSI_ASSIGN_OR_RETURN(kv_transport_, internal::make_transport(c_));
    // The pool in the transport's memory, so that prefill workers write
    // blocks straight into it; where that memory is short (the direct
    // transport's /dev/shm), the pool is the engine's own and every
    // transfer lands in the staging region.
    eo.kv_pool_memory = [this](size_t bytes) -> std::shared_ptr<uint8_t> {
      auto m = kv_transport_->allocate(bytes);
      if (!m.ok()) {
        std::fprintf(stderr,
                     "msinfer: %s: the KV pool stays out of the transport's memory (%s); "
                     "prefilled K/V come through the staging region\n",
                     me_.c_str(), m.status().message().c_str());
        return nullptr;
      }
      std::shared_ptr<comm::RegionMemory> owner = std::move(m).value();
      return std::shared_ptr<uint8_t>(owner, owner->data());
    };
  }
  eo.attention_peers = peers_.get();
  eo.step_when_idle = true;
  eo.device = c_.attention_device;
  eo.prefix_cache_events = eo.prefix_caching;  // reported with each step, for the router's index
  MSI_ASSIGN_OR_RETURN(engine_, Engine::create(weights_, eo, std::move(remote)));
  experts_->set_between_polls([this] { return between_polls(); });
  control::Ready ready = control::Ready::of(index_, read_process_memory().rss_bytes / 1048576.0,
                                            weights_->packed_bytes() / 1048576.0);
  if (engine_->kv_cache().prefix_caching()) {
    ready.prefix_salt = engine_->kv_cache().prefix_salt();
    ready.kv_block_size = engine_->kv_cache().block_size();
  }
  if (c_.prefill_workers > 0) {
    const KvCache& kv = engine_->kv_cache();
    if (kv.pool_memory_given()) {
      MSI_ASSIGN_OR_RETURN(
          comm::RemoteRegion pool,
          kv_transport_->register_memory(kv.pool_data(), static_cast<size_t>(kv.pool_bytes())));
      pool_region_ = pool.encode();
    }
    MSI_ASSIGN_OR_RETURN(kv_region_,
                         kv_transport_->allocate(static_cast<size_t>(c_.kv_transfer_bytes)));
    MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region,
                         kv_transport_->register_memory(kv_region_->data(), kv_region_->size()));
    ready.kv_card = comm::PeerCard{kv_transport_->address(), region}.encode();
  }
  channel_.send(ready);
  return ok_status();
}

std::optional<control::Command> AttentionWorker::next_command() {
  if (deferred_.empty()) return channel_.next(/*timeout_ms=*/-1);
  control::Command c = std::move(deferred_.front());
  deferred_.pop_front();
  return c;
}

Status AttentionWorker::between_polls() {
  while (auto cmd = channel_.next(0)) {
    if (auto* d = std::get_if<control::DropExpert>(&*cmd)) {
      MSI_RETURN_IF_ERROR(drop_expert(*d, /*mid_step=*/true));
    } else if (std::holds_alternative<control::Exit>(*cmd)) {
      exit_mid_step_ = true;
      return unavailable("the router asked the worker to exit");
    } else {
      deferred_.push_back(std::move(*cmd));
    }
  }
  return ok_status();
}

// Expert worker w died and its experts have replicas (or, keep_placement, a
// replacement is awaited). Read between steps, or mid-step while waiting for
// the expert workers (then the step is run again).
Status AttentionWorker::drop_expert(const control::DropExpert& d, bool mid_step) {
  MSI_RETURN_IF_ERROR(experts_->drop_expert_worker(d.worker, mid_step, d.keep_placement));
  std::fprintf(
      stderr, "msinfer: attention worker %d: expert worker %d is gone; %s%s\n", index_, d.worker,
      d.keep_placement ? "waiting for its replacement" : "its experts' rows go to their replicas",
      mid_step ? " (the step in flight runs again)" : "");
  return ok_status();
}

// A replacement expert worker joins (Router, --respawn): routes to it from
// the next step on.
Status AttentionWorker::add_expert(const control::AddExpert& a) {
  auto card = comm::PeerCard::decode(a.card, "expert worker " + std::to_string(a.worker));
  Status s = card.ok() ? experts_->add_expert_worker(a.worker, *card, a.shares) : card.status();
  if (!s.ok()) {
    channel_.send(control::Error{s.message()});
    return s;
  }
  std::fprintf(stderr, "msinfer: attention worker %d: expert worker %d is back\n", index_,
               a.worker);
  channel_.send(control::ExpertAdded{a.worker});
  return ok_status();
}

Status AttentionWorker::step() {
  const auto step_from = std::chrono::steady_clock::now();
  const double wait_before = stats_->wait_s;
  auto events = engine_->step();
  stats_->busy_s += internal::seconds_since(step_from) - (stats_->wait_s - wait_before);
  if (!events.ok()) {
    if (exit_mid_step_) return ok_status();
    channel_.send(control::Error{events.status().message()});
    return events.status();
  }
  control::Stepped answer;
  answer.events = std::move(events).value();
  answer.running = engine_->running() + engine_->waiting();
  answer.kv_usage = engine_->kv_usage();
  answer.counters = engine_->counters();
  answer.discarded = experts_->discard_step();
  engine_->take_prefix_cache_events(control::kMaxCacheEvents, &answer.cache_stored,
                                    &answer.cache_removed);
  channel_.send(answer);
  return ok_status();
}

control::Event AttentionWorker::add_prefilled(control::AddPrefilled& a) {
  const int64_t id = a.sequence.request.id;
  const std::pair<int64_t, int> key{id, a.sequence.index};
  if (!kv_transport_) return control::Refused{id, me_ + ": no K/V staging region"};
  if (pending_kv_.count(key) != 0) {
    return control::Refused{id, me_ + ": its K/V are awaited already"};
  }
  control::KvPlaced out;
  out.id = id;
  out.index = a.sequence.index;
  if (!pool_region_.empty()) {
    auto placed = engine_->place_prefilled(a.sequence, a.bytes);
    if (!placed.ok()) return control::Refused{id, placed.status().message()};
    if (placed->has_value()) {
      out.target.region = pool_region_;
      out.target.placed = std::move(**placed);
      pending_kv_[key] = std::nullopt;
      return out;
    }
  }
  // The staging region holds one sequence's K/V at a time.
  if (a.bytes < 0 || static_cast<uint64_t>(a.bytes) > kv_region_->size()) {
    return control::Refused{
        id, me_ + ": " + std::to_string(a.bytes) + " bytes of K/V exceed the staging region"};
  }
  for (const auto& [k, staged] : pending_kv_) {
    if (staged.has_value()) return control::Refused{id, me_ + ": the staging region is in use"};
  }
  pending_kv_[key] = std::move(a);
  return out;
}

Status AttentionWorker::wait_for_kv(uint32_t imm, int64_t id) {
  // The immediate comes with the last write, after its bytes and those of
  // the writes before it (transport.h): once it is here, the K/V are.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(c_.timeout_ms);
  std::vector<comm::Completion> done;
  while (std::find(kv_arrived_.begin(), kv_arrived_.end(), imm) == kv_arrived_.end()) {
    done.clear();
    MSI_RETURN_IF_ERROR(kv_transport_->poll(&done, 16));
    for (const auto& d : done) {
      // 0: a write before the last one of a transfer.
      if (d.kind == comm::Completion::Kind::kRemoteWrite && d.imm != 0)
        kv_arrived_.push_back(d.imm);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    me_ + ": the K/V of request " + std::to_string(id) + " did not arrive within " +
                        std::to_string(c_.timeout_ms) + " ms");
    }
    if (done.empty()) ep_->relax(1 << 20);
  }
  kv_arrived_.erase(std::find(kv_arrived_.begin(), kv_arrived_.end(), imm));
  return ok_status();
}

control::Event AttentionWorker::commit_kv(const control::CommitKv& c) {
  auto it = pending_kv_.find({c.id, c.index});
  if (it == pending_kv_.end()) {
    return control::Refused{c.id, me_ + ": no prefilled sequence " + std::to_string(c.id) + "/" +
                                      std::to_string(c.index) + " awaits its K/V"};
  }
  std::optional<control::AddPrefilled> staged = std::move(it->second);
  pending_kv_.erase(it);
  const Status arrived = wait_for_kv(c.imm, c.id);
  if (!staged.has_value()) {  // placed: the bytes are in its blocks
    // Without them the blocks stay held until the router's Cancel: it sends
    // that once the prefill worker has answered (or died), so no late write
    // can land in blocks already given to another sequence.
    if (!arrived.ok()) return control::Refused{c.id, arrived.message()};
    engine_->commit_prefilled(c.id, c.index, true);
    return control::Added{c.id};
  }
  if (!arrived.ok()) return control::Refused{c.id, arrived.message()};
  staged->sequence.kv.assign(kv_region_->data(), kv_region_->data() + staged->bytes);
  Status s = engine_->add_prefilled(std::move(staged->sequence));
  if (!s.ok()) return control::Refused{c.id, s.message()};
  return control::Added{c.id};
}

// One command; *exit when the worker is to stop. A command an attention
// worker does not serve is answered with an error; the worker goes on.
Status AttentionWorker::handle(control::Command& cmd, bool* exit) {
  using namespace control;
  if (std::holds_alternative<Exit>(cmd)) {
    *exit = true;
  } else if (std::holds_alternative<Step>(cmd)) {
    MSI_RETURN_IF_ERROR(step());
    *exit = exit_mid_step_;
  } else if (auto* a = std::get_if<Add>(&cmd)) {
    channel_.send(internal::add_request(*engine_, a->request));
  } else if (auto* c = std::get_if<Cancel>(&cmd)) {
    const bool found = engine_->cancel(c->id);  // placed sequences too
    std::erase_if(pending_kv_, [&](const auto& p) { return p.first.first == c->id; });
    channel_.send(Cancelled{found, engine_->kv_usage()});
  } else if (auto* ap = std::get_if<AddPrefilled>(&cmd)) {
    channel_.send(add_prefilled(*ap));
  } else if (auto* ck = std::get_if<CommitKv>(&cmd)) {
    channel_.send(commit_kv(*ck));
  } else if (auto* st = std::get_if<GetStats>(&cmd)) {
    Json j = stats_->to_json();
    j["micro_batch_balance"] = engine_->micro_batch_balance();
    channel_.send(StatsReport{std::move(j)});
    if (st->reset) stats_->reset();
  } else if (auto* d = std::get_if<DropExpert>(&cmd)) {
    MSI_RETURN_IF_ERROR(drop_expert(*d, /*mid_step=*/false));
  } else if (std::holds_alternative<GetCard>(cmd)) {
    channel_.send(CardInfo{experts_->card(), experts_->units()});
  } else if (auto* ae = std::get_if<AddExpert>(&cmd)) {
    MSI_RETURN_IF_ERROR(add_expert(*ae));
  } else if (auto* u = std::get_if<SetUnits>(&cmd)) {
    // A replacement (Router, --respawn), before its first step.
    Status s = experts_->set_units(u->served);
    if (s.ok()) {
      channel_.send(UnitsSet{});
    } else {
      channel_.send(Error{s.message()});
    }
  } else if (auto* p = std::get_if<SetPlacement>(&cmd)) {
    // Online rebalancing: the expert workers have switched; route by the
    // new placement from the next step on.
    Status s = internal::check_router_placement(p->placement, c_,
                                                static_cast<int>(weights_->config().experts));
    if (!s.ok()) {
      channel_.send(Error{s.message()});
      return s;
    }
    experts_->set_placement(p->placement);
    channel_.send(PlacementSet{});
  } else {
    channel_.send(Error{me_ + ": unexpected command '" + op_name(cmd) + "'"});
  }
  return ok_status();
}

}  // namespace

Status run_attention_worker(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                            int in_fd, int out_fd) {
  if (c.tp_attention > 1 && !is_cpu_device(c.attention_device)) {
    return unimplemented(attention_process_name(index, tp_rank, c.tp_attention) +
                         ": --tp-attention > 1 on " + c.attention_device +
                         ": attention tensor parallelism runs on the CPU only");
  }
  if (tp_rank > 0) return internal::run_attention_tp_rank(c, index, tp_rank, boot, in_fd, out_fd);
  AttentionWorker worker(c, index, in_fd, out_fd);
  return worker.run(boot);
}

}  // namespace msinfer::runtime
