// A prefill worker (prefill/decode disaggregation, docs/RUNTIME.md): a
// co-located engine with every weight that computes prompts (their requests
// prefill_only), keeps each sequence that has its first token with its K/V
// copied out (Engine::take_prefilled), and writes those K/V into the staging
// region of the attention worker the router names (SendKv) over an M2N
// transport of its own: one write with immediate, from a registered buffer.
// Not a bootstrap rank: the regions come from the router (ConnectKv).
#include <chrono>
#include <cstring>
#include <map>

#include "internal/worker_common.h"
#include "msinfer/core/process.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/disaggregated.h"

namespace msinfer::runtime {
namespace {

class PrefillWorker {
 public:
  PrefillWorker(const WorkerConfig& c, int index, int in_fd, int out_fd)
      : c_(c),
        index_(index),
        me_("prefill worker " + std::to_string(index)),
        channel_(in_fd, out_fd, me_) {}

  Status run() {
    MSI_RETURN_IF_ERROR(start());
    while (auto cmd = channel_.next(/*timeout_ms=*/-1)) {
      bool exit = false;
      MSI_RETURN_IF_ERROR(handle(*cmd, &exit));
      if (exit) return ok_status();
    }
    return ok_status();  // the router closed the channel
  }

 private:
  Status start();
  Status handle(control::Command& cmd, bool* exit);
  Status step();
  Status connect(const control::ConnectKv& c);
  // Writes sequence (id, index)'s K/V to attention worker `worker`; the
  // answer says how it went.
  control::Event send_kv(const control::SendKv& s);

