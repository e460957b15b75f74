// The router: schedules steps over its workers (worker_set.cc), carries out
// what the recovery policy decides for a death (recovery.cc), and runs the
// rebalancer (rebalancer.cc) between steps; a replacement's join is
// router_join.cc.
#include "msinfer/runtime/router.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "internal/joining.h"
#include "internal/line_io.h"
#include "internal/rebalancer.h"
#include "internal/recovery.h"
#include "internal/worker_set.h"
#include "msinfer/runtime/prefix_hash.h"

namespace msinfer::runtime {

using internal::DeathAction;
using internal::WorkerProcess;

namespace {

// The one event of a request the deployment lost (TokenEvent::error).
TokenEvent error_event(int64_t id, std::string why) {
  TokenEvent ev;
  ev.request_id = id;
  ev.finished = true;
  ev.finish_reason = FinishReason::kError;
  ev.error = std::move(why);
  return ev;
}

}  // namespace

Router::Router() = default;

Router::~Router() { shutdown(); }

// What start() and start_launched() share: the configuration, the worker
// set, the expected workers by role, the rebalancer.
StatusOr<std::unique_ptr<Router>> Router::create(const WorkerConfig& c) {
  auto r = std::unique_ptr<Router>(new Router());
  r->c_ = c;
  r->workers_ = std::make_unique<internal::WorkerSet>(r->c_);
  r->expected_[static_cast<int>(WorkerRole::kAttention)] = c.attention_workers;
  r->expected_[static_cast<int>(WorkerRole::kExpert)] = c.expert_workers;
  r->expected_[static_cast<int>(WorkerRole::kPrefill)] = c.prefill_workers;
  Router* self = r.get();
  r->rebalancer_ = std::make_unique<internal::Rebalancer>(
      r->c_, *r->workers_,
      [self](WorkerProcess& w, const control::Command& cmd) { return self->ask(w, cmd); });
  MSI_RETURN_IF_ERROR(r->rebalancer_->init());
  return r;
}

StatusOr<std::unique_ptr<Router>> Router::start(const WorkerConfig& c, const std::string& exe) {
  MSI_ASSIGN_OR_RETURN(std::unique_ptr<Router> r, create(c));
  r->exe_ = exe;
  MSI_RETURN_IF_ERROR(r->spawn());
  return r;
}

StatusOr<std::unique_ptr<Router>> Router::start_launched(const WorkerConfig& c,
                                                         comm::Bootstrap& launcher) {
  MSI_RETURN_IF_ERROR(internal::check_launcher_size(c, launcher));
  MSI_ASSIGN_OR_RETURN(std::unique_ptr<Router> r, create(c));
  MSI_RETURN_IF_ERROR(r->workers_->accept_launched(launcher));
  MSI_RETURN_IF_ERROR(r->wait_ready());
  return r;
}

Status Router::spawn() {
  serving_ = false;
  MSI_RETURN_IF_ERROR(workers_->spawn(exe_));
  return wait_ready();
}

// Every worker says Ready (with its resident memory and protocol version)
// once its weights are loaded and the M2N wiring (which needs every worker)
// is done.
Status Router::wait_ready() {
  for (WorkerProcess& w : workers_->all()) {
    MSI_ASSIGN_OR_RETURN(control::Event e,
                         read_answer(w, std::chrono::seconds(300), StatusCode::kUnavailable,
                                     "did not start within 300 s"));
    auto* ready = std::get_if<control::Ready>(&e);
    if (ready == nullptr) {
      return Status(StatusCode::kUnavailable, name_of(w) + ": " + control::encode(e));
    }
    MSI_RETURN_IF_ERROR(control::check_protocol(ready->protocol, name_of(w)));
    w.rss_mb = ready->rss_mb;
    w.prefix_salt = ready->prefix_salt;
    w.kv_block_size = ready->kv_block_size;
    w.kv_card = ready->kv_card;
  }
  MSI_RETURN_IF_ERROR(connect_prefill_workers());
  serving_ = true;
  publish_health();
  return ok_status();
}

std::string Router::name_of(const WorkerProcess& w) const { return workers_->name_of(w); }
WorkerProcess& Router::lead(int a) { return workers_->lead(a); }
const WorkerProcess& Router::lead(int a) const { return workers_->lead(a); }

Status Router::send_command(WorkerProcess& w, const control::Command& c) {
  if (workers_->send(w, c)) return ok_status();
  // A closed channel: the worker is going; give its death up to a second to
  // become visible (a SIGKILLed child is reaped a moment after its pipe
  // closes), so it is reported, or dropped, as a death.
  for (int i = 0; i < 100 && !w.dead; ++i) {
    MSI_RETURN_IF_ERROR(check_children());
    if (!w.dead) ::usleep(10000);
  }
  return Status(StatusCode::kUnavailable, name_of(w) + (w.dead ? " died" : " is gone"));
}

// The wait ends at the answer or at the exit of any forked worker (its
// pidfd), and the children are looked at then and every 50 ms: a worker's
// death is noticed as it happens, not at the next look (an expert worker
// dropped in place costs a client 12-15 ms; 50 ms with looks alone).
StatusOr<control::Event> Router::read_answer(WorkerProcess& w, std::chrono::milliseconds timeout,
                                             StatusCode code, const std::string& late) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  auto got_line = [&](bool* eof) {
    return !w.dead && w.out >= 0 && internal::read_line(w.out, &w.buf, &line, 0, eof);
  };
  while (timeout.count() < 0 || std::chrono::steady_clock::now() < deadline) {
    bool eof = false;
    if (got_line(&eof)) return control::decode_event(line, name_of(w));
    workers_->wait(eof ? nullptr : &w, 50);
    if (got_line(nullptr)) return control::decode_event(line, name_of(w));
    MSI_RETURN_IF_ERROR(check_children());
    if (w.dead) return Status(StatusCode::kUnavailable, name_of(w) + " died");
  }
  return Status(code, name_of(w) + " " + late);
}

