// A prefill worker (prefill/decode disaggregation, docs/RUNTIME.md): a
// co-located engine with every weight that computes prompts (their requests
// prefill_only), keeps each sequence that has its first token with its
// blocks held (Engine::take_prefilled(false)), and writes those K/V from its
// KV pool (registered with an M2N transport of its own) to the attention
// worker the router names (SendKv): into the blocks that worker took in its
// own pool, or into its staging region; writes with immediate, one per run
// contiguous at both ends. Not a bootstrap rank: the staging regions come
// from the router (ConnectKv), the pool's with each SendKv.
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
  std::unique_ptr<comm::Transport> transport_;  // its KV pool registered: every write's source
  std::vector<int> peers_;  // by attention worker: transport handle, -1 when none
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
  const KvCache& kv = engine_->kv_cache();
  MSI_RETURN_IF_ERROR(
      transport_->register_memory(kv.pool_data(), static_cast<size_t>(kv.pool_bytes())).status());
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
  const PrefilledSequence& p = it->second;
  const KvCache& kv = engine_->kv_cache();
  // Blocks the attention worker's prefix cache held already are not sent.
  const int64_t skip = s.target.region.empty() ? 0 : s.target.placed.skip_blocks;
  if (skip < 0 || skip >= kv.blocks_for(p.computed)) {
    return control::Refused{s.id, me_ + ": skipping " + std::to_string(skip) + " of " +
                                      std::to_string(kv.blocks_for(p.computed)) + " K/V blocks"};
  }
  auto from = kv.transfer_spans(kv.transfer_table(p.kv_seq, p.computed, skip), p.computed,
                                kv.total_blocks(), skip);
  if (!from.ok()) return control::Refused{s.id, me_ + ": " + from.status().message()};
  int64_t bytes = 0;
  for (const KvCache::Span& x : *from) bytes += x.bytes;
  // Where they go: the blocks the attention worker took, or its staging region.
  comm::RemoteRegion region = regions_[static_cast<size_t>(s.worker)];
  std::vector<KvCache::Span> to{{0, bytes}};
  if (!s.target.region.empty()) {
    auto r = comm::RemoteRegion::decode(s.target.region);
    if (!r.ok()) return control::Refused{s.id, me_ + ": " + r.status().message()};
    region = *r;
    auto spans =
        kv.transfer_spans(s.target.placed.table, p.computed, s.target.placed.pool_blocks, skip);
    if (!spans.ok()) return control::Refused{s.id, me_ + ": " + spans.status().message()};
    to = std::move(spans).value();
  } else if (static_cast<uint64_t>(bytes) > region.length) {
    return control::Refused{
        s.id, me_ + ": " + std::to_string(bytes) + " bytes of K/V exceed the staging region"};
  }
  // One write per run contiguous at both ends; only the last raises the
  // immediate.
  const std::vector<KvCache::Copy> pieces = KvCache::pair_spans(*from, to);
  const auto t0 = std::chrono::steady_clock::now();
  const int peer = peers_[static_cast<size_t>(s.worker)];
  const uint64_t first = writes_ + 1;
  Status st = ok_status();
  for (size_t k = 0; k < pieces.size() && st.ok(); ++k) {
    st = transport_->write(
        peer, kv.pool_data() + pieces[k].from, static_cast<size_t>(pieces[k].bytes), region,
        static_cast<uint64_t>(pieces[k].to), k + 1 == pieces.size() ? s.imm : 0, ++writes_);
  }
  // The blocks are freed only once every write has left them.
  std::vector<comm::Completion> done;
  const auto deadline = t0 + std::chrono::milliseconds(c_.timeout_ms);
  uint64_t left = writes_ + 1 - first;
  while (st.ok() && left > 0) {
    done.clear();
    st = transport_->poll(&done, 64);
    for (const auto& d : done) {
      if (d.kind == comm::Completion::Kind::kLocalWrite && d.context >= first) --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      st = Status(StatusCode::kDeadlineExceeded, me_ + ": the K/V writes did not complete");
    }
  }
  if (!st.ok()) return control::Refused{s.id, st.message()};
  control::KvSent out;
  out.id = s.id;
  out.index = s.index;
  out.bytes = bytes;
  out.seconds = internal::seconds_since(t0);
  out.writes = static_cast<int64_t>(pieces.size());
  engine_->release_prefilled(p.kv_seq);
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
  for (PrefilledSequence& p : engine_->take_prefilled(/*copy_kv=*/false)) {
    control::Prefilled info;  // the sequence; its K/V stay in the pool
    info.bytes = engine_->kv_cache().transfer_bytes(p.computed);
    info.sequence = p;
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
      engine_->release_prefilled(it->second.kv_seq);
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
