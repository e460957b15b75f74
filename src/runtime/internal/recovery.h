// The router's recovery policy: what a worker's death means for the
// deployment (docs/RUNTIME.md, "Failures"). Pure decisions over the
// configuration and the deployment's state; the router carries them out.
// Private to runtime/.
#pragma once

#include "msinfer/runtime/disaggregated.h"
#include "worker_set.h"

namespace msinfer::runtime::internal {

enum class DeathAction {
  kDropAttention,     // the other attention workers go on; its requests fail or are resubmitted
  kDropExpert,        // its experts' rows go to their replicas (Placement::emptied)
  kAwaitReplacement,  // routing stays; serving pauses until a replacement joins
  kRestart,           // every worker restarts (without it, or with a replacement)
  kFail,              // the deployment stops with the death as its error
};
const char* death_action_name(DeathAction a);

// What the router knows when a worker dies.
struct DeploymentState {
  bool serving = false;    // every worker was ready (a death is not a failed start)
  bool switching = false;  // online rebalancing is switching the workers' placement
  bool forked = false;     // the router forked its workers (it can start them again)
  int restarts = 0;        // restarts so far
  int replacements = 0;    // replacements started or queued (--respawn)
  int live_attention_workers = 0;
};

inline constexpr int kMaxRestarts = 3;  // also the most replacements started

// The decision for the death of `w` (`code`: WorkerDeath::code).
DeathAction decide_recovery(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w,
                            StatusCode code);

// The predicates the decision is made of.
// Dropping one attention worker leaves the others' exchange with the expert
// workers intact.
bool tolerates_attention_loss(const WorkerConfig& c);
// An expert worker can be dropped while the others serve.
bool can_drop_expert_in_place(const WorkerConfig& c, const DeploymentState& s);
// A replacement can be started for `w`: --respawn, and a worker the router forked.
bool replaceable(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w);
// A replacement can take dropped attention worker `w`'s place in the running
// deployment: as replaceable(), with one process per worker and msinfer's own
// transports (the expert workers connect to the replacement's combine
// region, which a dead peer's connection must not have broken).
bool can_replace_attention(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w);
// Restarting the deployment can recover from `w`'s death.
bool can_restart(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w);

}  // namespace msinfer::runtime::internal
