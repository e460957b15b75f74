// The router of a disaggregated deployment: assigns each request to an
// attention worker by the routing policy (WorkerConfig::routing,
// routing_policy.h: by default the one whose prefix cache holds the longest
// prefix of the request, within a load slack of the least-loaded one; the
// router indexes each replica's cache from the registrations and evictions
// its step answers carry) and steps all attention workers together (they
// must answer the expert workers in lockstep even when idle).
// Two ways to get workers:
// - start(): one host. Forks the attention and expert workers (this binary's
//   `worker` subcommand), talks to them over pipes; they die with the router
//   (PR_SET_PDEATHSIG) and are terminated when it is destroyed.
// - start_launched(): many hosts. mpirun / srun started this binary as every
//   rank: rank 0 is the router, ranks 1..n_a*tp_a attention processes (replica
//   a's tp rank r at 1 + a*tp_a + r), the rest expert processes (expert worker
//   w's shard r at 1 + n_a*tp_a + w*tp_e + r) (join_launched_deployment()).
// The router sees n_a attention workers: it adds, cancels and steps at each
// replica's rank 0 only (one scheduler and KV allocator per replica); every
// process, tp ranks included, is watched and named when it dies. Workers reach the router over TCP.
// Failures (docs/RUNTIME.md, "Failures"): an attention worker that dies
// (without attention tensor parallelism, and with expert shards that each
// answer the attention side) is dropped: the expert workers are told to serve
// the others, and its requests end with an error event naming it or, with
// WorkerConfig::resubmit, go to another attention worker with their prompt
// plus the tokens already delivered; with WorkerConfig::respawn (one process
// per worker, the direct or socket transport) a replacement then joins the
// running workers and takes new requests. An expert worker that dies when every
// expert it held has a replica on another worker is dropped in place (one
// process per expert worker and per attention worker, the `direct`
// transport): the attention workers route its experts' rows to the replicas,
// and a step that lost its answers is discarded and run again; no request
// fails, no worker restarts; with WorkerConfig::respawn a replacement then
// joins the running workers (also for an expert worker without replicas:
// serving pauses until it has joined). Otherwise a deployment this router forked
// survives an expert worker's death with replicas, and any death with
// WorkerConfig::respawn, by restarting its workers (without the dead one, or
// with a replacement) and resubmitting every request in flight the same way
// (at most kMaxRestarts times). Any other death fails every in-flight request
// with an error naming the process and stops the deployment.
// Online rebalancing (WorkerConfig::rebalance_every; docs/RUNTIME.md, "Online
// rebalancing"): between steps the router moves and replicates experts by the
// rows routed lately; the expert workers load what they gain while serving.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/control.h"
#include "msinfer/runtime/disaggregated.h"

namespace msinfer::runtime {

namespace internal {
struct WorkerProcess;
struct WorkerDeath;
struct DeploymentState;
class WorkerSet;
class Rebalancer;
}  // namespace internal

// The workers of one role as the router last saw them (docs/SERVING.md,
// "/health"). A worker is an attention replica or an expert worker, with all
// its processes.
struct RoleHealth {
  int live = 0;          // serving now
  int expected = 0;      // the deployment was started with
  int64_t deaths = 0;    // workers that died (one of their processes did)
  int64_t restarts = 0;  // workers started in place of dead ones (a replacement, or a restart's)
};
struct DeploymentHealth {
  RoleHealth attention, expert;
  RoleHealth prefill;  // prefill/decode disaggregation's (expected 0 without)
  // Prefill workers so far: sequences whose K/V moved to an attention worker
  // and its bytes; requests prefilled on an attention worker instead (a
  // failed transfer, or K/V beyond the staging region).
  int64_t kv_transfers = 0, kv_transfer_bytes = 0, kv_transfer_fallbacks = 0;
  // Serving waits: for a replacement without which some experts have no
  // worker, or for a restart of every worker.
  bool recovering = false;
  bool stopped = false;  // the deployment stopped
  std::string error;     // why, once stopped (stopped()'s message)
};

class Router {
 public:
  // `exe` is the msinfer binary; each worker it forks is configured with `c`
  // (control::Configure).
  static StatusOr<std::unique_ptr<Router>> start(const WorkerConfig& c, const std::string& exe);
  // Rank 0 of a launcher's job whose other ranks call join_launched_deployment.
  static StatusOr<std::unique_ptr<Router>> start_launched(const WorkerConfig& c,
                                                          comm::Bootstrap& launcher);
  ~Router();