StatusOr<control::Event> Router::ask(WorkerProcess& w, const control::Command& c,
                                     std::chrono::milliseconds timeout, const std::string& late) {
  MSI_RETURN_IF_ERROR(send_command(w, c));
  return read_answer(w, timeout, StatusCode::kDeadlineExceeded, late);
}

StatusOr<control::Event> Router::ask(WorkerProcess& w, const control::Command& c) {
  return ask(w, c, std::chrono::milliseconds(c_.timeout_ms),
             std::string("did not answer '") + control::op_name(c) + "'");
}

void Router::shutdown(bool graceful) {
  if (joining_) abandon_join("the deployment stops");
  if (workers_) workers_->stop(graceful);
}

internal::DeploymentState Router::deployment_state() const {
  internal::DeploymentState s;
  s.serving = serving_;
  s.switching = rebalancer_ && rebalancer_->switching();
  s.forked = !exe_.empty();
  s.restarts = restarts_;
  s.replacements = replacements_ + static_cast<int>(to_replace_.size()) +
                   static_cast<int>(attention_to_replace_.size());
  s.live_attention_workers = workers_->live_attention_workers();
  return s;
}

Status Router::check_children() {
  while (auto d = workers_->next_death()) MSI_RETURN_IF_ERROR(on_death(*d));
  return ok_status();
}

Status Router::on_death(const internal::WorkerDeath& d) {
  WorkerProcess& w = workers_->all()[d.slot];
  if (w.role == WorkerRole::kPrefill) {
    // Its requests are prefilled again elsewhere; nothing else depends on it.
    ++deaths_[static_cast<int>(WorkerRole::kPrefill)];
    drop_prefill_worker(w, d.how);
    if (internal::replaceable(c_, deployment_state(), w)) prefill_to_replace_.push_back(w.index);
    publish_health();
    return ok_status();
  }
  ++deaths_[static_cast<int>(w.role)];
  switch (internal::decide_recovery(c_, deployment_state(), w, d.code)) {
    case DeathAction::kDropAttention:
      drop_attention_worker(w.index, d.how);
      publish_health();
      return ok_status();
    case DeathAction::kDropExpert:
      drop_expert_worker(w, d.how, /*keep_placement=*/false);
      publish_health();
      return ok_status();
    case DeathAction::kAwaitReplacement:
      drop_expert_worker(w, d.how, /*keep_placement=*/true);
      publish_health();
      return ok_status();
    case DeathAction::kRestart:
      // The caller's operation ends here; the public call that made it
      // restarts the deployment (recover()) and goes on.
      restart_why_ = d.how;
      restart_without_ = w.role == WorkerRole::kExpert && !c_.respawn ? w.index : -1;
      shutdown(/*graceful=*/false);
      recovering_ = true;
      publish_health();
      return Status(StatusCode::kUnavailable, d.how + "; the deployment restarts");
    case DeathAction::kFail:
      break;
  }
  return fail_deployment(Status(d.code, d.how));
}

