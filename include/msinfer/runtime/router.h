// The router of a single-host disaggregated deployment: starts the attention
// and expert worker processes (this binary's `worker` subcommand), bootstraps
// them, assigns each request to the attention worker with the least load, and
// steps all attention workers together (they must answer the expert workers in
// lockstep even when idle). Workers die with the router (PR_SET_PDEATHSIG) and
// are terminated when it is destroyed; a worker that dies fails every
// in-flight request with an error naming it.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/runtime/disaggregated.h"

namespace msinfer::runtime {

class Router {
 public:
  // `exe` is the msinfer binary; `placement_file` may be empty (round robin).
  static StatusOr<std::unique_ptr<Router>> start(const WorkerConfig& c, const std::string& exe,
                                                 const std::string& placement_file);
  ~Router();

  Status add(const GenerationRequest& r);
  StatusOr<std::vector<TokenEvent>> step();
  bool idle() const { return in_flight_.empty(); }
  // One line per worker: role, index, pid, RSS.
  std::string describe() const;

 private:
  struct Worker {
    std::string role;
    int index = 0;
    pid_t pid = -1;
    int in = -1, out = -1;  // attention workers: command pipe and answers
    std::string buf;        // answer bytes read but not yet a whole line
    int64_t load = 0;
    double rss_mb = 0;
  };
  Router() = default;
  Status check_children();
  void shutdown();

  WorkerConfig c_;
  std::unique_ptr<comm::BootstrapServer> server_;
  std::vector<Worker> workers_;  // attention workers first
  std::map<int64_t, int> in_flight_;  // request id -> attention worker
};

}  // namespace msinfer::runtime
