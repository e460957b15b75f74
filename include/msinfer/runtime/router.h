// The router of a disaggregated deployment: assigns each request to the
// attention worker with the least load and steps all attention workers
// together (they must answer the expert workers in lockstep even when idle).
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
// plus the tokens already delivered. An expert worker that dies when every
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

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/disaggregated.h"

namespace msinfer::runtime {

class Router {
 public:
  // `exe` is the msinfer binary; `placement_file` may be empty (round robin).
  static StatusOr<std::unique_ptr<Router>> start(const WorkerConfig& c, const std::string& exe,
                                                 const std::string& placement_file);
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
  bool idle() const { return in_flight_.empty() && lost_.empty() && failed_.empty(); }
  // Why the deployment stopped (a death it did not recover from, found by
  // any call); ok while it serves.
  const Status& stopped() const { return stopped_; }
  int64_t in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  // As of the last step: the attention workers' mean KV cache usage (0..1),
  // and their preemptions so far.
  double kv_usage() const;
  int64_t preemptions() const;
  // One line per worker: role, index, pid (or rank, host, address), RSS.
  std::string describe() const;
  // Every live worker's WorkerStats since the last reset ({"role", "index",
  // ...}), attention workers first; call between steps. reset starts a new
  // window.
  StatusOr<std::vector<Json>> stats(bool reset);
  // The process of attention worker `a` (its rank 0) or expert worker `a`
  // (shard 0), for tests that kill one; -1 under a launcher or once dead.
  pid_t pid_of(const std::string& role, int index) const;
  // Attention workers still serving.
  int live_attention_workers() const;
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
  // Placements switched to by online rebalancing so far.
  int rebalances() const { return rebalances_; }
  // Rows per expert worker and MoE layer (on average) a rebalancing decision
  // needs; looks add up their rows until there are this many.
  static constexpr int64_t kRebalanceMinRows = 128;
  static constexpr int kMaxRestarts = 3;

 private:
  struct Worker {
    std::string role;
    int index = 0;
    int tp_rank = 0;        // the process within its tp group
    pid_t pid = -1;         // forked here; -1 for a launcher's rank
    int pidfd = -1;         // readable once the forked process exits (-1: none)
    std::string where;      // a launcher's rank: "rank R on HOST (pid P)"
    int in = -1, out = -1;  // commands and answers: pipes, or one TCP socket
    std::string buf;        // answer bytes read but not yet a whole line
    int64_t load = 0;
    double rss_mb = 0;
    double kv_usage = 0;
    int64_t preemptions = 0;
    bool dead = false;  // an attention worker that died and was dropped
    void close_channel() {
      if (in >= 0) ::close(in);
      if (out >= 0 && out != in) ::close(out);
      in = out = -1;
    }
    void reaped() {  // its exit was seen
      pid = -1;
      if (pidfd >= 0) ::close(pidfd);
      pidfd = -1;
    }
  };
  // What the router keeps of a request to resubmit it: the request and the
  // tokens delivered so far.
  struct Tracked {
    GenerationRequest request;
    std::vector<int32_t> delivered;
  };
  Router() = default;
  Status spawn();
  Status wait_ready();
  // Writes one command line to `w`; a closed channel is reported as the
  // worker's death when it died, else as "gone".
  Status send_command(Worker& w, const std::string& command);
  StatusOr<std::string> read_answer(Worker& w, std::chrono::milliseconds timeout, StatusCode code,
                                    const std::string& late);
  // send_command, then read_answer (DEADLINE_EXCEEDED with `late`).
  StatusOr<std::string> ask(Worker& w, const std::string& command,
                            std::chrono::milliseconds timeout, const std::string& late);
  Status check_children();
  // After a death check_children() chose to recover from (restart_why_ set,
  // every worker stopped): starts the workers again, without the dead expert
  // worker (its experts on their replicas) or, with respawn, as they were,
  // and resubmits every request in flight from prompt + delivered tokens.
  Status recover();
  bool can_recover(const Worker& w) const;
  template <typename Op>
  auto retried_after_restart(Op op) -> decltype(op());
  Status step_once(std::vector<TokenEvent>* events);
  StatusOr<Worker> fork_worker(int rank, const std::string& placement_file, bool join);
  // --respawn after an in-place drop (docs/RUNTIME.md, "Failures"): between
  // steps, starts a replacement for a dropped expert worker, answers its
  // bootstrap with the running workers' cards, and once it is ready adds it
  // to the attention workers; the deployment serves meanwhile. A replacement
  // that fails is given up (logged), the deployment goes on without it.
  Status join_tick();
  void abandon_join(const std::string& why);
  // Online rebalancing, after every step (WorkerConfig::rebalance_every):
  // looks at the routed rows every rebalance_every steps and has the expert
  // workers prepare a better placement (pending_); once every one of them has
  // loaded its new experts, switches all workers to it.
  Status init_rebalancing();  // at start: the model's shape, slots_
  Status rebalance_tick();
  Status consider_rebalance();
  Status switch_when_loaded();
  // ask() with the M2N timeout, the answer parsed.
  StatusOr<Json> ask_json(Worker& w, const std::string& command);
  // Tells every expert process to forget a prepared placement.
  void abandon_rebalance(const std::string& why);
  Status cancel_once(int64_t id);
  StatusOr<std::vector<Json>> stats_once(bool reset);
  // Attention worker `a` died (`why`): the expert processes stop waiting for
  // it, its requests are queued for resubmission or failed.
  void drop_attention_worker(int a, const std::string& why);
  bool tolerates_attention_loss() const;
  // Expert worker `w` died (`why`) and tolerates_expert_loss(w): its experts
  // go to their replicas (Placement::emptied), the attention workers are told.
  // With `keep_placement` (awaits_replacement(w): some of its experts have
  // no replica, and --respawn) it keeps its experts and serving pauses
  // (step() waits) until its replacement joins; a replacement that fails
  // falls back to a restart.
  void drop_expert_worker(Worker& w, const std::string& why, bool keep_placement);
  bool can_drop_expert_in_place() const;
  bool replaceable(const Worker& w) const;
  bool tolerates_expert_loss(const Worker& w) const;
  bool awaits_replacement(const Worker& w) const;
  Status wait_for_replacement();
  StatusOr<std::string> write_placement_file(const std::string& name, const Placement& p) const;
  // Sends `r` to the live attention worker with the least load.
  Status submit(const GenerationRequest& r);
  // Resubmits the requests of dropped workers (lost_), or fails them into
  // failed_, which step() hands out. An error when the deployment stopped
  // or is to restart meanwhile.
  Status resubmit_lost();
  // Stops every worker: asks them to exit and waits up to 2 s each, or
  // (graceful false) kills them at once.
  void shutdown(bool graceful = true);
  std::string name_of(const Worker& w) const;
  // Rank 0 of attention replica a: the one the router talks to.
  Worker& lead(int a) { return workers_[static_cast<size_t>(a) * c_.tp_attention]; }
  const Worker& lead(int a) const { return workers_[static_cast<size_t>(a) * c_.tp_attention]; }