Status Router::fail_deployment(Status why) {
  shutdown();
  stopped_ = std::move(why);
  // Every request in flight fails with it (the caller's error, or the
  // scheduler's for the others): none is running and no KV block is held.
  in_flight_.clear();
  prefilling_.clear();
  prefill_events_.clear();
  prefill_again_.clear();
  load_of_.clear();
  requests_.clear();
  lost_.clear();
  failed_.clear();
  for (int a = 0; a < c_.attention_workers; ++a) {
    lead(a).load = 0;
    lead(a).kv_usage = 0;
    lead(a).prefix_index.clear();
  }
  recovering_ = false;
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stop_reason_ = stopped_.message();
  }
  publish_health();
  return stopped_;
}

// A worker is live while none of its processes died, was dropped or stopped
// (a stopped process's channel is closed).
void Router::publish_health() {
  std::vector<char> up[3] = {std::vector<char>(static_cast<size_t>(c_.attention_workers), 1),
                             std::vector<char>(static_cast<size_t>(c_.expert_workers), 1),
                             std::vector<char>(static_cast<size_t>(c_.prefill_workers), 1)};
  if (workers_->all().empty()) {
    for (auto& v : up) v.assign(v.size(), 0);
  }
  for (const WorkerProcess& w : workers_->all()) {
    auto& v = up[static_cast<int>(w.role)];
    if (w.index >= 0 && w.index < static_cast<int>(v.size()) && (w.dead || w.in < 0)) {
      v[static_cast<size_t>(w.index)] = 0;
    }
  }
  for (int r = 0; r < 3; ++r) {
    live_[r].store(static_cast<int>(std::count(up[r].begin(), up[r].end(), 1)),
                   std::memory_order_relaxed);
  }
  recovering_now_.store(recovering_ || !awaited_.empty(), std::memory_order_relaxed);
  stopped_now_.store(!stopped_.ok(), std::memory_order_relaxed);
}

DeploymentHealth Router::health() const {
  auto role = [&](WorkerRole r) {
    const int i = static_cast<int>(r);
    RoleHealth h;
    h.live = live_[i].load(std::memory_order_relaxed);
    h.expected = expected_[i].load(std::memory_order_relaxed);
    h.deaths = deaths_[i].load(std::memory_order_relaxed);
    h.restarts = worker_restarts_[i].load(std::memory_order_relaxed);
    return h;
  };
  DeploymentHealth d;
  d.attention = role(WorkerRole::kAttention);
  d.expert = role(WorkerRole::kExpert);
  d.prefill = role(WorkerRole::kPrefill);
  d.kv_transfers = kv_sequences_.load(std::memory_order_relaxed);
  d.kv_transfer_bytes = kv_bytes_.load(std::memory_order_relaxed);
  d.kv_transfer_fallbacks = kv_fallbacks_.load(std::memory_order_relaxed);
  d.recovering = recovering_now_.load(std::memory_order_relaxed);
  d.stopped = stopped_now_.load(std::memory_order_relaxed);
  if (d.stopped) {
    std::lock_guard<std::mutex> l(stop_mu_);
    d.error = stop_reason_;
  }
  return d;
}

