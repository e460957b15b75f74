// The co-located engine: one process, all experts local. Continuous batching:
// requests join and leave between steps; each step runs the decode token of
// every running request plus prompt chunks of requests still in prefill, up to
// a token budget, through one forward pass.
//
// KV blocks are taken on demand: a request is admitted (first come, first
// served) when the blocks of the tokens it must compute are free beyond the
// next step's needs of those running and a watermark of 1% of the pool, and takes
// one more block whenever its tokens cross a block boundary. When the pool runs
// out, the most recently admitted request is preempted, as vLLM does: its
// blocks are freed and it goes back to the front of the queue, to recompute
// its prompt + tokens so far when blocks are free again (its sampler state
// kept, so its output is the one it would have produced). A request that could
// never fit alone (prompt + max_tokens beyond the whole cache) is refused with
// RESOURCE_EXHAUSTED at add().
//
// n samples of one prompt (GenerationRequest::n > 1): the request is one
// sequence until its prompt is in the cache and its first logits are out;
// then it forks into n sequences (KvCache::fork: the prompt's full blocks
// shared, a partly filled last block copied; where the pools are on a GPU
// or split over attention-tp ranks, not copied but recomputed by each new
// sequence, under a block per sequence). Each samples its own tokens from
// then on with its own generator, seeded seed + i for sequence i (vLLM's
// rule), and is scheduled, preempted (releasing only its own references)
// and finished on its own; its events carry its index.
//
// Prefix caching (EngineOptions::prefix_caching, on by default): at
// admission a request takes the longest chain of cached full blocks matching
// its tokens (KvCache::match_prefix) and computes only the rest; after each
// step the blocks it filled are registered (KvCache::cache_blocks). Cached
// blocks no sequence holds count as free and are evicted when needed, so
// admission, preemption and kv_usage() see them as free. A preempted
// request looks its tokens up again when readmitted.
// Not thread-safe: one thread calls add(), cancel() and step().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "msinfer/model/weights.h"
#include "msinfer/runtime/expert_backend.h"
#include "msinfer/runtime/finish_reason.h"
#include "msinfer/runtime/kv_cache.h"
#include "msinfer/runtime/model_runner.h"
#include "msinfer/runtime/sampling.h"

