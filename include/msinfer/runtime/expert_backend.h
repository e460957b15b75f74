// Where a forward pass's experts run. For each layer the engine hands every
// micro-batch's routed rows to start() and later collects the results with
// finish(); between the two it computes the other micro-batches, which is the
// ping-pong of docs/PLANNER.md section 3b when the experts are remote.
//  - LocalExperts: in this process (the co-located engine); start() computes.
//  - RemoteExperts (disaggregated.h): start() sends through the M2N library,
//    finish() waits for the expert workers' answers.
#pragma once

#include <memory>
#include <vector>

#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/moe.h"
#include "msinfer/runtime/model_runner.h"
#include "msinfer/runtime/worker_stats.h"

namespace msinfer::runtime {

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;
  // Called once at the start of each step (all layers of all micro-batches).
  virtual Status begin_step() { return ok_status(); }
  // `routed` stays valid and unchanged until finish() for the same (micro_batch, layer).
  virtual Status start(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed) = 0;
  // Writes the expert outputs in send-row order: results[routed.rows(), hidden].
  virtual Status finish(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed,
                        float* results) = 0;
  // Asked after the step's last finish(): true when its expert outputs are
  // not to be trusted (RemoteExperts: an expert worker was lost mid-step and
  // its rows came back empty). The engine then discards the step: no token is
  // sampled and no request advances, so the next step feeds the same tokens
  // again (writing the same KV positions) with the experts still alive.
  virtual bool discard_step() const { return false; }
  // Rows routed to each (layer, expert) that this backend computed, over a
  // sliding window; null where the experts run elsewhere (their workers count).
  virtual const RoutingWindow* routing() const { return nullptr; }
};

class LocalExperts : public ExpertBackend {
 public:
  explicit LocalExperts(const model::ModelWeights& w)
      : LocalExperts(std::make_unique<ExpertRunner>(w), w.config()) {}
  LocalExperts(std::unique_ptr<ExpertCompute> compute, const ModelConfig& c)
      : compute_(std::move(compute)), hidden_(c.hidden), routed_(c.layers, c.experts) {}
  Status begin_step() override {
    routed_.begin_step();
    return ok_status();
  }
  Status start(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed) override;
  Status finish(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed,
                float* results) override;
  const RoutingWindow* routing() const override { return &routed_; }

 private:
  std::unique_ptr<ExpertCompute> compute_;
  int64_t hidden_;
  std::vector<int> all_;            // 0..E-1
  std::vector<int64_t> offsets_;
  RoutingWindow routed_;
  std::vector<std::vector<float>> out_;  // per micro-batch
};

}  // namespace msinfer::runtime