Status Router::recover() {
  // A recovery that cannot go on stops the deployment with the death's cause.
  auto give_up = [&](const std::string& why, const std::string& because) {
    return fail_deployment(
        Status(StatusCode::kUnavailable, why + " (no restart: " + because + ")"));
  };
  while (!restart_why_.empty()) {
    const std::string why = restart_why_;
    restart_why_.clear();
    if (restarts_ >= kMaxRestarts) {
      return give_up(why, std::to_string(kMaxRestarts) + " restarts already");
    }
    ++restarts_;
    rebalancer_->forget();  // the new workers hold the placement in effect
    const auto t0 = std::chrono::steady_clock::now();
    // Left out: the dead expert worker (restart_without_), and those dropped
    // in place before (they hold nothing), highest index first so that the
    // others' numbers stay right until they are removed.
    std::vector<int> gone;
    if (restart_without_ >= 0) gone.push_back(restart_without_);
    for (const WorkerProcess& w : workers_->all()) {
      if (w.role == WorkerRole::kExpert && w.dead && w.index != restart_without_) {
        gone.push_back(w.index);
      }
    }
    std::sort(gone.rbegin(), gone.rend());
    for (int g : gone) {
      auto p = c_.placement.without(g);
      if (!p.ok()) return give_up(why, p.status().message());
      c_.placement = std::move(p).value();
      c_.expert_workers -= 1;
    }
    experts_lost_ = 0;
    for (int a = 0; a < c_.attention_workers; ++a) {
      counters_before_ += lead(a).counters;
    }
    to_replace_.clear();  // the restart starts every worker
    attention_to_replace_.clear();
    prefill_to_replace_.clear();
    awaited_.clear();
    before_loss_.reset();
    std::fprintf(
        stderr, "msinfer: router: %s; restarting the deployment %s (restart %d of at most %d)\n",
        why.c_str(),
        restart_without_ >= 0 ? "without it (its experts on their replicas)" : "with a replacement",
        restarts_, kMaxRestarts);
    Status s = spawn();
    if (!s.ok()) {
      if (!restart_why_.empty()) continue;  // another death while starting
      return fail_deployment(s.with_context("restarting the deployment after " + why));
    }
    worker_restarts_[static_cast<int>(WorkerRole::kAttention)] += c_.attention_workers;
    worker_restarts_[static_cast<int>(WorkerRole::kExpert)] += c_.expert_workers;
    worker_restarts_[static_cast<int>(WorkerRole::kPrefill)] += c_.prefill_workers;
    recovering_ = false;
    publish_health();
    // Every request in flight starts again from prompt + delivered tokens.
    for (const auto& [id, a] : in_flight_) lost_.push_back(id);
    for (const auto& [id, p] : prefilling_) lost_.push_back(id);
    in_flight_.clear();
    prefilling_.clear();
    load_of_.clear();
    std::fprintf(stderr, "msinfer: router: restarted in %.2f s; resubmitting %zu request(s)\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 lost_.size());
    s = resubmit_lost();
    if (!s.ok() && restart_why_.empty()) return s;
  }
  return ok_status();
}

void Router::drop_expert_worker(WorkerProcess& w, const std::string& why, bool keep_placement) {
  w.dead = true;
  w.close_channel();
  if (experts_lost_ == 0) before_loss_ = c_.placement;
  ++experts_lost_;
  if (keep_placement) {
    // Its replacement is awaited first: serving waits for it.
    to_replace_.insert(to_replace_.begin(), w.index);
    awaited_.push_back(w.index);
    std::fprintf(stderr,
                 "msinfer: router: %s; some of its experts have no replica: serving pauses until "
                 "its replacement joins, and a step it was in runs again\n",
                 why.c_str());
  } else {
    c_.placement = c_.placement.emptied(w.index).value();  // the policy checked it
    if (internal::replaceable(c_, deployment_state(), w)) to_replace_.push_back(w.index);
    std::fprintf(stderr,
                 "msinfer: router: %s; its experts' rows go to their replicas on the other expert "
                 "workers, a step it was in runs again\n",
                 why.c_str());
  }
  // An attention worker reads it mid-step (waiting for the dead worker's
  // answer) or before its next command; a closed pipe here is its own death,
  // which the next check reports. With keep_placement it routes as before:
  // no step runs until the replacement is back.
  const control::DropExpert drop{w.index, keep_placement};
  for (int a = 0; a < c_.attention_workers; ++a) workers_->send(lead(a), drop);
  if (c_.rebalance_every > 0 && experts_lost_ == 1) {
    std::fprintf(stderr,
                 "msinfer: router: online rebalancing stops (it would place experts on "
                 "every expert worker, the lost one too)\n");
  }
}

int Router::live_attention_workers() const { return workers_->live_attention_workers(); }

int64_t Router::indexed_blocks(int a) const {
  return a >= 0 && a < c_.attention_workers ? lead(a).prefix_index.size() : 0;
}

pid_t Router::pid_of(WorkerRole role, int index) const { return workers_->pid_of(role, index); }

pid_t Router::pid_of(const std::string& role, int index) const {
  auto r = parse_worker_role(role);
  return r.ok() ? pid_of(*r, index) : -1;
}

void Router::drop_attention_worker(int a, const std::string& why) {
  WorkerProcess& w = lead(a);
  w.dead = true;
  w.close_channel();
  w.load = 0;
  w.kv_usage = 0;
  w.prefix_index.clear();  // its cache died with it: nothing is routed to it by its prefixes
  const bool replace = internal::can_replace_attention(c_, deployment_state(), w);
  if (replace) attention_to_replace_.push_back(a);
  std::fprintf(stderr, "msinfer: router: %s; %d attention worker(s) go on%s%s\n", why.c_str(),
               live_attention_workers(),
               c_.resubmit ? ", its requests are resubmitted to them" : "",
               replace ? "; a replacement joins them" : "");
  // The expert processes stop waiting for it (a closed pipe here is an
  // expert's death, which the next check reports).
  for (WorkerProcess& e : workers_->all()) {
    if (e.role == WorkerRole::kExpert && e.in >= 0) workers_->send(e, control::DropAttention{a});
  }
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second != a) {
      ++it;
      continue;
    }
    const int64_t id = it->first;
    load_of_.erase(id);
    it = in_flight_.erase(it);
    if (c_.resubmit) {
      lost_.push_back(id);
      continue;
    }
    requests_.erase(id);
    failed_.push_back(error_event(id, "request " + std::to_string(id) + " was lost: " + why));
  }
}

