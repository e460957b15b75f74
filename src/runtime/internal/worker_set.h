// The worker processes of a router: started (forked here, or a launcher's
// ranks that connect), watched and stopped; their control channels; their
// deaths, reported as values for the router's recovery policy to judge.
// Private to runtime/. Not thread safe: the router's thread only.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/runtime/control.h"
#include "msinfer/runtime/disaggregated.h"

namespace msinfer::runtime::internal {

// One worker process and the router's channel to it.
struct WorkerProcess {
  WorkerRole role = WorkerRole::kAttention;
  int index = 0;          // among the workers of its role
  int tp_rank = 0;        // the process within its tp group
  pid_t pid = -1;         // forked here; -1 for a launcher's rank or once reaped
  int pidfd = -1;         // readable once the forked process exits (-1: none)
  std::string where;      // a launcher's rank: "rank R on HOST (ADDRESS, pid P)"
  int in = -1, out = -1;  // commands and events: pipes, or one TCP socket
  std::string buf;        // event bytes read but not yet a whole line
  int64_t load = 0;       // attention workers: the load of their requests
  double rss_mb = 0;
  double kv_usage = 0;
  EngineCounters counters;  // attention workers: their engine's, so far
  // Attention workers with prefix caching (Ready): the chain's salt and block
  // size, and the hashes their cache holds as its steps reported them.
  uint64_t prefix_salt = 0;
  int64_t kv_block_size = 0;
  PrefixIndex prefix_index;
  // Attention workers of a deployment with prefill workers (Ready): their
  // K/V staging region (comm::PeerCard bytes).
  std::string kv_card;
  // Prefill workers: a Step was sent and its answer not read yet.
  bool stepping = false;
  bool dead = false;  // died and was dropped
  void close_channel();
  void reaped();  // its exit was seen
};

// A worker's exit, seen once: `how` names the process and the cause ("expert
// worker 1 (pid 42) was killed by signal 9"); `code` is INVALID_ARGUMENT when
// it exited with the CLI's bad-input status 2, else UNAVAILABLE.
struct WorkerDeath {
  size_t slot = 0;  // in WorkerSet::all()
  std::string how;
  StatusCode code = StatusCode::kUnavailable;
};

// The role of worker r (0 .. processes() + prefill_workers - 1; the bootstrap
// rank for r < processes()): attention processes come first (replica a's tp
// ranks at a * tp_attention + r), then expert processes (expert worker w's
// shards at attention processes + w * tp_expert + shard), then prefill
// workers (no bootstrap rank; launcher rank r + 1 under mpirun / srun).
struct RankRole {
  WorkerRole role;
  int index;
  int tp_rank;
};
RankRole role_of(const WorkerConfig& c, int rank);

class WorkerSet {
 public:
  // `c` is the router's configuration, read at each start (it changes when
  // the deployment restarts with fewer expert workers); it outlives this.
  explicit WorkerSet(const WorkerConfig& c) : c_(c) {}
  ~WorkerSet() { stop(); }

  // Forks every worker of the configuration on this host (`exe`'s `worker`
  // subcommand, configured by a Configure command with the configuration)
  // behind a bootstrap server of its own; does not wait for them (wait_ready).
  Status spawn(const std::string& exe);
  // Forks bootstrap rank `rank`, configured with `placement` in place of the
  // configuration's; with `join`, a replacement that bootstraps through the
  // router's pipes (router_pipe_bootstrap) into a running deployment.
  StatusOr<WorkerProcess> fork_worker(int rank, const std::string& exe, const Placement& placement,
                                      bool join);
  // Forks prefill worker p (no bootstrap rank: a co-located engine).
  StatusOr<WorkerProcess> fork_prefill_worker(int p, const std::string& exe);
  // Forks `exe worker` as `role` with `env_lines`, its command pipe holding
  // `configuration` (a Configure) as its first line.
  StatusOr<WorkerProcess> fork_process(const RankRole& role, const std::string& exe,
                                       const std::string& configuration,
                                       std::vector<std::string> env_lines);
  // Rank 0 of a launcher's job: publishes the bootstrap and control addresses
  // and accepts every other rank's control connection (its Hello checked:
  // the job's secret, the protocol version).
  Status accept_launched(comm::Bootstrap& launcher);

  // The next exit not reported yet (reaping it), or nullopt. Dead workers'
  // channels stay open until the router drops them.
  std::optional<WorkerDeath> next_death();
  // Waits up to `ms` for an event from `w` (nullptr: none) or any forked
  // worker's exit.
  void wait(const WorkerProcess* w, int ms) const;
  // Writes one command; false when the channel is closed.
  bool send(WorkerProcess& w, const control::Command& c);
  // Asks every worker to exit and waits up to 2 s each, or (graceful false)
  // kills them at once; removes the shared memory of those killed.
  void stop(bool graceful = true);

  std::vector<WorkerProcess>& all() { return workers_; }
  const std::vector<WorkerProcess>& all() const { return workers_; }
  // Rank 0 of attention replica a: the one the router talks to.
  WorkerProcess& lead(int a) { return workers_[static_cast<size_t>(a) * c_.tp_attention]; }
  const WorkerProcess& lead(int a) const {
    return workers_[static_cast<size_t>(a) * c_.tp_attention];
  }
  int live_attention_workers() const;
  // Prefill worker p (after the bootstrap ranks), and those alive.
  WorkerProcess& prefill(int p) { return workers_[static_cast<size_t>(c_.processes() + p)]; }
  const WorkerProcess& prefill(int p) const {
    return workers_[static_cast<size_t>(c_.processes() + p)];
  }
  int live_prefill_workers() const;
  pid_t pid_of(WorkerRole role, int index) const;
  std::string name_of(const WorkerProcess& w) const;
  std::string describe() const;  // one line per worker

 private:
  struct PendingHello;
  Status take_hello(PendingHello& p, const std::string& line, int* joined);

  const WorkerConfig& c_;
  std::unique_ptr<comm::BootstrapServer> server_;
  std::vector<WorkerProcess> workers_;  // attention processes first, by bootstrap rank
};

// FAILED_PRECONDITION unless the launcher started 1 + c.processes() ranks.
Status check_launcher_size(const WorkerConfig& c, const comm::Bootstrap& launcher);

}  // namespace msinfer::runtime::internal
