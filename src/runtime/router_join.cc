// A replacement joins the running deployment (--respawn after an in-place
// drop; docs/RUNTIME.md, "Failures"): an expert, attention or prefill
// worker.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "internal/joining.h"
#include "internal/line_io.h"
#include "internal/rebalancer.h"
#include "internal/recovery.h"
#include "internal/worker_set.h"
#include "msinfer/runtime/router.h"

namespace msinfer::runtime {

using internal::WorkerProcess;

void Router::abandon_join(const std::string& why) {
  Joining& j = *joining_;
  std::fprintf(stderr, "msinfer: router: the replacement for %s is given up: %s\n",
               name_of(j.w).c_str(), why.c_str());
  if (j.w.pid > 0) {
    ::kill(j.w.pid, SIGKILL);
    int st = 0;
    ::waitpid(j.w.pid, &st, 0);
  }
  j.w.reaped();
  j.w.close_channel();
  joining_.reset();
  publish_health();
}

// step() while an expert worker without replicas is being replaced: the
// join's steps until it is back; a replacement that is given up restarts
// the deployment (recover()) instead.
Status Router::wait_for_replacement() {
  const auto t0 = std::chrono::steady_clock::now();
  while (!awaited_.empty()) {
    MSI_RETURN_IF_ERROR(join_tick());
    if (awaited_.empty()) break;
    MSI_RETURN_IF_ERROR(check_children());
    if (!joining_ && to_replace_.empty()) {
      restart_why_ =
          "expert worker " + std::to_string(awaited_.front()) + "'s replacement did not join";
      restart_without_ = -1;
      shutdown(/*graceful=*/false);
      recovering_ = true;
      publish_health();
      return Status(StatusCode::kUnavailable, restart_why_ + "; the deployment restarts");
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(300) && joining_) {
      abandon_join("not ready within 300 s");
      continue;
    }
    ::usleep(2000);
  }
  return ok_status();
}

// Forks the replacement for the first expert worker to replace. It reads the
// placement from before the loss (a valid one: every worker holds experts),
// of which it loads its own experts.
void Router::start_replacement() {
  const int w = to_replace_.front();
  to_replace_.erase(to_replace_.begin());
  start_joining(
      WorkerRole::kExpert, w,
      [&] {
        return workers_->fork_worker(c_.attention_processes() + w, exe_, *before_loss_,
                                     /*join=*/true);
      },
      before_loss_->shares_on(w), "joins once it has loaded its experts");
}

// Forks the replacement for `role` worker `index` with `fork` and makes it
// the one joining (`shares`: an expert worker's, for its first allgather);
// gives it up, logged, past kMaxRestarts replacements or when the fork fails.
void Router::start_joining(WorkerRole role, int index,
                           const std::function<StatusOr<WorkerProcess>()>& fork,
                           std::vector<std::pair<int, double>> shares, const char* then) {
  const std::string who = std::string(worker_role_name(role)) + " worker " + std::to_string(index);
  if (replacements_ >= kMaxRestarts) {
    std::fprintf(stderr, "msinfer: router: no replacement for %s (%d started already)\n",
                 who.c_str(), replacements_);
    return;
  }
  auto forked = fork();
  if (!forked.ok()) {
    std::fprintf(stderr, "msinfer: router: no replacement for %s: %s\n", who.c_str(),
                 forked.status().message().c_str());
    return;
  }
  ++replacements_;
  ++worker_restarts_[static_cast<int>(role)];
  joining_ = std::make_unique<Joining>(Joining{std::move(forked).value(), 0, std::move(shares), "",
                                               std::chrono::steady_clock::now()});
  std::fprintf(stderr, "msinfer: router: starting a replacement for %s (pid %d); it %s\n",
               who.c_str(), joining_->w.pid, then);
}

// An attention worker's replacement, for dropped attention worker
// attention_to_replace_.front(): it loads the attention weights, then joins
// as the expert replacement does (its allgathers answered with the expert
// processes' dispatch cards). Only one replacement joins at a time, expert
// workers first.
void Router::start_attention_replacement() {
  const int a = attention_to_replace_.front();
  attention_to_replace_.erase(attention_to_replace_.begin());
  // A placement every worker holds experts in (the workers' own check): the
  // one before any expert worker was lost; finish_attention_join drops those.
  start_joining(
      WorkerRole::kAttention, a,
      [&] {
        return workers_->fork_worker(a * c_.tp_attention, exe_,
                                     experts_lost_ > 0 ? *before_loss_ : c_.placement,
                                     /*join=*/true);
      },
      {}, "joins once it has loaded its weights");
}

// The first allgather wires the replacement: an expert worker's answers to
// the attention workers' combine regions (a dead one's card is a live one's:
// nothing is ever sent to it, DropAttention in finish_join), an attention
// worker's dispatch to the expert processes' regions (likewise for a dead
// one: DropExpert in finish_attention_join); the second is a barrier.
Status Router::answer_join_allgather(const std::string& blob) {
  Joining& j = *joining_;
  const int A = c_.attention_workers, P = c_.processes();
  control::JoinBlobs answer;
  answer.blobs.assign(static_cast<size_t>(P), "");
  if (j.stage == 0 && j.w.role == WorkerRole::kAttention) {
    j.card = blob;
    std::string live_card;
    std::vector<WorkerProcess>& all = workers_->all();
    for (size_t i = static_cast<size_t>(c_.attention_processes()); i < all.size(); ++i) {
      if (all[i].dead) continue;
      auto e = ask(all[i], control::GetCard{});
      // A death meanwhile that stops or restarts the deployment gave the
      // replacement up (shutdown): the step ends with it.
      if (!joining_) return e.ok() ? unavailable("the replacement was given up") : e.status();
      auto card = e.ok() ? control::expect<control::CardInfo>(std::move(e).value(), name_of(all[i]))
                         : StatusOr<control::CardInfo>(e.status());
      if (!card.ok()) {
        abandon_join(card.status().message());
        return ok_status();
      }
      answer.blobs[i] = live_card = card->card;
    }
    for (size_t i = static_cast<size_t>(c_.attention_processes()); i < all.size(); ++i) {
      if (all[i].dead) answer.blobs[i] = live_card;
    }
  } else if (j.stage == 0) {
    j.card = blob;
    std::string live_card;
    for (int a = 0; a < A; ++a) {
      if (lead(a).dead) continue;
      auto e = ask(lead(a), control::GetCard{});
      if (!joining_) return e.ok() ? unavailable("the replacement was given up") : e.status();
      auto card = e.ok()
                      ? control::expect<control::CardInfo>(std::move(e).value(), name_of(lead(a)))
                      : StatusOr<control::CardInfo>(e.status());
      if (!card.ok()) {
        abandon_join(card.status().message());
        return ok_status();
      }
      answer.blobs[static_cast<size_t>(a)] = live_card = card->card;
    }
    for (int a = 0; a < A; ++a) {
      if (lead(a).dead) answer.blobs[static_cast<size_t>(a)] = live_card;
    }
  }
  ++j.stage;
  if (!internal::write_line(j.w.in, control::encode(control::Command{std::move(answer)}))) {
    abandon_join("its pipe closed");
  }
  return ok_status();
}

// The units exchanged so far, asked of the first live attention worker
// (GetCard) and set on the replacement `w` (SetUnits): its answer, or why
// there is none (also when the join was given up while asking).
StatusOr<control::Event> Router::set_units_from_live_attention(internal::WorkerProcess& w) {
  std::optional<std::vector<int64_t>> units;
  for (int a = 0; a < c_.attention_workers && !units; ++a) {
    if (lead(a).dead) continue;
    auto e = ask(lead(a), control::GetCard{});
    if (!joining_) return e.ok() ? unavailable("the replacement was given up") : e.status();
    if (auto* card = e.ok() ? std::get_if<control::CardInfo>(&*e) : nullptr) units = card->units;
  }
  if (!units) return unavailable("no attention worker answered");
  return ask(w, control::SetUnits{*units});
}

// Ready: it serves no dead attention worker, continues the sequence numbers
// from the units exchanged so far, and from the next step the attention
// workers send it its experts' share of the rows.
Status Router::finish_join(const control::Ready& ready) {
  Joining& j = *joining_;
  const int A = c_.attention_workers;
  Status version = control::check_protocol(ready.protocol, name_of(j.w));
  if (!version.ok()) {
    abandon_join(version.message());
    return ok_status();
  }
  for (int a = 0; a < A; ++a) {
    if (lead(a).dead) internal::write_line(j.w.in, control::encode(control::DropAttention{a}));
  }
  auto set = set_units_from_live_attention(j.w);
  if (!joining_) return set.ok() ? unavailable("the replacement was given up") : set.status();
  if (!set.ok() || !std::holds_alternative<control::UnitsSet>(*set)) {
    abandon_join(set.ok() ? control::encode(*set) : set.status().message());
    return ok_status();
  }
  WorkerProcess& slot = workers_->all()[static_cast<size_t>(c_.attention_processes() + j.w.index)];
  const int w = j.w.index;
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - j.since).count();
  const auto shares = j.shares;
  const std::string card = j.card;
  slot = j.w;  // watched from now on: a death is dropped (or reported) as any worker's
  slot.dead = false;
  slot.rss_mb = ready.rss_mb;
  joining_.reset();
  c_.placement = c_.placement.with_worker(w, shares).value();
  --experts_lost_;
  ++joined_;
  awaited_.erase(std::remove(awaited_.begin(), awaited_.end(), w), awaited_.end());
  const control::AddExpert add{w, card, shares};
  for (int a = 0; a < A; ++a) {
    if (lead(a).dead) continue;
    auto e = ask(lead(a), add);
    if (!e.ok() && lead(a).dead) continue;  // dropped meanwhile
    MSI_RETURN_IF_ERROR(e.status());
    if (!std::holds_alternative<control::ExpertAdded>(*e)) {
      return internal_error(name_of(lead(a)) + ": " + control::encode(*e));
    }
  }
  publish_health();
  std::fprintf(stderr,
               "msinfer: router: expert worker %d is back (pid %d, %.2f s after it was "
               "started): its experts' rows go to it again\n",
               w, slot.pid, took);
  return ok_status();
}