namespace msinfer::runtime {

struct EngineOptions {
  int64_t kv_cache_bytes = 256ll << 20;
  int64_t block_size = KvCache::kDefaultBlockSize;
  // The step's token budget: decode tokens + prefill chunk tokens per step
  // (vLLM's max_num_batched_tokens; the CLI's --max-num-batched-tokens).
  // Running sequences beyond it decode in a later step; keep it at least the
  // number of sequences in the batch. docs/SERVING.md says how the default
  // was chosen.
  static constexpr int64_t kDefaultMaxStepTokens = 256;
  int64_t max_step_tokens = kDefaultMaxStepTokens;
  int micro_batches = 1;          // m: the step's tokens split into m micro-batches
  // Run a step (all layers, empty micro-batches) even with nothing to do: an
  // attention worker must still answer the expert workers in lockstep.
  bool step_when_idle = false;
  // Where the attention side (and co-located experts) run: "cpu" or
  // "cuda[:N]" (runtime/device_backend.h).
  std::string device = "cpu";
  // Predicted attention time of a token: per_token + per_position x its
  // context length (arbitrary units; both 0: defaults from the model's
  // shape, Engine's constructor). Micro-batches are composed to equal predicted time.
  double attention_cost_per_token = 0, attention_cost_per_position = 0;
  // Attention tensor parallelism: with weights loaded as rank 0 of
  // tp_attention > 1 ranks, the other ranks (not owned; must outlive the
  // engine). The engine is the replica's one scheduler: its KV cache holds
  // this rank's KV heads (so a budget holds tp times the tokens), and every
  // rank uses the block tables it decides. CPU only.
  AttentionPeers* attention_peers = nullptr;
  // Automatic prefix caching (KvCache, "Prefix caching"): a request starts
  // from the longest chain of cached full blocks of its tokens and computes
  // only the rest. The cache lives as long as the engine, whose weights are
  // fixed; prefix_cache_salt is mixed into every chain with the model's
  // name, directory and device, for anything else that changes the K/V.
  bool prefix_caching = true;
  uint64_t prefix_cache_salt = 0;
  // Keep the cache's registrations and evictions for
  // take_prefix_cache_events (an attention worker reports them to the
  // router, which routes by them). Off: nothing is kept.
  bool prefix_cache_events = false;
  // Where the KV cache's pools live (KvCache::PoolMemory; null: memory the
  // cache maps itself). An attention worker that prefill workers write
  // into gives its K/V transport's memory.
  KvCache::PoolMemory kv_pool_memory;
};

struct GenerationRequest {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  // Sequences sampled from the prompt (1..kMaxSequences): OpenAI's n, or
  // best_of where the server keeps the best n of them.
  int n = 1;
  static constexpr int kMaxSequences = 256;
  // Prefill/decode disaggregation: each sequence stops after its first token
  // (produced as usual, finished only if that token ends it) and waits, its
  // K/V held, for Engine::take_prefilled to hand it to a decoding engine.
  bool prefill_only = false;
};

// A sequence whose prompt one engine computed, for another engine to decode
// (Engine::take_prefilled, Engine::add_prefilled; docs/RUNTIME.md,
// "Prefill/decode disaggregation"). Its first token was sampled where the
// prompt was; the decoding engine samples the rest as the first engine would
// have: same tokens, same generator state.
struct PrefilledSequence {
  GenerationRequest request;    // prefill_only cleared
  int32_t index = 0;            // which of the request's n sequences (TokenEvent::index)
  std::vector<int32_t> tokens;  // prompt + tokens generated so far
  int64_t computed = 0;         // positions whose K/V `kv` holds: tokens.size() - 1
  int64_t generated = 0;
  std::string rng;          // the sampler's std::mt19937_64, as operator<< writes it
  uint64_t kv_layout = 0;   // KvCache::layout_id of the cache that wrote kv
  std::vector<uint8_t> kv;  // KvCache::export_kv of positions [0, computed)
  // Engine::take_prefilled(false): the kv stays in the prefilling engine's
  // cache under this table key (kv empty) until release_prefilled; -1
  // otherwise. Not sent anywhere.
  int64_t kv_seq = -1;
};

// Where a decoding engine placed a prefilled sequence's K/V
// (Engine::place_prefilled): the blocks a sender writes them into.
struct PlacedKv {
  std::vector<std::vector<int32_t>> table;  // KvCache::transfer_table(.., skip_blocks)
  int64_t pool_blocks = 0;                  // KvCache::total_blocks
  // Leading blocks its prefix cache held already: not to be sent.
  int64_t skip_blocks = 0;
};

// One token produced for a request in a step.
struct TokenEvent {
  int64_t request_id = 0;
  // Which of the request's n sequences produced it (0..n-1).
  int32_t index = 0;
  int32_t token = -1;
  // This sequence ended (the request ends when all n have).
  bool finished = false;
  // kEos, kStop, kLength when finished; kError (token -1, `error` says why)
  // for a request a deployment lost, e.g. with a dead attention worker: that
  // one event ends the whole request, whatever its n.
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;
  // With SamplingParams::logprobs >= 0: log-probability of `token` and of the
  // most likely tokens (after penalties, before temperature).
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // On a sequence's first token: prompt tokens whose K/V came from the
  // prefix cache when the request was first admitted (OpenAI's
  // usage.prompt_tokens_details.cached_tokens); 0 on later tokens.
  int64_t cached_tokens = 0;
};

// What an engine counts while it runs. A deployment adds up its attention
// workers' (and keeps what workers it replaced had counted).
struct EngineCounters {
  // Requests preempted (blocks freed, requeued to recompute).
  int64_t preemptions = 0;
  // Prefix cache, in tokens as vLLM counts them: tokens of the requests
  // admitted (again after a preemption) / of those found in the cache (0
  // without prefix caching: queries - hits is what prefill computed).
  int64_t prefix_queries = 0, prefix_hits = 0;
  EngineCounters& operator+=(const EngineCounters& o) {
    preemptions += o.preemptions;
    prefix_queries += o.prefix_queries;
    prefix_hits += o.prefix_hits;
    return *this;
  }
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
  // Removes request `id` (every sequence of it, waiting or running) and
  // frees its KV blocks; it produces no more events. False if no such
  // request is here.
  bool cancel(int64_t id);
  // Prefill/decode disaggregation. The sequences of prefill_only requests
  // that have their first token, each with its K/V copied out (their blocks
  // freed here, their registered blocks staying cached), or, without
  // `copy_kv`, its blocks still held under PrefilledSequence::kv_seq for a
  // transfer from the pool (KvCache::transfer_spans) until
  // release_prefilled(kv_seq).
  std::vector<PrefilledSequence> take_prefilled(bool copy_kv = true);
  void release_prefilled(int64_t kv_seq) { kv_.release(kv_seq); }
  // Prefilled sequences waiting for take_prefilled.
  int64_t prefilled() const { return static_cast<int64_t>(parked_.size()); }
  // Queues a sequence another engine prefilled: at admission its K/V are
  // copied into blocks of this cache and it decodes from its next token on
  // (a preemption later makes it recompute, as any sequence). The checks of
  // add(), a request id in use only by other sequences of the same request,
  // and INVALID_ARGUMENT for K/V of another cache layout or size, or a
  // sequence that is finished or has no K/V.
  Status add_prefilled(PrefilledSequence s);
  // add_prefilled without the copy: when the blocks for the `kv_bytes` of
  // K/V (transfer_bytes of its computed positions) are free now beyond the
  // watermark, takes them (KvCache::place_kv) and returns where they are, for
  // a sender to write into; with prefix caching and no sliding layers, the
  // leading blocks the cache holds are shared instead (match_prefix) and
  // left out (PlacedKv::skip_blocks); commit_prefilled then starts decoding it (true:
  // the bytes are there) or frees them (false). Nullopt when they are not
  // free (the caller copies instead: add_prefilled). The checks of
  // add_prefilled; INVALID_ARGUMENT when the cache is not in host memory.
  StatusOr<std::optional<PlacedKv>> place_prefilled(PrefilledSequence s, int64_t kv_bytes);
  // False when no sequence (id, index) is placed.
  bool commit_prefilled(int64_t id, int32_t index, bool arrived);
  bool idle() const { return waiting_.empty() && running_.empty(); }
  // Sequences admitted into the batch / queued (a request with n > 1 counts
  // n once it has forked).
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Since creation.
  const EngineCounters& counters() const { return counters_; }
  // Frees the cached blocks no request holds (KvCache::flush_cache).
  void flush_prefix_cache() { kv_.flush_cache(); }
  // With EngineOptions::prefix_cache_events: KvCache::take_cache_events.
  int64_t take_prefix_cache_events(int64_t max, std::vector<uint64_t>* stored,
                                   std::vector<uint64_t>* removed) {
    return kv_.take_cache_events(max, stored, removed);
  }
  // Fraction of the KV cache's blocks in use (cached blocks no request
  // holds count as free: they are evicted when needed).
  double kv_usage() const {
    return 1.0 - static_cast<double>(kv_.free_blocks()) / static_cast<double>(kv_.total_blocks());
  }