Status Router::resubmit_lost() {
  // submit() may find another worker dead and add to lost_ and failed_.
  while (!lost_.empty()) {
    const int64_t id = lost_.back();
    lost_.pop_back();
    auto t = requests_.find(id);
    if (t == requests_.end()) continue;  // cancelled meanwhile
    if (t->second.request.n > 1 && !t->second.delivered.empty()) {
      // Its n sequences have tokens of their own: the new worker would have
      // to prefill each; not done.
      requests_.erase(t);
      failed_.push_back(error_event(id, "request " + std::to_string(id) +
                                            " (n > 1) was lost after its first tokens: only "
                                            "requests with one sequence resume elsewhere"));
      continue;
    }
    GenerationRequest r = t->second.request;
    r.prompt.insert(r.prompt.end(), t->second.delivered.begin(), t->second.delivered.end());
    r.sampling.max_tokens -= static_cast<int>(t->second.delivered.size());
    // A dead prefill worker's request goes to another prefill worker when
    // one is alive; any other goes to an attention worker.
    if (prefill_again_.erase(id) != 0 && r.n == 1) {
      auto sent = submit_prefill(r);
      if (sent.ok() && *sent) continue;
    }
    Status s = submit(r);
    if (s.ok()) continue;
    if (!restart_why_.empty()) {  // recover() resubmits it after the restart
      lost_.push_back(id);
      return s;
    }
    MSI_RETURN_IF_ERROR(stopped_);  // the deployment stopped: every request fails with it
    requests_.erase(t);
    failed_.push_back(error_event(
        id, "request " + std::to_string(id) + " could not be resubmitted: " + s.message()));
  }
  return ok_status();
}

// Runs `op` (add, cancel or stats); when it failed on a death the router
// recovers from, restarts the deployment and runs it once more.
template <typename Op>
auto Router::retried_after_restart(Op op) -> decltype(op()) {
  auto result = op();
  if (result.ok() || restart_why_.empty()) return result;
  MSI_RETURN_IF_ERROR(recover());
  return op();
}

