// The router's side of prefill/decode disaggregation (docs/RUNTIME.md,
// "Prefill/decode disaggregation"): requests go to prefill workers first;
// each prefilled sequence's K/V move over the transport into the KV pool
// (or, where its blocks are not free, the staging region) of the attention
// worker the routing policy picks, which decodes it.
#include <algorithm>

#include "internal/line_io.h"
#include "internal/worker_set.h"
#include "msinfer/runtime/router.h"

namespace msinfer::runtime {

using internal::WorkerProcess;

Status Router::connect_prefill_workers() {
  if (c_.prefill_workers == 0) return ok_status();
  control::ConnectKv connect;
  for (int a = 0; a < c_.attention_workers; ++a) {
    connect.cards.push_back(lead(a).dead ? std::string() : lead(a).kv_card);
  }
  for (int p = 0; p < c_.prefill_workers; ++p) {
    WorkerProcess& w = workers_->prefill(p);
    if (w.dead) continue;
    auto e = ask(w, connect);
    if (!e.ok() && w.dead) continue;  // dropped: the others prefill
    MSI_RETURN_IF_ERROR(e.status());
    MSI_RETURN_IF_ERROR(
        control::expect<control::KvConnected>(std::move(e).value(), name_of(w)).status());
  }
  return ok_status();
}

StatusOr<bool> Router::submit_prefill(const GenerationRequest& r) {
  while (true) {
    WorkerProcess* best = nullptr;
    for (int p = 0; p < c_.prefill_workers; ++p) {
      WorkerProcess& w = workers_->prefill(p);
      if (!w.dead && (best == nullptr || w.load < best->load)) best = &w;
    }
    if (best == nullptr) return false;  // none alive: the attention workers prefill
    MSI_RETURN_IF_ERROR(settle_prefill(*best));  // its step's answer first
    if (best->dead) continue;
    auto e = ask(*best, control::Add{r}, std::chrono::milliseconds(c_.timeout_ms),
                 "did not answer an add");
    if (!e.ok() && best->dead) continue;  // it died: the next one
    MSI_RETURN_IF_ERROR(e.status());
    if (auto* refused = std::get_if<control::Refused>(&*e)) {
      return Status(StatusCode::kResourceExhausted,
                    refused->error.empty() ? std::string("refused") : refused->error);
    }
    MSI_RETURN_IF_ERROR(
        control::expect<control::Added>(std::move(e).value(), name_of(*best)).status());
    const int64_t load = static_cast<int64_t>(r.prompt.size());
    best->load += load;
    prefilling_[r.id] = best->index;
    load_of_[r.id] = load;
    return true;
  }
}

Status Router::start_prefill_steps() {
  for (int p = 0; p < c_.prefill_workers; ++p) {
    WorkerProcess& w = workers_->prefill(p);
    if (w.dead || w.stepping || w.load <= 0) continue;
    Status s = send_command(w, control::Step{});
    if (!s.ok() && !w.dead) return s;
    w.stepping = s.ok();
  }
  return ok_status();
}

Status Router::settle_prefill(WorkerProcess& w) {
  if (w.dead || !w.stepping) return ok_status();
  auto e = read_answer(w, std::chrono::milliseconds(-1), StatusCode::kDeadlineExceeded, "");
  return take_prefill_answer(w, std::move(e), &prefill_events_);
}

Status Router::settle_prefill_workers() {
  for (int p = 0; p < c_.prefill_workers; ++p) {
    MSI_RETURN_IF_ERROR(settle_prefill(workers_->prefill(p)));
  }
  return ok_status();
}

Status Router::take_prefill_answer(WorkerProcess& w, StatusOr<control::Event> e,
                                   std::vector<TokenEvent>* events) {
  w.stepping = false;
  if (!e.ok() && w.dead) return ok_status();  // dropped: its requests go elsewhere
  MSI_RETURN_IF_ERROR(e.status());
  MSI_ASSIGN_OR_RETURN(control::Stepped st,
                       control::expect<control::Stepped>(std::move(e).value(), name_of(w)));
  return take_prefill_step(w, std::move(st), events);
}

Status Router::collect_prefill_steps(bool wait, std::vector<TokenEvent>* events) {
  for (int p = 0; p < c_.prefill_workers; ++p) {
    WorkerProcess& w = workers_->prefill(p);
    if (w.dead || !w.stepping) continue;
    std::string line;
    bool eof = false;
    if (!wait && !internal::read_line(w.out, &w.buf, &line, 0, &eof)) {
      if (eof) MSI_RETURN_IF_ERROR(check_children());  // its death, when it is one
      continue;
    }
    MSI_RETURN_IF_ERROR(take_prefill_answer(
        w,
        line.empty()
            ? read_answer(w, std::chrono::milliseconds(-1), StatusCode::kDeadlineExceeded, "")
            : control::decode_event(line, name_of(w)),
        events));
  }
  return ok_status();
}

Status Router::take_prefill_step(WorkerProcess& p, control::Stepped&& s,
                                 std::vector<TokenEvent>* events) {
  p.counters = s.counters;  // the prompts it computed count with the deployment's
  for (TokenEvent& ev : s.events) {
    // A first token: the request goes on decoding elsewhere, unless it ended.
    if (auto t = requests_.find(ev.request_id); t != requests_.end()) {
      t->second.delivered.push_back(ev.token);
      if (ev.finished) requests_.erase(t);
    }
    if (ev.finished) {
      prefilling_.erase(ev.request_id);
      unload(p, ev.request_id);
    }
    events->push_back(std::move(ev));
  }
  for (control::Prefilled& x : s.prefilled) MSI_RETURN_IF_ERROR(transfer(p, std::move(x)));
  return ok_status();
}

Router::KvTransfers Router::kv_transfers() const {
  KvTransfers k;
  k.sequences = kv_sequences_.load(std::memory_order_relaxed);
  k.bytes = kv_bytes_.load(std::memory_order_relaxed);
  k.fallbacks = kv_fallbacks_.load(std::memory_order_relaxed);
  k.into_pool = kv_into_pool_;
  k.writes = kv_writes_;
  k.write_s = kv_write_s_;
  k.transfer_s = kv_transfer_s_;
  return k;
}

void Router::fall_back(int64_t id, const std::string& why) {
  kv_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr,
               "msinfer: router: request %lld is prefilled again on an attention worker: %s\n",
               static_cast<long long>(id), why.c_str());
  if (requests_.count(id) != 0) lost_.push_back(id);  // resubmit_lost: to an attention worker
}