  Status add(const GenerationRequest& r);
  // One step of every live attention worker. A request that was lost with a
  // dead attention worker (and not resubmitted) ends here with an event whose
  // finish_reason is "error" (no token; `error` says why).
  StatusOr<std::vector<TokenEvent>> step();
  // Removes request `id` from its attention worker (freeing its KV blocks);
  // it produces no more events.
  Status cancel(int64_t id);
  bool idle() const {
    return in_flight_.empty() && prefilling_.empty() && lost_.empty() && failed_.empty() &&
           prefill_events_.empty();
  }
  // Why the deployment stopped (a death it did not recover from, found by
  // any call); ok while it serves.
  const Status& stopped() const { return stopped_; }
  int64_t in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  // As of the last step: the attention workers' mean KV cache usage (0..1),
  // and their engines' counters so far, summed over every attention worker
  // process the deployment has had.
  double kv_usage() const;
  EngineCounters counters() const;
  // One line per worker: role, index, pid (or rank, host, address), RSS.
  std::string describe() const;
  // Every live worker's WorkerStats since the last reset ({"role", "index",
  // ...}), attention workers first; call between steps. reset starts a new
  // window.
  StatusOr<std::vector<Json>> stats(bool reset);
  // The process of attention worker `index` (its rank 0) or expert worker
  // `index` (shard 0), for tests that kill one; -1 under a launcher or once dead.
  pid_t pid_of(WorkerRole role, int index) const;
  // The same by role name (worker_role_name; -1 for another name).
  pid_t pid_of(const std::string& role, int index) const;
  // Attention workers still serving.
  int live_attention_workers() const;
  // Distinct block hashes the router's index holds for attention worker `a`
  // (0 for a dead one: its index is dropped with it).
  int64_t indexed_blocks(int a) const;
  // Live and expected workers, deaths and restarts by role. Thread-safe: the
  // router's thread publishes them (atomics) as it finds deaths, starts
  // replacements or restarts, also in the middle of a step() that waits for a
  // replacement; any thread may read them meanwhile (the HTTP loop's /health).
  DeploymentHealth health() const;
  // Expert workers now (fewer after a restart without a dead one), and the
  // restarts so far (docs/RUNTIME.md, "Failures").
  int expert_workers() const { return c_.expert_workers; }
  const Placement& placement() const { return c_.placement; }
  // The routing document of `workers` (stats()) under the placement in
  // effect, with the switches online rebalancing made.
  StatusOr<RoutingStats> routing(const std::vector<Json>& workers, int layers, int experts) const;
  int restarts() const { return restarts_; }
  // Expert workers dropped in place (they still count in expert_workers(),
  // holding nothing), and attention-worker steps discarded because one of
  // them died mid-step (each is run again).
  int lost_expert_workers() const { return experts_lost_; }
  // Replacements started for dropped expert workers (--respawn), and those
  // that joined.
  int replacements() const { return replacements_; }
  int replacements_joined() const { return joined_; }
  int steps_rerun() const { return steps_rerun_; }
  // Prefill/decode disaggregation: sequences whose K/V moved from a prefill
  // worker to an attention worker, their bytes and the prefill workers'
  // write time; requests that fell back to prefilling on an attention
  // worker (a transfer that failed, or K/V beyond the staging region).
  // Prefilled sequences moved (`into_pool` of them written straight into
  // the attention worker's KV pool, the others through its staging region),
  // their bytes and writes, requests prefilled again instead, the prefill
  // workers' write time, and the router's time in the transfers (the
  // attention workers step none meanwhile: what a transfer holds up
  // decoding by).
  struct KvTransfers {
    int64_t sequences = 0, into_pool = 0, bytes = 0, writes = 0, fallbacks = 0;
    double write_s = 0, transfer_s = 0;
  };
  KvTransfers kv_transfers() const;  // the router's thread (health() has the counts for any)
  // Placements switched to by online rebalancing so far.
  int rebalances() const;
  static constexpr int64_t kRebalanceMinRows = runtime::kRebalanceMinRows;
  static constexpr int kMaxRestarts = 3;

