// The co-located engine: one process, all experts local. Continuous batching:
// requests join and leave between steps; each step runs the decode token of
// every running request plus prompt chunks of requests still in prefill, up to
// a token budget, through one forward pass.
//
// Admission reserves KV blocks for the prompt plus max_tokens, so a running
// request never runs out of cache; a request that could never fit is refused
// with RESOURCE_EXHAUSTED at add(), one that fits later waits in the queue.
// Not thread-safe: one thread calls add() and step().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "msinfer/model/weights.h"
#include "msinfer/runtime/expert_backend.h"
#include "msinfer/runtime/kv_cache.h"
#include "msinfer/runtime/model_runner.h"
#include "msinfer/runtime/sampling.h"

namespace msinfer::runtime {

struct EngineOptions {
  int64_t kv_cache_bytes = 256ll << 20;
  int64_t block_size = 16;
  int64_t max_step_tokens = 256;  // decode tokens + prefill chunk tokens per step
  int micro_batches = 1;          // m: the step's tokens split into m micro-batches
  // Run a step (all layers, empty micro-batches) even with nothing to do: an
  // attention worker must still answer the expert workers in lockstep.
  bool step_when_idle = false;
};

struct GenerationRequest {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
};

// One token produced for a request in a step.
struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;
  bool finished = false;
  std::string finish_reason;  // "eos", "stop", "length" when finished
};

class Engine {
 public:
  // Experts run in this process unless `experts` is given (disaggregated).
  static StatusOr<std::unique_ptr<Engine>> create(std::shared_ptr<const model::ModelWeights> w,
                                                  const EngineOptions& options,
                                                  std::unique_ptr<ExpertBackend> experts = nullptr);

  // Queues a request. INVALID_ARGUMENT for an empty prompt, a bad token id, bad
  // sampling or an id that a queued or running request has; RESOURCE_EXHAUSTED when prompt +
  // max_tokens exceeds the whole KV cache or the model's context.
  Status add(GenerationRequest r);
  // Runs one step; returns the tokens produced (possibly none, during prefill).
  // Fails only when the expert backend does (a remote worker died or timed out).
  StatusOr<std::vector<TokenEvent>> step();
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }

  // Called with the logits a token was sampled from (tests compare them).
  using LogitsObserver = std::function<void(int64_t request_id, const float* logits, int64_t vocab)>;
  void set_logits_observer(LogitsObserver f) { observer_ = std::move(f); }

  const ModelConfig& config() const { return weights_->config(); }
  const KvCache& kv_cache() const { return kv_; }

 private:
  struct Running {
    GenerationRequest req;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t computed = 0;         // tokens whose K/V are in the cache
    int64_t generated = 0;
    std::mt19937_64 rng;
  };
  Engine(std::shared_ptr<const model::ModelWeights> w, KvCache kv, const EngineOptions& o,
         std::unique_ptr<ExpertBackend> experts);
  void admit();

  std::shared_ptr<const model::ModelWeights> weights_;
  KvCache kv_;
  EngineOptions options_;
  AttentionRunner attention_;
  std::unique_ptr<ExpertBackend> experts_;
  std::deque<GenerationRequest> waiting_;
  std::vector<Running> running_;
  LogitsObserver observer_;
  // Per micro-batch: tokens, residual stream, routing, expert results.
  struct MicroBatch {
    TokenBatch batch;
    std::vector<int64_t> owners;  // running_ index of each request in it, with tokens fed
    std::vector<int64_t> fed;
    std::vector<float> x, results;
    kernels::cpu::RoutedBatch routed;
  };
  std::vector<MicroBatch> mbs_;
  std::vector<float> logits_;
};

}  // namespace msinfer::runtime