  WorkerConfig c_;
  std::unique_ptr<comm::BootstrapServer> server_;
  std::vector<Worker> workers_;          // attention workers first
  std::map<int64_t, int> in_flight_;     // request id -> attention worker
  std::map<int64_t, int64_t> load_of_;   // request id -> its share of the worker's load
  std::map<int64_t, Tracked> requests_;  // every request in flight
  std::vector<int64_t> lost_;            // requests of a dropped worker, to resubmit
  std::vector<TokenEvent> failed_;       // their error events, for the next step()
  Status stopped_ = ok_status();         // why the deployment was stopped, once it was
  std::string exe_, placement_file_;     // start(): how to start the workers again
  std::string own_placement_file_;       // written for a restart; removed at the end
  std::string restart_why_;              // a death to recover from, until recover()
  int restart_without_ = -1;             // the dead expert worker to leave out, or -1
  int restarts_ = 0;
  bool serving_ = false;    // every worker is ready (a death is not a failed start)
  bool switching_ = false;  // online rebalancing is switching the workers' placement
  int experts_lost_ = 0;    // expert workers dropped in place
  int steps_rerun_ = 0;
  std::optional<Placement> before_loss_;  // the placement when the first was dropped
  std::vector<int> to_replace_;           // dropped expert workers, under --respawn
  std::vector<int> awaited_;              // of those, the ones serving waits for
  struct Joining {
    Worker w;
    int stage = 0;  // allgathers answered
    std::vector<std::pair<int, double>> shares;
    std::string card;  // hex
    std::chrono::steady_clock::time_point since;
  };
  std::optional<Joining> joining_;
  std::string join_placement_file_;
  int replacements_ = 0;  // started, at most kMaxRestarts
  int joined_ = 0;
  // Online rebalancing.
  int layers_ = 0, experts_ = 0;  // of the model
  int moe_layers_ = 0;            // layers with routed experts
  int slots_ = 0;                 // experts an expert worker may hold
  int64_t steps_since_look_ = 0;
  // Rows per (layer, expert) since the last decision, over routed_steps_ steps.
  std::vector<int64_t> routed_;
  int64_t routed_steps_ = 0;
  std::optional<Placement> pending_;  // being loaded by the expert workers
  int rebalances_ = 0;
};

// Ranks 1.. of a launcher's job: takes the role of `launcher`'s rank (ranks
// 1..n_a*tp_a attention processes, then expert processes), reaches the router
// (rank 0) over TCP and serves until it says exit. The job must have
// 1 + n_a*tp_a + N*tp_e ranks.
Status join_launched_deployment(const WorkerConfig& c, comm::Bootstrap& launcher);

}  // namespace msinfer::runtime