// An attention worker's replacement is ready: it drops the expert workers
// that are gone (as the others did), continues the sequence numbers from the
// units exchanged so far, and routes by the placement in effect; then every
// expert process serves it, and it takes its place: new requests may go to
// it from the next step on. Its predecessor's requests were resubmitted to
// the others (--resubmit) or failed when it died.
Status Router::finish_attention_join(const control::Ready& ready) {
  Joining& j = *joining_;
  const int a = j.w.index;
  Status version = control::check_protocol(ready.protocol, name_of(j.w));
  if (!version.ok()) {
    abandon_join(version.message());
    return ok_status();
  }
  for (const WorkerProcess& e : workers_->all()) {
    if (e.role != WorkerRole::kExpert || !e.dead || e.tp_rank != 0) continue;
    const bool awaited = std::find(awaited_.begin(), awaited_.end(), e.index) != awaited_.end();
    internal::write_line(j.w.in, control::encode(control::DropExpert{e.index, awaited}));
  }
  auto set = set_units_from_live_attention(j.w);
  if (!joining_) return set.ok() ? unavailable("the replacement was given up") : set.status();
  if (set.ok() && std::holds_alternative<control::UnitsSet>(*set) && experts_lost_ == 0) {
    set = ask(j.w, control::SetPlacement{c_.placement});  // a rebalance may have switched
    if (!joining_) return set.ok() ? unavailable("the replacement was given up") : set.status();
    if (set.ok() && std::holds_alternative<control::PlacementSet>(*set)) set = control::Event{control::UnitsSet{}};
  }
  if (!set.ok() || !std::holds_alternative<control::UnitsSet>(*set)) {
    abandon_join(set.ok() ? control::encode(*set) : set.status().message());
    return ok_status();
  }
  // From here the expert processes restore it one by one: it must join (or
  // the deployment stops), since a step needs its messages on those that did.
  const control::AddAttention add{a, j.card};
  WorkerProcess& slot = lead(a);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - j.since).count();
  counters_before_ += slot.counters;
  slot = j.w;  // watched from now on: a death is dropped (or reported) as any worker's
  slot.dead = false;
  slot.rss_mb = ready.rss_mb;
  slot.load = 0;
  slot.kv_usage = 0;
  slot.counters = {};
  slot.prefix_salt = ready.prefix_salt;  // its cache starts empty: so does its index
  slot.kv_block_size = ready.kv_block_size;
  slot.prefix_index.clear();
  joining_.reset();
  ++joined_;
  for (WorkerProcess& e : workers_->all()) {
    if (e.role != WorkerRole::kExpert || e.dead) continue;
    // An error ends the step, and step() the deployment (or restarts it).
    auto ev = ask(e, add);
    if (!ev.ok() && e.dead) continue;  // dropped meanwhile
    MSI_RETURN_IF_ERROR(ev.status());
    if (!std::holds_alternative<control::AttentionAdded>(*ev)) {
      return internal_error(name_of(e) + ": " + control::encode(*ev));
    }
  }
  publish_health();
  std::fprintf(stderr,
               "msinfer: router: attention worker %d is back (pid %d, %.2f s after it was "
               "started): new requests go to it again\n",
               a, slot.pid, took);
  return ok_status();
}

