// MoE kernels of the CPU backend: the fused gate kernel of docs/RUNTIME.md's layer sequence
// step 2, the matching combine, and the SwiGLU expert FFN.
#pragma once

#include <cstdint>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/kernels/cpu/gemm.h"

namespace msinfer::kernels::cpu {

// What the fused gate kernel produces for one micro-batch of T tokens.
// Send-buffer layout: rows grouped by destination worker (in order), inside a
// destination by expert id (ascending), inside an expert by token (ascending).
// Row r is hidden floats at send[r * hidden]. An expert with no tokens has an
// empty range; a destination with no rows still has its (empty) range.
struct RoutedBatch {
  int64_t tokens = 0, top_k = 0, experts = 0, destinations = 0, hidden = 0;
  std::vector<int32_t> topk_expert;    // [T*K] chosen experts of token t at t*K + k
  std::vector<float> topk_weight;      // [T*K] their combine weights
  std::vector<int32_t> expert_offset;  // [E+1] (by expert id) first send row of the expert; [E] = rows
  std::vector<int32_t> expert_count;   // [E] rows routed to the expert
  std::vector<int32_t> dest_offset;    // [D+1] first send row of each destination
  std::vector<int32_t> row_token;      // [T*K] token of each send row
  std::vector<int32_t> slot_row;       // [T*K] send row of (token t, k) at t*K + k
  std::vector<float> send;             // [T*K, hidden]

  int64_t rows() const { return tokens * top_k; }
  int64_t expert_rows(int64_t e) const { return expert_count[e]; }
};

// One pass over router logits [T, E]: softmax, top-K (ties to the lower id),
// optional renormalisation of the K weights, per-expert counts, and a scatter
// of each token's hidden row x[t] into the send buffer once per chosen expert.
// expert_dest[e] is the destination worker of expert e (nullptr: expert e goes
// to destination e, destinations = E).
void fused_gate(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                bool normalize, const int32_t* expert_dest, int64_t destinations, const float* x,
                int64_t hidden, RoutedBatch* out);

// gpt-oss's gate (OpenAI's reference: torch.topk of the logits, then softmax
// over those K values): per token the K largest logits [T, E] (ties to the
// lower id), in descending order, into expert[t*K..], and their softmax
// exp(l - l_max) * (1 / sum) (the sum in order, float32) into weight[t*K..].
// Then route_rows scatters the rows.
void topk_softmax(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                  int32_t* expert, float* weight);

// The second half of fused_gate, for a gate computed elsewhere (on a GPU):
// given out->topk_expert and out->topk_weight ([T*K], filled by the caller),
// fills the counts, offsets, row maps and the send rows from x [T, hidden].
void route_rows(int64_t tokens, int64_t experts, int64_t top_k, const int32_t* expert_dest,
                int64_t destinations, const float* x, int64_t hidden, RoutedBatch* out);
// The same result computed step by step (softmax, sort, count, prefix sum, scatter).
void gate_reference(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                    bool normalize, const int32_t* expert_dest, int64_t destinations,
                    const float* x, int64_t hidden, RoutedBatch* out);

// out[t] += sum_k weight(t, k) * results[slot_row(t, k)]; results is [T*K, hidden]
// in send-buffer row order.
void moe_combine(const RoutedBatch& r, const float* results, float* out);

// SwiGLU expert: y = W2 (silu(x W1^T) * (x W3^T)), with W1 and W3 stacked as
// w13 [2F, h] and w2 [h, F]. x, y are [rows, h]; rows may be 0.
void expert_ffn(const PackedLinear& w13, const PackedLinear& w2, const float* x, int64_t rows,
                float* y);
void expert_ffn_reference(const bf16* w1, const bf16* w3, const bf16* w2, int64_t f, int64_t h,
                          const float* x, int64_t rows, float* y);

// gpt-oss's expert (its clamped SwiGLU with biases): gu = x W13^T + b13 with
// W13 [2F, h] and b13 [2F] gate rows first, then up rows (the loader
// de-interleaves HF's gate_up_proj); g = min(gu[:F], limit), u =
// clamp(gu[F:], -limit, limit), a = g sigmoid(alpha g) (u + 1); y = a W2^T +
// b2 (b2 [h], or null: an expert tp shard other than 0 adds no bias).
struct ClampedSwiglu {
  float alpha = 1.702f;
  float limit = 7.0f;
};
void expert_ffn_clamped(const PackedLinear& w13, const float* b13, const PackedLinear& w2,
                        const float* b2, ClampedSwiglu act, const float* x, int64_t rows, float* y);
// The activation alone, in place of gate_up [rows, 2F] -> out [rows, F]
// (b13 already added); plain loops, its own reference.
void clamped_swiglu(const float* gate_up, int64_t rows, int64_t f, ClampedSwiglu act, float* out);

}  // namespace msinfer::kernels::cpu