Status Router::add(const GenerationRequest& r) {
  MSI_RETURN_IF_ERROR(stopped_);
  MSI_RETURN_IF_ERROR(retried_after_restart([&]() -> Status {
    // A request of one sequence is prefilled on a prefill worker where one
    // is alive (n > 1: each sequence would move its own copy of the
    // prompt's K/V; not done).
    if (r.n == 1 && c_.prefill_workers > 0) {
      MSI_ASSIGN_OR_RETURN(bool sent, submit_prefill(r));
      if (sent) return ok_status();
    }
    return submit(r);
  }));
  requests_[r.id] = Tracked{r, {}, r.n};
  return ok_status();
}

Status Router::submit(const GenerationRequest& r) {
  if (!restart_why_.empty())
    return Status(StatusCode::kUnavailable, "the deployment is restarting");
  // The live attention worker the routing policy picks (routing_policy.h):
  // under cache-aware routing the one whose prefix index holds the longest
  // prefix of the request's block chain, within the load slack of the least
  // loaded. One that dies while taking the request is dropped and the next
  // one tried.
  const int best = choose_attention_worker(r);
  if (best < 0) return Status(StatusCode::kUnavailable, "no attention worker is alive");
  auto e = ask(lead(best), control::Add{r}, std::chrono::milliseconds(-1), "");
  if (!e.ok()) {
    if (lead(best).dead) return submit(r);  // it died: try the others
    return e.status();
  }
  if (auto* refused = std::get_if<control::Refused>(&*e)) {
    return Status(StatusCode::kResourceExhausted,
                  refused->error.empty() ? std::string("refused") : refused->error);
  }
  MSI_RETURN_IF_ERROR(
      control::expect<control::Added>(std::move(e).value(), name_of(lead(best))).status());
  const int64_t load = static_cast<int64_t>(r.prompt.size()) + int64_t{r.n} * r.sampling.max_tokens;
  lead(best).load += load;
  in_flight_[r.id] = best;
  load_of_[r.id] = load;
  return ok_status();
}

int Router::choose_attention_worker(const GenerationRequest& r) {
  const int n = c_.attention_workers;
  std::vector<ReplicaView> view(static_cast<size_t>(n));
  for (int a = 0; a < n; ++a) {
    view[static_cast<size_t>(a)].live = !lead(a).dead;
    view[static_cast<size_t>(a)].load = lead(a).load;
  }
  if (c_.routing == RoutingPolicy::kCacheAware && c_.engine.prefix_caching &&
      live_attention_workers() > 1) {
    // The chain under each replica's salt and block size (all the same
    // unless the replicas were started differently): hashed once per pair.
    std::vector<uint64_t> chain;
    uint64_t chain_salt = 0;
    int64_t chain_block = 0;
    for (int a = 0; a < n; ++a) {
      const WorkerProcess& w = lead(a);
      if (w.dead || w.kv_block_size <= 0 || w.prefix_index.size() == 0) continue;
      if (chain_block != w.kv_block_size || chain_salt != w.prefix_salt) {
        chain_salt = w.prefix_salt;
        chain_block = w.kv_block_size;
        chain = prefix_chain_hashes(chain_salt, r.prompt.data(),
                                    static_cast<int64_t>(r.prompt.size()), chain_block);
      }
      view[static_cast<size_t>(a)].cached_blocks = w.prefix_index.match(chain);
    }
  }
  return choose_attention_replica(c_.routing, view, c_.routing_load_slack, &round_robin_);
}

Status Router::cancel(int64_t id) {
  return retried_after_restart([&] { return cancel_once(id); });
}

