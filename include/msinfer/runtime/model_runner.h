// The forward pass split the way disaggregation splits it (docs/RUNTIME.md, "One layer of one micro-batch"):
// AttentionRunner does everything an attention worker does (embedding,
// attention over its KV cache, norms, router, fused gate, combine, residual,
// LM head); ExpertRunner runs one expert's FFN on the rows sent to it. The
// co-located engine calls both in one process; the disaggregated workers call
// one each. Neither is thread-safe (they own scratch buffers).
//
// AttentionCompute and ExpertCompute are what the engine and the workers call;
// AttentionRunner / ExpertRunner are the CPU implementations, and the CUDA
// backend's (runtime/cuda_runner.h) run the same steps on a GPU. The hidden
// states stay in host memory at this interface (the M2N send buffer is host
// memory too): a device implementation copies them in and out per layer.
#pragma once

#include <cstdint>
#include <vector>

#include "msinfer/kernels/cpu/moe.h"
#include "msinfer/model/weights.h"
#include "msinfer/runtime/kv_cache.h"

namespace msinfer::runtime {

// Tokens of one forward step: token i has id ids[i], sits at positions[i] of the
// request whose block table is block_tables[i] (in the KV cache's layer group
// 0; group g > 0: group_tables[g - 1][i], KvCache "Layer groups").
struct TokenBatch {
  std::vector<int32_t> ids;
  std::vector<int32_t> positions;
  std::vector<const int32_t*> block_tables;
  std::vector<std::vector<const int32_t*>> group_tables;
  int64_t size() const { return static_cast<int64_t>(ids.size()); }
  // The tokens' tables in layer group g, one per token (null for a group
  // no token has a table in: an empty batch, which an idle worker steps).
  const int32_t* const* tables(int g) const {
    if (g == 0) return block_tables.data();
    return static_cast<size_t>(g) <= group_tables.size()
               ? group_tables[static_cast<size_t>(g - 1)].data()
               : nullptr;
  }
  std::vector<const int32_t*>& tables_of(int g) {
    if (g == 0) return block_tables;
    if (group_tables.size() < static_cast<size_t>(g)) group_tables.resize(static_cast<size_t>(g));
    return group_tables[static_cast<size_t>(g - 1)];
  }
  void clear() {
    ids.clear();
    positions.clear();
    block_tables.clear();
    for (auto& t : group_tables) t.clear();
  }
};

class AttentionCompute {
 public:
  virtual ~AttentionCompute() = default;
  // x[T, h] = embedding rows of the batch.
  virtual Status embed(const TokenBatch& b, float* x) = 0;
  // See AttentionRunner::attention_and_gate.
  virtual Status attention_and_gate(int l, const TokenBatch& b, KvCache& kv, float* x,
                                    kernels::cpu::RoutedBatch* routed,
                                    const int32_t* expert_dest = nullptr,
                                    int64_t destinations = 0) = 0;
  // x += the gate-weighted expert results (rows in send-buffer order), on the
  // host, where the results arrive: the same for every implementation.
  void combine(const kernels::cpu::RoutedBatch& routed, const float* results, float* x) const;
  virtual Status logits(const std::vector<const float*>& rows, float* out) = 0;
};

class ExpertCompute {
 public:
  virtual ~ExpertCompute() = default;
  // For each i: out rows [offset[i], offset[i+1]) = FFN of expert experts[i] of
  // layer l on the same rows of `rows` ([offset.back(), h], in and out).
  virtual Status forward_group(int l, const std::vector<int>& experts,
                               const std::vector<int64_t>& offset, const float* rows,
                               float* out) = 0;
};

// Attention tensor parallelism, seen from rank 0 of an attention replica:
// the other tp_attention - 1 ranks, which hold the other heads
// (LoadOptions::attention_tp_rank). Per layer rank 0 hands them the normed
// input rows and the batch's positions and block tables (start), computes its
// own heads' partial o_proj output meanwhile, then adds theirs (add_partials).
// Implemented over M2N by the disaggregated runtime (disaggregated.cc).
class AttentionPeers {
 public:
  virtual ~AttentionPeers() = default;
  // h[T, hidden]: layer l's input after the input norm (T = b.size() > 0).
  // `tables`: the tokens' block tables of layer l's KV group.
  virtual Status start(int l, const TokenBatch& b, const int32_t* const* tables,
                       const float* h) = 0;
  // o[T, hidden] (rank 0's partial) += ranks 1, 2, ...'s partials, in rank
  // order, so the sum does not depend on arrival order. Blocks.
  virtual Status add_partials(int l, int64_t T, float* o) = 0;
};

class AttentionRunner : public AttentionCompute {
 public:
  // With weights of attention tp rank 0 of tp > 1 (model/weights.h), `peers`
  // are the other ranks (not owned; must outlive this runner). The KV cache
  // passed in holds this rank's KV heads only (attention_tp_config).
  explicit AttentionRunner(const model::ModelWeights& w, AttentionPeers* peers = nullptr)
      : w_(w), peers_(peers) {}