  const WorkerConfig& c_;
  const int index_;
  const std::string me_;
  control::WorkerChannel channel_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<comm::Transport> transport_;
  std::vector<uint8_t> send_;  // registered: every write's source
  std::vector<int> peers_;     // by attention worker: transport handle, -1 when none
  std::vector<comm::RemoteRegion> regions_;
  std::map<std::pair<int64_t, int64_t>, PrefilledSequence> ready_;  // (id, index)
  uint64_t writes_ = 0;
  WorkerStats stats_{1, 1};
};

Status PrefillWorker::start() {
  model::LoadOptions lo;
  lo.weights = c_.weights;
  MSI_ASSIGN_OR_RETURN(auto w, model::ModelWeights::load(c_.model_dir, lo));
  std::shared_ptr<const model::ModelWeights> weights = std::move(w);
  EngineOptions eo = c_.engine;
  eo.micro_batches = 1;  // its experts are its own: nothing to overlap with
  eo.device = "cpu";
  MSI_ASSIGN_OR_RETURN(engine_, Engine::create(weights, eo));
  MSI_ASSIGN_OR_RETURN(transport_, internal::make_transport(c_));
  send_.resize(static_cast<size_t>(c_.kv_transfer_bytes));
  MSI_RETURN_IF_ERROR(transport_->register_memory(send_.data(), send_.size()).status());
  channel_.send(control::Ready::of(index_, read_process_memory().rss_bytes / 1048576.0,
                                   weights->packed_bytes() / 1048576.0));
  return ok_status();
}

Status PrefillWorker::connect(const control::ConnectKv& c) {
  peers_.assign(c.cards.size(), -1);
  regions_.assign(c.cards.size(), comm::RemoteRegion{});
  for (size_t a = 0; a < c.cards.size(); ++a) {
    if (c.cards[a].empty()) continue;  // a worker that is gone
    MSI_ASSIGN_OR_RETURN(
        comm::PeerCard card,
        comm::PeerCard::decode(c.cards[a], "attention worker " + std::to_string(a)));
    MSI_ASSIGN_OR_RETURN(peers_[a], transport_->connect(card.address));
    regions_[a] = card.region;
  }
  return ok_status();
}

control::Event PrefillWorker::send_kv(const control::SendKv& s) {
  auto it = ready_.find({s.id, s.index});
  if (it == ready_.end()) {
    return control::Refused{s.id, me_ + ": no prefilled sequence " + std::to_string(s.id) + "/" +
                                      std::to_string(s.index)};
  }
  if (s.worker < 0 || s.worker >= static_cast<int>(peers_.size()) ||
      peers_[static_cast<size_t>(s.worker)] < 0) {
    return control::Refused{
        s.id, me_ + ": no K/V region of attention worker " + std::to_string(s.worker)};
  }
  const std::vector<uint8_t>& kv = it->second.kv;
  const comm::RemoteRegion& region = regions_[static_cast<size_t>(s.worker)];
  if (kv.size() > send_.size() || kv.size() > region.length) {
    return control::Refused{
        s.id, me_ + ": " + std::to_string(kv.size()) + " bytes of K/V exceed the staging region"};
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::memcpy(send_.data(), kv.data(), kv.size());
  const uint64_t context = ++writes_;
  Status st = transport_->write(peers_[static_cast<size_t>(s.worker)], send_.data(), kv.size(),
                                region, 0, s.imm, context);
  // The buffer is reused by the next write: wait until this one left it.
  std::vector<comm::Completion> done;
  const auto deadline = t0 + std::chrono::milliseconds(c_.timeout_ms);
  bool sent = false;
  while (st.ok() && !sent) {
    done.clear();
    st = transport_->poll(&done, 16);
    for (const auto& d : done) {
      if (d.kind == comm::Completion::Kind::kLocalWrite && d.context == context) sent = true;
    }
    if (!sent && std::chrono::steady_clock::now() > deadline) {
      st = Status(StatusCode::kDeadlineExceeded, me_ + ": the K/V write did not complete");
    }
  }
  if (!st.ok()) return control::Refused{s.id, st.message()};
  control::KvSent out;
  out.id = s.id;
  out.index = s.index;
  out.bytes = static_cast<int64_t>(kv.size());
  out.seconds = internal::seconds_since(t0);
  ready_.erase(it);
  return out;
}

Status PrefillWorker::step() {
  const auto t0 = std::chrono::steady_clock::now();
  auto events = engine_->step();
  stats_.busy_s += internal::seconds_since(t0);
  if (!events.ok()) {
    channel_.send(control::Error{events.status().message()});
    return events.status();
  }
  control::Stepped answer;
  answer.events = std::move(events).value();
  answer.running = engine_->running() + engine_->waiting() + static_cast<int64_t>(ready_.size());
  answer.kv_usage = engine_->kv_usage();
  answer.counters = engine_->counters();
  for (PrefilledSequence& p : engine_->take_prefilled()) {
    control::Prefilled info;
    info.bytes = static_cast<int64_t>(p.kv.size());
    std::vector<uint8_t> kv = std::move(p.kv);  // the report carries all but the K/V
    info.sequence = p;
    p.kv = std::move(kv);
    answer.prefilled.push_back(std::move(info));
    ready_[{p.request.id, p.index}] = std::move(p);
  }
  channel_.send(answer);
  return ok_status();
}

// One command, one answer (Exit: none). A command a prefill worker does not
// serve is answered with an error; the worker goes on.
Status PrefillWorker::handle(control::Command& cmd, bool* exit) {
  using namespace control;
  if (std::holds_alternative<Exit>(cmd)) {
    *exit = true;
  } else if (std::holds_alternative<Step>(cmd)) {
    MSI_RETURN_IF_ERROR(step());
  } else if (auto* a = std::get_if<Add>(&cmd)) {
    a->request.prefill_only = true;
    channel_.send(internal::add_request(*engine_, a->request));
  } else if (auto* c = std::get_if<Cancel>(&cmd)) {
    bool found = engine_->cancel(c->id);
    for (auto it = ready_.begin(); it != ready_.end();) {
      if (it->first.first != c->id) {
        ++it;
        continue;
      }
      it = ready_.erase(it);
      found = true;
    }
    channel_.send(Cancelled{found, engine_->kv_usage()});
  } else if (auto* k = std::get_if<ConnectKv>(&cmd)) {
    Status s = connect(*k);
    if (s.ok()) {
      channel_.send(KvConnected{});
    } else {
      channel_.send(Error{me_ + ": " + s.message()});
    }
  } else if (auto* s = std::get_if<SendKv>(&cmd)) {
    channel_.send(send_kv(*s));
  } else if (auto* st = std::get_if<GetStats>(&cmd)) {
    channel_.send(StatsReport{stats_.to_json()});
    if (st->reset) stats_.reset();
  } else {
    channel_.send(Error{me_ + ": unexpected command '" + op_name(cmd) + "'"});
  }
  return ok_status();
}

}  // namespace

Status run_prefill_worker(const WorkerConfig& c, int index, int in_fd, int out_fd) {
  if (!is_cpu_device(c.attention_device)) {
    return unimplemented("prefill workers run on the CPU only");
  }
  PrefillWorker worker(c, index, in_fd, out_fd);
  return worker.run();
}

}  // namespace msinfer::runtime
