// A replacement expert worker joins the running deployment (--respawn after
// an in-place drop; docs/RUNTIME.md, "Failures").
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "internal/joining.h"
#include "internal/line_io.h"
#include "internal/recovery.h"
#include "internal/worker_set.h"
#include "msinfer/runtime/router.h"

namespace msinfer::runtime {

using internal::WorkerProcess;

void Router::abandon_join(const std::string& why) {
  Joining& j = *joining_;
  std::fprintf(stderr, "msinfer: router: the replacement for expert worker %d is given up: %s\n",
               j.w.index, why.c_str());
  if (j.w.pid > 0) {
    ::kill(j.w.pid, SIGKILL);
    int st = 0;
    ::waitpid(j.w.pid, &st, 0);
  }
  j.w.reaped();
  j.w.close_channel();
  joining_.reset();
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
  if (replacements_ >= kMaxRestarts) {
    std::fprintf(stderr,
                 "msinfer: router: no replacement for expert worker %d (%d started already)\n", w,
                 replacements_);
    return;
  }
  auto file = write_placement_file("join", *before_loss_);
  if (!file.ok()) {
    std::fprintf(stderr, "msinfer: router: no replacement: %s\n", file.status().message().c_str());
    return;
  }
  join_placement_file_ = *file;
  auto forked = workers_->fork_worker(c_.attention_processes() + w, exe_, join_placement_file_,
                                      /*join=*/true);
  if (!forked.ok()) {
    std::fprintf(stderr, "msinfer: router: no replacement for expert worker %d: %s\n", w,
                 forked.status().message().c_str());
    return;
  }
  ++replacements_;
  joining_ =
      std::make_unique<Joining>(Joining{std::move(forked).value(), 0, before_loss_->shares_on(w),
                                        "", std::chrono::steady_clock::now()});
  std::fprintf(stderr,
               "msinfer: router: starting a replacement for expert worker %d (pid %d); it "
               "joins once it has loaded its experts\n",
               w, joining_->w.pid);
}

// The first allgather wires its answers to the attention workers' combine
// regions (a dead one's card is a live one's: nothing is ever sent to it,
// DropAttention in finish_join); the second is a barrier.
Status Router::answer_join_allgather(const std::string& blob) {
  Joining& j = *joining_;
  const int A = c_.attention_workers, P = c_.processes();
  control::JoinBlobs answer;
  answer.blobs.assign(static_cast<size_t>(P), "");
  if (j.stage == 0) {
    j.card = blob;
    std::string live_card;
    for (int a = 0; a < A; ++a) {
      if (lead(a).dead) continue;
      auto e = ask(lead(a), control::GetCard{});
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
  std::optional<std::vector<int64_t>> units;
  for (int a = 0; a < A && !units; ++a) {
    if (lead(a).dead) continue;
    auto e = ask(lead(a), control::GetCard{});
    if (auto* card = e.ok() ? std::get_if<control::CardInfo>(&*e) : nullptr) units = card->units;
  }
  auto set = units ? ask(j.w, control::SetUnits{*units})
                   : StatusOr<control::Event>(unavailable("no attention worker answered"));
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
  std::fprintf(stderr,
               "msinfer: router: expert worker %d is back (pid %d, %.2f s after it was "
               "started): its experts' rows go to it again\n",
               w, slot.pid, took);
  return ok_status();
}

Status Router::join_tick() {
  if (!joining_) {
    if (!to_replace_.empty() && serving_) start_replacement();
    return ok_status();
  }
  Joining& j = *joining_;
  int st = 0;
  if (::waitpid(j.w.pid, &st, WNOHANG) == j.w.pid) {
    j.w.reaped();
    abandon_join("it died while joining");
    return ok_status();
  }
  std::string line;
  const std::string who = "the replacement for expert worker " + std::to_string(j.w.index);
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
    if (auto* r = std::get_if<control::Ready>(&*e)) return finish_join(*r);
    abandon_join(line);
    return ok_status();
  }
  return ok_status();
}

}  // namespace msinfer::runtime