  // x[T, h] = embedding rows of the batch.
  Status embed(const TokenBatch& b, float* x) override;
  // Layer l up to the experts: x += O(attention(RoPE(QKV(norm(x))))) over the
  // KV cache (the batch's K/V are written first); then the post-attention norm
  // of x goes through the router and the fused gate into `routed` (experts
  // grouped by expert_dest[e], or one destination per expert when nullptr).
  // DeepSeek: latent attention; the gate is grouped_topk (kernels/cpu/
  // grouped_topk.h) then route_rows; the shared experts' output is added to x
  // here, and a dense layer adds its MLP here and routes no rows (top_k 0).
  // When the weights lack a MoE layer's shared experts (held by an expert
  // worker: LoadOptions::shared_experts_with_attention), they are routed as
  // expert E = experts, in slot 0 of every token with weight 1 (top_k + 1
  // slots, experts + 1 experts in `routed`).
  // GLM-4.5: GQA attention (q/k/v biases, partial rotary) and DeepSeek's MoE side.
  Status attention_and_gate(int l, const TokenBatch& b, KvCache& kv, float* x,
                            kernels::cpu::RoutedBatch* routed, const int32_t* expert_dest = nullptr,
                            int64_t destinations = 0) override;
  // Final norm and LM head for the given hidden-state rows (from any
  // micro-batch), in one GEMM: out[rows.size(), vocab].
  Status logits(const std::vector<const float*>& rows, float* out) override;

  // This rank's heads of layer l: o[T, hidden] = o_proj slice (attention(
  // RoPE(QKV slice(h)))) over its KV cache (the batch's K/V written first),
  // where h[T, hidden] is the layer's normed input. The whole layer's
  // attention output is the sum of the tp ranks' o (all of it at tp 1).
  Status attention_partial(int l, const TokenBatch& b, KvCache& kv, const float* h, float* o);

 private:
  // DeepSeek's latent attention (kv_lora_rank > 0), absorbed: the layer's part
  // of attention_partial.
  Status mla_partial(int l, const TokenBatch& b, KvCache& kv, const float* h, float* o);

  const model::ModelWeights& w_;
  AttentionPeers* peers_ = nullptr;
  std::vector<float> h_, qkv_, q_, k_, v_, attn_, o_, router_, sel_;
  std::vector<float> qa_, latent_, q_pe_, q_lat_, out_lat_, ffn_;
  std::vector<float> rope_;      // partial rotary's gathered dims
  std::vector<float> inv_freq_;  // YaRN's rotary inverse frequencies (MLA, gpt-oss), computed once
};

// The config a tp rank's KV cache is sized by: heads and KV heads divided by
// the weights' attention_tp_size (unchanged at tp 1).
ModelConfig attention_tp_config(const model::ModelWeights& w);

class ExpertRunner : public ExpertCompute {
 public:
  explicit ExpertRunner(const model::ModelWeights& w) : w_(w) {}
  // out[n, h] = FFN of expert e in layer l on rows[n, h].
  void forward(int l, int e, const float* rows, int64_t n, float* out) const;
  Status forward_group(int l, const std::vector<int>& experts, const std::vector<int64_t>& offset,
                       const float* rows, float* out) override;

 private:
  const model::ModelWeights& w_;
};

}  // namespace msinfer::runtime
