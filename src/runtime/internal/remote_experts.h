// RemoteExperts: the attention side of the M2N exchange. Private to runtime/.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/m2n.h"
#include "msinfer/runtime/disaggregated.h"
#include "msinfer/runtime/expert_backend.h"
#include "msinfer/runtime/worker_stats.h"
#include "worker_common.h"

namespace msinfer::runtime::internal {

// The attention worker's expert backend in a disaggregated deployment:
// start() lays out each expert worker's rows (header: int32 counts per hosted
// expert in placement order, under --shared-experts expert the shared
// experts' count, then the send time) in the dispatch channel's
// slot and writes it; finish() waits for every answer and copies the outputs
// back in the batch's row order (adding the tp shards' partials in shard order
// under attention-sum). Owned by the attention worker's Engine; `c`, `ep` and
// `stats` must outlive it. Called by the engine thread only.
class RemoteExperts : public ExpertBackend {
 public:
  RemoteExperts(const WorkerConfig& c, const ModelConfig& mc, int index, comm::M2NEndpoint& ep,
                WorkerStats* stats)
      : c_(c),
        index_(index),
        ep_(ep),
        hidden_(mc.hidden),
        layers_(mc.layers),
        experts_(mc.experts),
        shared_(shared_experts_remote(c, mc)),
        layer_flops_(attention_layer_flops(mc, c.tp_attention, shared_)),
        stats_(stats),
        dispatch_(shape(c, mc, 0), index),
        combine_(shape(c, mc, 1), index) {
    set_placement(c.placement);
  }
  // Between steps only: the router switches every worker of the deployment
  // to a new placement at once (online rebalancing).
  void set_placement(const Placement& p);
  Status attach(comm::Bootstrap& boot);
  // Runs while finish() waits for the expert workers' answers: the worker
  // reads the router's commands there (drop_expert_worker).
  void set_between_polls(std::function<Status()> f) { between_polls_ = std::move(f); }
  // Expert worker w died (the router saw it) and every expert it held has a
  // replica on another one: its experts' rows go to those replicas from the
  // next message on, nothing more is sent to it or waited for. During a step
  // (`mid_step`) its answers for this step may be lost: the step finishes
  // with empty rows in their place, and discard_step() has the engine run it
  // again. The workers keep their numbers (Placement::emptied).
  // With `keep_placement` (its experts have no replica: the router runs no
  // step until a replacement joins) the routing stays as it was.
  Status drop_expert_worker(int w, bool mid_step, bool keep_placement);
  bool discard_step() const override { return discard_; }
  // For a replacement expert worker (Router, --respawn): where it writes this
  // worker's answers, and the units each slot has exchanged so far.
  std::string card() const {
    return comm::PeerCard{ep_.transport().address(), combine_region_}.encode();
  }
  std::vector<int64_t> units() const {
    std::vector<int64_t> n(static_cast<size_t>(c_.engine.micro_batches), 0);
    for (const auto& [k, done] : steps_done_) n[static_cast<size_t>(k)] = done;
    return n;
  }
  // A replacement attention worker (Router, --respawn), before its first
  // step: the units each slot has exchanged so far (a live attention
  // worker's units()), which its sequence numbers continue from, as the
  // expert workers' do.
  Status set_units(const std::vector<int64_t>& served);
  // Between steps: a replacement for dropped expert worker w, at `card`,
  // takes back the experts' `shares` it held (Placement::with_worker).
  Status add_expert_worker(int w, const comm::PeerCard& card,
                           const std::vector<std::pair<int, double>>& shares);
  Status begin_step() override {
    last_return_ = std::chrono::steady_clock::now();
    discard_ = false;
    return ok_status();
  }

  Status start(int k, int l, const kernels::cpu::RoutedBatch& r) override;

  Status finish(int k, int l, const kernels::cpu::RoutedBatch& r, float* results) override;

 private:
  struct Piece {
    int64_t send_row, rows, reply_row;
  };
  // The combine channel's sender s: an expert worker, or one shard of it.
  std::string answering_name(int s) const;
  // Every (slot, layer) unit has its own sequence number; all workers count alike.
  uint32_t seq(int k, int /*layer*/) { return static_cast<uint32_t>(steps_done_[k]); }

  const WorkerConfig& c_;
  int index_;
  comm::M2NEndpoint& ep_;
  int64_t hidden_;
  int layers_;
  int experts_;  // routed experts; the shared experts are expert experts_ of a RoutedBatch
  bool shared_;  // shared_experts_remote: one more count and row range per message
  double layer_flops_;
  WorkerStats* stats_;
  std::chrono::steady_clock::time_point last_return_ = std::chrono::steady_clock::now();
  comm::M2NSender dispatch_;
  comm::M2NReceiver combine_;
  Placement placement_;
  std::vector<std::vector<int>> local_;  // experts on each expert worker
  std::vector<int64_t> expert_rows_;     // this micro-batch's rows per expert
  std::map<int, std::vector<std::vector<Piece>>> plans_;
  std::map<int, int64_t> steps_done_;
  std::function<Status()> between_polls_;
  bool discard_ = false;  // an expert worker was dropped during this step
  comm::RemoteRegion combine_region_;
};

}  // namespace msinfer::runtime::internal
