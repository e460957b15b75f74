// Online rebalancing (WorkerConfig::rebalance_every; docs/RUNTIME.md, "Online
// rebalancing"): after every step the router calls tick(); every
// rebalance_every steps it looks at the rows the expert workers routed, and
// when a better placement is predicted has them load the experts they gain
// while serving (Prepare), then switches every worker to it between two
// steps. Private to runtime/. The router's thread only.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "msinfer/runtime/control.h"
#include "msinfer/runtime/disaggregated.h"
#include "worker_set.h"

namespace msinfer::runtime::internal {

class Rebalancer {
 public:
  // Asks worker `w` one command and returns its answer: the router's ask(),
  // which handles a death meanwhile as it does during a step.
  using Ask = std::function<StatusOr<control::Event>(WorkerProcess& w, const control::Command&)>;
  // `c` is the router's configuration: its placement is the one in effect,
  // which a switch replaces. `c`, `workers` outlive this.
  Rebalancer(WorkerConfig& c, WorkerSet& workers, Ask ask)
      : c_(c), workers_(workers), ask_(std::move(ask)) {}

  // At start: the model's shape and the slots per expert worker.
  Status init();
  // After every step. `experts_lost()`: expert workers dropped in place so
  // far; rebalancing stops once one was (a new placement would place experts
  // on it), and an ask that failed because one was dropped meanwhile is not
  // an error.
  Status tick(const std::function<int()>& experts_lost);
  // A restart: the new workers hold the placement in effect; a prepared one
  // and the rows counted so far are forgotten.
  void forget();
  bool switching() const { return switching_; }
  int rebalances() const { return rebalances_; }

 private:
  Status consider();
  Status switch_when_loaded();
  // Tells every expert process to forget a prepared placement.
  void abandon(const std::string& why);
  template <typename T>
  StatusOr<T> ask(WorkerProcess& w, const control::Command& c);

  WorkerConfig& c_;
  WorkerSet& workers_;
  Ask ask_;
  int layers_ = 0, experts_ = 0;  // of the model
  int moe_layers_ = 0;            // layers with routed experts
  int slots_ = 0;                 // experts an expert worker may hold
  int64_t steps_since_look_ = 0;
  // Rows per (layer, expert) since the last decision, over routed_steps_ steps.
  std::vector<int64_t> routed_;
  int64_t routed_steps_ = 0;
  std::optional<Placement> pending_;  // being loaded by the expert workers
  bool switching_ = false;  // switching the workers' placement (a death is not dropped in place)
  int rebalances_ = 0;
};

}  // namespace msinfer::runtime::internal