Status Router::cancel_once(int64_t id) {
  requests_.erase(id);  // a lost request waiting for resubmission goes with it
  auto forget = [&] {
    lost_.erase(std::remove(lost_.begin(), lost_.end(), id), lost_.end());
    failed_.erase(std::remove_if(failed_.begin(), failed_.end(),
                                 [&](const TokenEvent& e) { return e.request_id == id; }),
                  failed_.end());
  };
  if (auto pf = prefilling_.find(id); pf != prefilling_.end()) {
    MSI_RETURN_IF_ERROR(settle_prefill(workers_->prefill(pf->second)));
  }
  if (auto pf = prefilling_.find(id); pf != prefilling_.end()) {
    WorkerProcess& p = workers_->prefill(pf->second);
    unload(p, id);
    prefilling_.erase(pf);
    auto e = ask(p, control::Cancel{id}, std::chrono::milliseconds(c_.timeout_ms),
                 "did not answer a cancel");
    if (!e.ok() && !p.dead) return e.status();
    forget();
    return ok_status();
  }
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) {
    forget();
    return ok_status();
  }
  WorkerProcess& w = lead(it->second);
  auto e = ask(w, control::Cancel{id}, std::chrono::milliseconds(c_.timeout_ms),
               "did not answer a cancel");
  if (!e.ok() && w.dead) {  // it died meanwhile: the request went with it
    forget();
    return ok_status();
  }
  MSI_RETURN_IF_ERROR(e.status());
  MSI_ASSIGN_OR_RETURN(control::Cancelled c,
                       control::expect<control::Cancelled>(std::move(e).value(), name_of(w)));
  w.kv_usage = c.kv_usage;
  unload(w, id);
  in_flight_.erase(it);
  return ok_status();
}

void Router::unload(WorkerProcess& w, int64_t id) {
  auto l = load_of_.find(id);
  if (l == load_of_.end()) return;
  w.load -= l->second;
  load_of_.erase(l);
}

double Router::kv_usage() const {
  double s = 0;
  for (int a = 0; a < c_.attention_workers; ++a) s += lead(a).dead ? 0 : lead(a).kv_usage;
  const int live = live_attention_workers();
  return live > 0 ? s / live : 0;
}

EngineCounters Router::counters() const {
  EngineCounters s = counters_before_;
  for (int a = 0; a < c_.attention_workers; ++a) s += lead(a).counters;
  for (int p = 0; p < c_.prefill_workers; ++p) s += workers_->prefill(p).counters;
  return s;
}

int Router::rebalances() const { return rebalancer_->rebalances(); }

StatusOr<std::vector<TokenEvent>> Router::step() {
  std::vector<TokenEvent> events;
  Status s = awaited_.empty() ? step_once(&events) : wait_for_replacement();
  if (s.ok()) s = rebalancer_->tick([this] { return experts_lost_; });
  if (s.ok()) s = join_tick();
  // A step that fails ends the deployment (its caller cannot go on with it: a
  // worker that does not answer is as good as dead), unless a death it
  // recovers from made it fail: then it restarts.
  if (!s.ok() && !restart_why_.empty()) s = recover();  // the events delivered before stand
  if (!s.ok()) return stopped_.ok() ? fail_deployment(s) : s;
  for (auto& ev : failed_) events.push_back(std::move(ev));  // lost requests end here
  failed_.clear();
  return events;
}

Status Router::step_once(std::vector<TokenEvent>* events) {
  MSI_RETURN_IF_ERROR(stopped_);
  for (auto& ev : prefill_events_) events->push_back(std::move(ev));  // taken between steps
  prefill_events_.clear();
  MSI_RETURN_IF_ERROR(resubmit_lost());
  if (!prefilling_.empty()) {
    // The prefill workers step beside the attention workers, not in
    // lockstep: a long prompt's step never holds up a decoding one. With
    // nothing decoding, the router waits for them instead of spinning.
    MSI_RETURN_IF_ERROR(start_prefill_steps());
    MSI_RETURN_IF_ERROR(collect_prefill_steps(/*wait=*/in_flight_.empty(), events));
    MSI_RETURN_IF_ERROR(resubmit_lost());
    if (in_flight_.empty()) return ok_status();
  }
  std::vector<char> stepping(static_cast<size_t>(c_.attention_workers), 0);
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (lead(a).dead) continue;
    Status s = send_command(lead(a), control::Step{});
    if (!s.ok() && !lead(a).dead) return s;
    stepping[static_cast<size_t>(a)] = s.ok();
  }
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (!stepping[static_cast<size_t>(a)]) continue;
    // A step waits at most the M2N timeout per layer; check for dead workers while waiting.
    auto e = read_answer(lead(a), std::chrono::milliseconds(c_.timeout_ms * 4 + 10000),
                         StatusCode::kDeadlineExceeded, "did not answer a step");
    if (!e.ok() && lead(a).dead) continue;  // dropped: its requests are resubmitted or failed below
    MSI_RETURN_IF_ERROR(e.status());
    if (auto* err = std::get_if<control::Error>(&*e)) {
      return fail_deployment(Status(StatusCode::kUnavailable, err->message));
    }
    MSI_ASSIGN_OR_RETURN(control::Stepped st,
                         control::expect<control::Stepped>(std::move(e).value(), name_of(lead(a))));
    MSI_RETURN_IF_ERROR(take_step(a, std::move(st), events));
  }
  return resubmit_lost();
}