  // Called with the logits a token was sampled from (tests compare them).
  using LogitsObserver =
      std::function<void(int64_t request_id, const float* logits, int64_t vocab)>;
  void set_logits_observer(LogitsObserver f) { observer_ = std::move(f); }

  const ModelConfig& config() const { return weights_->config(); }
  // Co-located: rows routed to each (layer, expert), sliding window
  // (worker_stats.h); null when the experts are remote (their workers count).
  const RoutingWindow* routing() const { return experts_->routing(); }
  const KvCache& kv_cache() const { return kv_; }
  // With m > 1: the mean over the steps so far of max / mean predicted
  // attention time of the step's micro-batches (1 = equal); 0 before any.
  double micro_batch_balance() const {
    return balance_steps_ ? balance_sum_ / static_cast<double>(balance_steps_) : 0.0;
  }

 private:
  // One sequence: a request, or one of the n samples of one.
  struct Running {
    GenerationRequest req;
    int64_t seq = 0;              // its KV block table's key, unique in this engine
    int32_t index = 0;            // TokenEvent::index
    int32_t fork_into = 1;        // > 1: sequences it becomes at its first token
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t computed = 0;         // tokens whose K/V are in the cache
    int64_t generated = 0;
    std::mt19937_64 rng;
    bool preempted = false;  // chosen as a victim during this step's planning
    int64_t cached_tokens = -1;  // prefix cache hit at its first admission (-1: not yet)
    std::vector<uint8_t> kv_import;  // add_prefilled: K/V of [0, computed), until admitted
  };
  // place_prefilled: sequences holding blocks that a sender writes into,
  // until commit_prefilled.
  std::vector<Running> placed_;
  // What add() and add_prefilled() check of a request (not its id).
  Status check_request(const GenerationRequest& r) const;
  // What add_prefilled and place_prefilled check of a sequence whose K/V
  // are `kv_bytes`; makes its Running (no blocks yet).
  StatusOr<Running> check_prefilled(PrefilledSequence& s, int64_t kv_bytes);
  // Admits a prefilled sequence (the front of waiting_) if its blocks are free
  // beyond `reserved`; false when they are not.
  bool admit_prefilled(Running& r, int64_t reserved);
  Engine(std::shared_ptr<const model::ModelWeights> w, KvCache kv, const EngineOptions& o,
         std::unique_ptr<AttentionCompute> attention, std::unique_ptr<ExpertBackend> experts);
  void admit();
  // Blocks admission leaves free: what the running sequences take in their
  // next step, plus a watermark of 1% of the pool (admit()).
  int64_t blocks_kept_free() const;
  // Takes blocks for this step's tokens of every running request, preempting
  // the most recently admitted ones when the pool runs out; returns
  // (running_ index, tokens to feed) per request that runs this step.
  std::vector<std::pair<size_t, int64_t>> plan_step();
  // Predicted attention time of feeding n tokens from position p0 on.
  double attention_cost(int64_t p0, int64_t n) const;
  // Samples r's next token from `logits` (penalties applied already),
  // appends its event; true when r has finished.
  bool sample_next(Running& r, const float* logits, std::vector<TokenEvent>* events);
  // r has its prompt's logits and n > 1: the n - 1 other sequences, their
  // K/V shared with r's (KvCache::fork), not yet sampled.
  std::vector<Running> fork_sequences(Running& r);

  std::shared_ptr<const model::ModelWeights> weights_;
  KvCache kv_;
  EngineOptions options_;
  std::unique_ptr<AttentionCompute> attention_;
  std::unique_ptr<ExpertBackend> experts_;
  std::deque<Running> waiting_;   // new requests, and preempted ones at the front
  std::vector<Running> running_;  // in admission order
  std::vector<Running> parked_;   // prefill_only sequences with their first token
  EngineCounters counters_;
  int64_t next_seq_ = 0;  // Running::seq of the next sequence
  double cost_token_ = 0, cost_position_ = 0;
  double balance_sum_ = 0;
  int64_t balance_steps_ = 0;
  std::vector<float> penalised_;
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
