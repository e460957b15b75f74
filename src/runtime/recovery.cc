#include "internal/recovery.h"

namespace msinfer::runtime::internal {

const char* death_action_name(DeathAction a) {
  switch (a) {
    case DeathAction::kDropAttention:
      return "drop-attention";
    case DeathAction::kDropExpert:
      return "drop-expert";
    case DeathAction::kAwaitReplacement:
      return "await-replacement";
    case DeathAction::kRestart:
      return "restart";
    case DeathAction::kFail:
      return "fail";
  }
  return "?";
}

// The worker is one process (no attention tp group whose other ranks would
// wait for it) and each expert shard answers the attention workers itself
// (under allreduce, shard 0 checks the row counts of its shards' partials,
// and shards could disagree on the step the worker left).
bool tolerates_attention_loss(const WorkerConfig& c) {
  return c.tp_attention == 1 &&
         (c.tp_expert == 1 || c.tp_expert_reduce == ExpertReduce::kAttentionSum);
}

// Needs: a running deployment; one process per attention worker (the leader
// alone talks to the experts) and per expert worker (no shard group to
// break); msinfer's own transports: the `direct` one's writes to a dead
// process land in its shared memory harmlessly, the `socket` one forgets a
// dead peer (tolerate_peer_loss), where a libfabric connection to it fails in
// the attention workers' progress first; and no placement switch half done.
bool can_drop_expert_in_place(const WorkerConfig& c, const DeploymentState& s) {
  return s.serving && !s.switching && c.tp_attention == 1 && c.tp_expert == 1 &&
         comm::transport_is_msinfer(c.transport);
}

bool replaceable(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w) {
  return c.respawn && s.forked && w.where.empty();
}

bool can_replace_attention(const WorkerConfig& c, const DeploymentState& s,
                           const WorkerProcess& w) {
  return w.role == WorkerRole::kAttention && replaceable(c, s, w) && c.tp_attention == 1 &&
         c.tp_expert == 1 && comm::transport_is_msinfer(c.transport);
}

// Only workers the router forked (a launcher's ranks are not its to start):
// any, with --respawn; an expert worker's, when every expert it held has a
// replica on another one. At most kMaxRestarts times, so a worker that keeps
// dying stops the deployment.
bool can_restart(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w) {
  if (!s.forked || !w.where.empty() || s.restarts >= kMaxRestarts) return false;
  if (c.respawn) return true;
  return w.role == WorkerRole::kExpert && c.expert_workers > 1 && c.placement.without(w.index).ok();
}

DeathAction decide_recovery(const WorkerConfig& c, const DeploymentState& s, const WorkerProcess& w,
                            StatusCode code) {
  if (w.role == WorkerRole::kAttention && tolerates_attention_loss(c) &&
      s.live_attention_workers > 1) {
    return DeathAction::kDropAttention;
  }
  const bool bad_input = code == StatusCode::kInvalidArgument;
  if (w.role == WorkerRole::kExpert && !bad_input && can_drop_expert_in_place(c, s)) {
    // Every expert it held has a replica elsewhere; or, without, a
    // replacement can be waited for.
    // Under --shared-experts expert a worker may hold some layers' shared
    // experts, which have no replica (a restart places them over the others).
    const bool holds_shared = c.shared_experts == SharedExpertsOn::kExpert;
    if (!holds_shared && c.placement.emptied(w.index).ok()) return DeathAction::kDropExpert;
    if (replaceable(c, s, w) && s.replacements < kMaxRestarts) {
      return DeathAction::kAwaitReplacement;
    }
  }
  if (!bad_input && can_restart(c, s, w)) return DeathAction::kRestart;
  return DeathAction::kFail;
}

}  // namespace msinfer::runtime::internal