Status Router::take_step(int a, control::Stepped&& s, std::vector<TokenEvent>* events) {
  if (s.discarded) ++steps_rerun_;
  lead(a).prefix_index.apply(s.cache_stored, s.cache_removed);
  lead(a).kv_usage = s.kv_usage;
  lead(a).counters = s.counters;
  for (TokenEvent& ev : s.events) {
    // The request ends with its last sequence (n > 1: one event each).
    bool request_done = ev.finished;
    if (auto t = requests_.find(ev.request_id); t != requests_.end()) {
      t->second.delivered.push_back(ev.token);
      if (ev.finished && --t->second.sequences_left > 0) request_done = false;
      if (request_done) requests_.erase(t);
    }
    if (request_done) {
      in_flight_.erase(ev.request_id);
      unload(lead(a), ev.request_id);
    }
    events->push_back(std::move(ev));
  }
  return ok_status();
}

StatusOr<RoutingStats> Router::routing(const std::vector<Json>& workers, int layers,
                                       int experts) const {
  MSI_ASSIGN_OR_RETURN(RoutingStats s,
                       RoutingStats::from_workers(workers, c_.placement, layers, experts));
  s.placement_switches = rebalancer_->rebalances();
  return s;
}

StatusOr<std::vector<Json>> Router::stats(bool reset) {
  // An idle deployment steps nothing: a replacement joins here (the server
  // asks for stats every second) as well as between steps; as there, an
  // error on the way stops the deployment (or restarts it).
  Status joined = join_tick();
  if (!joined.ok() && !restart_why_.empty()) joined = recover();
  if (!joined.ok()) return stopped_.ok() ? fail_deployment(joined) : joined;
  return retried_after_restart([&] { return stats_once(reset); });
}

StatusOr<std::vector<Json>> Router::stats_once(bool reset) {
  MSI_RETURN_IF_ERROR(settle_prefill_workers());  // a stepping one answers its step first
  for (auto& w : workers_->all()) {
    if (w.dead) continue;
    // One that died meanwhile is dropped (or the deployment restarts or
    // stops): the others' answers are read below all the same, so that none
    // is left in a pipe for the next command to take for its own.
    Status sent = send_command(w, control::GetStats{reset});
    if (!sent.ok() && !w.dead) return sent;
  }
  std::vector<Json> out;
  for (auto& w : workers_->all()) {
    if (w.dead) continue;
    auto e = read_answer(w, std::chrono::milliseconds(c_.timeout_ms), StatusCode::kDeadlineExceeded,
                         "did not report its stats");
    if (!e.ok() && w.dead) continue;  // dropped meanwhile
    MSI_RETURN_IF_ERROR(e.status());
    MSI_ASSIGN_OR_RETURN(control::StatsReport r,
                         control::expect<control::StatsReport>(std::move(e).value(), name_of(w)));
    Json st = std::move(r.stats);
    st["role"] = worker_role_name(w.role);
    st["index"] = w.index;
    if (c_.tp_expert > 1 && w.role == WorkerRole::kExpert) st["tp_rank"] = w.tp_rank;
    if (c_.tp_attention > 1 && w.role == WorkerRole::kAttention) st["tp_rank"] = w.tp_rank;
    out.push_back(std::move(st));
  }
  return out;
}

std::string Router::describe() const { return workers_->describe(); }

}  // namespace msinfer::runtime