// prefill_to_replace_.front(): a prefill worker needs no bootstrap and no
// other worker changes for it; its replacement loads the weights while the
// deployment serves (requests are prefilled on the attention workers, or the
// other prefill workers, meanwhile).
void Router::start_prefill_replacement() {
  const int p = prefill_to_replace_.front();
  prefill_to_replace_.erase(prefill_to_replace_.begin());
  start_joining(
      WorkerRole::kPrefill, p, [&] { return workers_->fork_prefill_worker(p, exe_); }, {},
      "takes requests once it has loaded its weights");
}

Status Router::finish_prefill_join(const control::Ready& ready) {
  Joining& j = *joining_;
  Status version = control::check_protocol(ready.protocol, name_of(j.w));
  if (!version.ok()) {
    abandon_join(version.message());
    return ok_status();
  }
  control::ConnectKv connect;
  for (int a = 0; a < c_.attention_workers; ++a) {
    connect.cards.push_back(lead(a).dead ? std::string() : lead(a).kv_card);
  }
  auto e = ask(j.w, connect);
  if (!joining_) return e.ok() ? unavailable("the replacement was given up") : e.status();
  if (!e.ok() || !std::holds_alternative<control::KvConnected>(*e)) {
    abandon_join(e.ok() ? control::encode(*e) : e.status().message());
    return ok_status();
  }
  const int p = j.w.index;
  WorkerProcess& slot = workers_->prefill(p);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - j.since).count();
  slot = j.w;  // watched from now on: a death is handled as any prefill worker's
  slot.dead = false;
  slot.stepping = false;
  slot.rss_mb = ready.rss_mb;
  slot.load = 0;
  slot.counters = {};
  joining_.reset();
  ++joined_;
  publish_health();
  std::fprintf(stderr,
               "msinfer: router: prefill worker %d is back (pid %d, %.2f s after it was "
               "started): new requests are prefilled on it again\n",
               p, slot.pid, took);
  return ok_status();
}