 private:
  static StatusOr<std::unique_ptr<Router>> create(const WorkerConfig& c);
  // What the router keeps of a request to resubmit it: the request and the
  // tokens delivered so far (with n > 1 those of all its sequences, mixed:
  // such a request is resubmitted only before its first token), and its
  // sequences still running.
  struct Tracked {
    GenerationRequest request;
    std::vector<int32_t> delivered;
    int sequences_left = 1;
  };
  struct Joining;  // a replacement expert worker joining (router_join.cc)
  Router();
  // Forks this host's workers (configured with c_) and waits for them.
  Status spawn();
  // Every worker's Ready (its protocol checked, its memory noted).
  Status wait_ready();
  // Writes one command to `w`; a closed channel is reported as the worker's
  // death when it died, else as "gone".
  Status send_command(internal::WorkerProcess& w, const control::Command& c);
  // The worker's next event; while waiting, a worker that died is handled
  // (check_children). A negative timeout waits as long as it takes.
  StatusOr<control::Event> read_answer(internal::WorkerProcess& w,
                                       std::chrono::milliseconds timeout, StatusCode code,
                                       const std::string& late);
  // send_command, then read_answer (DEADLINE_EXCEEDED with `late`); without a
  // timeout, the M2N timeout.
  StatusOr<control::Event> ask(internal::WorkerProcess& w, const control::Command& c,
                               std::chrono::milliseconds timeout, const std::string& late);
  StatusOr<control::Event> ask(internal::WorkerProcess& w, const control::Command& c);
  // Every death seen since the last look, each carried out as the recovery
  // policy decides (internal::decide_recovery).
  Status check_children();
  Status on_death(const internal::WorkerDeath& d);
  internal::DeploymentState deployment_state() const;
  // After a death check_children() chose to recover from (restart_why_ set,
  // every worker stopped): starts the workers again, without the dead expert
  // worker (its experts on their replicas) or, with respawn, as they were,
  // and resubmits every request in flight from prompt + delivered tokens.
  Status recover();
  template <typename Op>
  auto retried_after_restart(Op op) -> decltype(op());
  Status step_once(std::vector<TokenEvent>* events);
  // One attention worker's step answer: its events delivered, its gauges kept.
  Status take_step(int a, control::Stepped&& s, std::vector<TokenEvent>* events);
  // --respawn after an in-place drop (docs/RUNTIME.md, "Failures"): between
  // steps, starts a replacement for a dropped expert worker, answers its
  // bootstrap with the running workers' cards, and once it is ready adds it
  // to the attention workers; the deployment serves meanwhile. A replacement
  // that fails is given up (logged), the deployment goes on without it.
  Status join_tick();
  StatusOr<control::Event> set_units_from_live_attention(internal::WorkerProcess& w);
  void start_replacement();
  void start_attention_replacement();
  void start_joining(WorkerRole role, int index,
                     const std::function<StatusOr<internal::WorkerProcess>()>& fork,
                     std::vector<std::pair<int, double>> shares, const char* then);
  Status finish_attention_join(const control::Ready& ready);
  // A prefill worker's replacement: forked with its configuration, it says
  // Ready once its weights are in, then ConnectKv wires it to the attention
  // workers' staging regions and it takes requests again.
  void start_prefill_replacement();
  Status finish_prefill_join(const control::Ready& ready);
  Status answer_join_allgather(const std::string& blob);
  Status finish_join(const control::Ready& ready);
  void abandon_join(const std::string& why);
  Status cancel_once(int64_t id);
  // Stops every worker and the deployment with `why` (stopped()); nothing is
  // in flight any more, and the attention workers' gauges read 0.
  Status fail_deployment(Status why);
  // Publishes what health() reads: called wherever a worker's state changes.
  void publish_health();
  StatusOr<std::vector<Json>> stats_once(bool reset);
  // Attention worker `a` died (`why`): the expert processes stop waiting for
  // it, its requests are queued for resubmission or failed.
  void drop_attention_worker(int a, const std::string& why);
  // Expert worker `w` died (`why`): its experts go to their replicas
  // (Placement::emptied), the attention workers are told. With
  // `keep_placement` (some of its experts have no replica, and --respawn) it
  // keeps its experts and serving pauses (step() waits) until its
  // replacement joins; a replacement that fails falls back to a restart.
  void drop_expert_worker(internal::WorkerProcess& w, const std::string& why, bool keep_placement);
  Status wait_for_replacement();
  // Sends `r` to the live attention worker the routing policy picks.
  Status submit(const GenerationRequest& r);
  // Request `id` leaves worker `w`: its share of w's load goes (if any).
  void unload(internal::WorkerProcess& w, int64_t id);
  // The live attention worker the routing policy picks for `r`, or -1.
  int choose_attention_worker(const GenerationRequest& r);
  // ---- prefill workers (docs/RUNTIME.md, "Prefill/decode disaggregation") ----
  // Sends `r` to the least loaded live prefill worker; false when none is.
  StatusOr<bool> submit_prefill(const GenerationRequest& r);
  // Each attention worker's K/V staging region to every prefill worker.
  Status connect_prefill_workers();
  // Steps every prefill worker with work that is not stepping already.
  Status start_prefill_steps();
  // Takes the answers of the stepping prefill workers that have one (all of
  // them, waiting, when `wait`): their events, then each prefilled
  // sequence's K/V moved to an attention worker.
  Status collect_prefill_steps(bool wait, std::vector<TokenEvent>* events);
  Status take_prefill_step(internal::WorkerProcess& p, control::Stepped&& s,
                           std::vector<TokenEvent>* events);
  Status take_prefill_answer(internal::WorkerProcess& w, StatusOr<control::Event> e,
                             std::vector<TokenEvent>* events);
  // A prefill worker that is stepping answers its Step before anything else:
  // before another command to it, its answer is taken (its events kept in
  // prefill_events_ for the next step()).
  Status settle_prefill(internal::WorkerProcess& w);
  Status settle_prefill_workers();
  // Moves one prefilled sequence from prefill worker `p` to an attention
  // worker; a transfer that cannot be made sends the request to be
  // prefilled again on an attention worker.
  Status transfer(internal::WorkerProcess& p, control::Prefilled&& x);
  // The request is to be prefilled again on an attention worker (lost_).
  void fall_back(int64_t id, const std::string& why);
  void drop_prefill_worker(internal::WorkerProcess& p, const std::string& why);
  // Resubmits the requests of dropped workers (lost_), or fails them into
  // failed_, which step() hands out. An error when the deployment stopped
  // or is to restart meanwhile.
  Status resubmit_lost();
  // Stops every worker: asks them to exit and waits up to 2 s each, or
  // (graceful false) kills them at once.
  void shutdown(bool graceful = true);
  std::string name_of(const internal::WorkerProcess& w) const;
  internal::WorkerProcess& lead(int a);
  const internal::WorkerProcess& lead(int a) const;

