// An attention worker of a disaggregated deployment (rank 0 of its replica):
// the engine with RemoteExperts as its expert backend, driven by the router's
// commands (docs/RUNTIME.md).
#include <algorithm>
#include <deque>

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
  // A prefilled sequence whose K/V a prefill worker writes into the staging
  // region: waits for its immediate, then queues it in the engine.
  control::Event add_prefilled(control::AddPrefilled& a);

  const WorkerConfig& c_;
  const int index_;
  const std::string me_;
  control::WorkerChannel channel_;
  std::shared_ptr<const model::ModelWeights> weights_;
  std::unique_ptr<comm::M2NEndpoint> ep_;
  std::unique_ptr<WorkerStats> stats_;
  internal::RemoteExperts* experts_ = nullptr;  // owned by engine_
  std::unique_ptr<internal::AttentionTpLeader> peers_;
  std::unique_ptr<Engine> engine_;
  std::deque<control::Command> deferred_;  // read mid-step, handled after it
  // With prefill workers: the K/V staging region they write into, on a
  // transport of its own (its immediates are the prefill workers' only).
  std::unique_ptr<comm::Transport> kv_transport_;
  std::unique_ptr<comm::RegionMemory> kv_region_;
  std::vector<uint32_t> kv_arrived_;  // immediates seen, not yet taken
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
    MSI_ASSIGN_OR_RETURN(kv_transport_, internal::make_transport(c_));
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
  if (!kv_transport_) return control::Refused{id, me_ + ": no K/V staging region"};
  if (a.bytes < 0 || static_cast<uint64_t>(a.bytes) > kv_region_->size()) {
    return control::Refused{
        id, me_ + ": " + std::to_string(a.bytes) + " bytes of K/V exceed the staging region"};
  }
  // The write's immediate comes after its bytes (transport.h): once it is
  // here, the region holds the K/V.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(c_.timeout_ms);
  std::vector<comm::Completion> done;
  while (std::find(kv_arrived_.begin(), kv_arrived_.end(), a.imm) == kv_arrived_.end()) {
    done.clear();
    if (Status s = kv_transport_->poll(&done, 16); !s.ok())
      return control::Refused{id, s.message()};
    for (const auto& d : done) {
      if (d.kind == comm::Completion::Kind::kRemoteWrite) kv_arrived_.push_back(d.imm);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return control::Refused{id, me_ + ": the K/V of request " + std::to_string(id) +
                                      " did not arrive within " + std::to_string(c_.timeout_ms) +
                                      " ms"};
    }
    if (done.empty()) ep_->relax(1 << 20);
  }
  kv_arrived_.erase(std::find(kv_arrived_.begin(), kv_arrived_.end(), a.imm));
  a.sequence.kv.assign(kv_region_->data(), kv_region_->data() + a.bytes);
  Status s = engine_->add_prefilled(std::move(a.sequence));
  if (!s.ok()) return control::Refused{id, s.message()};
  return control::Added{id};
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
    const bool found = engine_->cancel(c->id);
    channel_.send(Cancelled{found, engine_->kv_usage()});
  } else if (auto* ap = std::get_if<AddPrefilled>(&cmd)) {
    channel_.send(add_prefilled(*ap));
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