Status Router::join_tick() {
  if (!stopped_.ok()) return ok_status();  // nothing joins a deployment that stopped
  if (!joining_) {
    if (!to_replace_.empty() && serving_) {
      start_replacement();
    } else if (!attention_to_replace_.empty() && serving_ && !rebalancer_->switching()) {
      start_attention_replacement();
    } else if (!prefill_to_replace_.empty() && serving_) {
      start_prefill_replacement();
    }
    return ok_status();
  }
  Joining& j = *joining_;
  int st = 0;
  if (::waitpid(j.w.pid, &st, WNOHANG) == j.w.pid) {
    ++deaths_[static_cast<int>(j.w.role)];
    j.w.reaped();
    abandon_join("it died while joining");
    return ok_status();
  }
  std::string line;
  const std::string who = "the replacement for " + name_of(j.w);
  while (joining_ && internal::read_line(joining_->w.out, &joining_->w.buf, &line, 0)) {
    auto e = control::decode_event(line, who);
    if (!e.ok()) {
      abandon_join(e.status().message());
      return ok_status();
    }
    if (auto* g = std::get_if<control::JoinAllgather>(&*e)) {
      MSI_RETURN_IF_ERROR(answer_join_allgather(g->blob));
      continue;
    }
    if (auto* r = std::get_if<control::Ready>(&*e)) {
      switch (joining_->w.role) {
        case WorkerRole::kAttention:
          return finish_attention_join(*r);
        case WorkerRole::kPrefill:
          return finish_prefill_join(*r);
        default:
          return finish_join(*r);
      }
    }
    abandon_join(line);
    return ok_status();
  }
  return ok_status();
}

}  // namespace msinfer::runtime
