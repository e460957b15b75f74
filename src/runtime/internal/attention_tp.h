// Attention tensor parallelism within one attention replica. Private to runtime/.
#pragma once

#include <vector>

#include "msinfer/comm/m2n.h"
#include "msinfer/runtime/disaggregated.h"
#include "msinfer/runtime/engine.h"
#include "worker_common.h"

namespace msinfer::runtime::internal {

// Rank 0's side of the replica's tp channels (the format: tp_broadcast_shape):
// per layer it broadcasts the normed input with the batch's positions and
// block tables, and adds the other ranks' partial o_proj outputs in rank
// order. Used by rank 0's engine thread only; `c`, `stats`, `ep` outlive it.
class AttentionTpLeader : public AttentionPeers {
 public:
  AttentionTpLeader(const WorkerConfig& c, const ModelConfig& mc, int index, WorkerStats* stats,
                    comm::M2NEndpoint& ep);
  // Third allgather of the deployment (after the experts' wiring).
  Status attach(comm::Bootstrap& boot);
  Status start(int l, const TokenBatch& b, const int32_t* const* tables, const float* h) override;
  Status add_partials(int l, int64_t T, float* o) override;

 private:
  const WorkerConfig& c_;
  int index_;
  int64_t hidden_;
  WorkerStats* stats_;
  comm::M2NEndpoint& ep_;
  comm::M2NSender broadcast_;
  comm::M2NReceiver partials_;
  uint32_t seq_ = 0;
  std::vector<int32_t> words_;
};

// Ranks 1..tp-1 of attention replica `index`: compute their heads' attention
// for rank 0 until the router says Exit (or closes the command channel);
// they answer GetStats too.
Status run_attention_tp_rank(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                             int in_fd, int out_fd);

}  // namespace msinfer::runtime::internal