  WorkerConfig c_;
  std::unique_ptr<internal::WorkerSet> workers_;
  std::unique_ptr<internal::Rebalancer> rebalancer_;
  std::map<int64_t, int> in_flight_;     // request id -> attention worker
  std::map<int64_t, int> prefilling_;    // request id -> prefill worker
  uint32_t kv_imm_ = 0;                  // the last K/V transfer's immediate
  std::vector<TokenEvent> prefill_events_;  // taken outside step(), delivered by the next
  std::set<int64_t> prefill_again_;         // lost_ requests of a dead prefill worker: to another
  // KvTransfers' counts, written on the router's thread and read by any
  // (health()); the write time is the router thread's alone.
  std::atomic<int64_t> kv_sequences_{0}, kv_bytes_{0}, kv_fallbacks_{0};
  int64_t kv_into_pool_ = 0, kv_writes_ = 0;
  double kv_write_s_ = 0, kv_transfer_s_ = 0;
  std::map<int64_t, int64_t> load_of_;   // request id -> its share of the worker's load
  std::map<int64_t, Tracked> requests_;  // every request in flight
  std::vector<int64_t> lost_;            // requests of a dropped worker, to resubmit
  std::vector<TokenEvent> failed_;       // their error events, for the next step()
  Status stopped_ = ok_status();         // why the deployment was stopped, once it was
  std::string exe_;                      // start(): the binary that starts the workers again
  std::string restart_why_;              // a death to recover from, until recover()
  int restart_without_ = -1;             // the dead expert worker to leave out, or -1
  int restarts_ = 0;
  int round_robin_ = 0;   // RoutingPolicy::kRoundRobin's cursor
  bool serving_ = false;  // every worker is ready (a death is not a failed start)
  int experts_lost_ = 0;  // expert workers dropped in place
  int steps_rerun_ = 0;
  std::optional<Placement> before_loss_;   // the placement when the first was dropped
  std::vector<int> to_replace_;            // dropped expert workers, under --respawn
  std::vector<int> attention_to_replace_;  // dropped attention workers, under --respawn
  std::vector<int> prefill_to_replace_;    // dead prefill workers, under --respawn
  EngineCounters counters_before_;         // of the attention worker processes replaced so far
  std::vector<int> awaited_;               // of those, the ones serving waits for
  std::unique_ptr<Joining> joining_;
  int replacements_ = 0;  // started, at most kMaxRestarts
  int joined_ = 0;
  bool recovering_ = false;  // in recover(): every worker restarts
  // What health() reads, by role (WorkerRole as an index); written on the
  // router's thread only (publish_health and the counters), read by any.
  // By WorkerRole: attention, expert, prefill.
  std::atomic<int> live_[3] = {0, 0, 0}, expected_[3] = {0, 0, 0};
  std::atomic<int64_t> deaths_[3] = {0, 0, 0}, worker_restarts_[3] = {0, 0, 0};
  std::atomic<bool> recovering_now_{false}, stopped_now_{false};
  mutable std::mutex stop_mu_;
  std::string stop_reason_;  // GUARDED_BY(stop_mu_): stopped_'s message, for health()
};

// Ranks 1.. of a launcher's job: takes the role of `launcher`'s rank (ranks
// 1..n_a*tp_a attention processes, then expert processes), reaches the router
// (rank 0) over TCP and serves until it says exit. The job must have
// 1 + n_a*tp_a + N*tp_e ranks.
Status join_launched_deployment(const WorkerConfig& c, comm::Bootstrap& launcher);

}  // namespace msinfer::runtime