Status Router::transfer(WorkerProcess& p, control::Prefilled&& x) {
  const int64_t id = x.sequence.request.id;
  if (prefilling_.count(id) == 0) return ok_status();  // cancelled meanwhile
  prefilling_.erase(id);
  unload(p, id);
  auto drop_on_prefill = [&] {
    if (!p.dead) {
      (void)ask(p, control::Cancel{id}, std::chrono::milliseconds(c_.timeout_ms),
                "did not answer a cancel");
    }
  };
  // Routed by its tokens so far, as a request of them would be.
  GenerationRequest route = x.sequence.request;
  route.prompt = x.sequence.tokens;
  const int a = choose_attention_worker(route);
  if (a < 0) return Status(StatusCode::kUnavailable, "no attention worker is alive");
  WorkerProcess& d = lead(a);
  const int index = x.sequence.index;
  auto why_of = [](const StatusOr<control::Event>& e) -> std::string {
    if (!e.ok()) return e.status().message();
    if (const auto* r = std::get_if<control::Refused>(&*e)) return r->error;
    return "";
  };
  const auto t0 = std::chrono::steady_clock::now();
  // Where the bytes go: blocks the attention worker takes now, or its
  // staging region.
  auto placed =
      ask(d, control::AddPrefilled{std::move(x.sequence), x.bytes},
          std::chrono::milliseconds(c_.timeout_ms), "did not answer a prefilled sequence");
  if (!placed.ok() && !d.dead) return placed.status();
  const auto* target = placed.ok() ? std::get_if<control::KvPlaced>(&*placed) : nullptr;
  if (target == nullptr) {
    drop_on_prefill();
    const std::string why = why_of(placed);
    fall_back(id, why.empty() ? std::string("an unexpected answer") : why);
    return ok_status();
  }
  // The attention worker waits for the immediate while the prefill worker
  // writes (a transport may need the receiver's progress to move the bytes).
  uint32_t imm = ++kv_imm_;
  if (imm == 0) imm = ++kv_imm_;  // 0 marks the writes before a transfer's last
  Status sent = send_command(d, control::CommitKv{id, index, imm});
  if (!sent.ok()) {
    drop_on_prefill();
    fall_back(id, sent.message());
    return d.dead ? ok_status() : sent;
  }
  const bool into_pool = !target->target.region.empty();
  auto wrote = ask(p, control::SendKv{id, index, a, imm, target->target},
                   std::chrono::milliseconds(c_.timeout_ms * 2), "did not answer a K/V transfer");
  auto added = read_answer(d, std::chrono::milliseconds(c_.timeout_ms * 2),
                           StatusCode::kDeadlineExceeded, "did not answer a prefilled sequence");
  if (!added.ok() && !d.dead) return added.status();
  // The attention worker's Added is the proof: it took the bytes after their
  // immediate. The prefill worker's KvSent only measures the write.
  const auto* kv = wrote.ok() ? std::get_if<control::KvSent>(&*wrote) : nullptr;
  const auto* ok = added.ok() ? std::get_if<control::Added>(&*added) : nullptr;
  if (ok == nullptr) {
    std::string why = why_of(wrote);
    if (why.empty()) why = why_of(added);
    drop_on_prefill();  // its writes are over once it answers this
    if (into_pool && !d.dead) {
      // The blocks the attention worker placed, held until now: no write of
      // this transfer can come any more (the request goes elsewhere below).
      auto c = ask(d, control::Cancel{id}, std::chrono::milliseconds(c_.timeout_ms),
                   "did not answer a cancel");
      if (!c.ok() && !d.dead) return c.status();
    }
    fall_back(id, why.empty() ? std::string("an unexpected answer") : why);
    return ok_status();
  }
  kv_transfer_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (kv == nullptr) drop_on_prefill();  // it arrived, yet the prefill worker may hold it still
  kv_sequences_.fetch_add(1, std::memory_order_relaxed);
  kv_bytes_.fetch_add(kv != nullptr ? kv->bytes : x.bytes, std::memory_order_relaxed);
  if (into_pool) ++kv_into_pool_;
  if (kv != nullptr) {
    kv_write_s_ += kv->seconds;
    kv_writes_ += kv->writes;
  }
  const int64_t load = static_cast<int64_t>(route.prompt.size()) + route.sampling.max_tokens;
  d.load += load;
  in_flight_[id] = a;
  load_of_[id] = load;
  return ok_status();
}

void Router::drop_prefill_worker(WorkerProcess& p, const std::string& why) {
  p.dead = true;
  p.stepping = false;
  p.close_channel();
  p.load = 0;
  std::fprintf(stderr,
               "msinfer: router: %s; its requests are prefilled again (on another prefill "
               "worker if one is alive)\n",
               why.c_str());
  for (auto it = prefilling_.begin(); it != prefilling_.end();) {
    if (it->second != p.index) {
      ++it;
      continue;
    }
    load_of_.erase(it->first);
    if (requests_.count(it->first) != 0) {
      lost_.push_back(it->first);
      prefill_again_.insert(it->first);
    }
    it = prefilling_.erase(it);
  }
}

}  // namespace msinfer::runtime
