// DeepSeek's multi-head latent attention (MLA), absorbed form, over a paged
// latent cache: for prefill (causal, any chunk) and decode alike, every query
// token carries its position p and its request's block table and attends to
// cache positions 0..p of that request. mla_attention runs the active CPU
// level's kernel (internal/portable.inc and simd.inc: online softmax over
// blocks of 16 or 64 positions, each latent row read once per token and
// widened to fp32 once for all heads; threads over tokens, and over heads when
// the tokens are fewer than the threads); mla_attention_reference is the plain
// C++ the levels are tested against. The cost is O(context x heads x (kv_lora + rope)) per token.
//
// Cache layout: a PagedKvLayer with kv_heads 1, head_dim = kv_lora + rope and
// no V pool (v null): position p's row holds the normed latent c_p [kv_lora]
// then the roped key k_pe_p [rope], bf16, shared by every head.
#pragma once

#include <cstdint>

#include "msinfer/kernels/cpu/attention.h"

namespace msinfer::kernels::cpu {

// Stores latent [tokens, kv_lora + rope] (rounded to bf16) at each token's position.
void mla_write_latent(const PagedKvLayer& kv, const float* latent, int64_t tokens,
                      const int32_t* positions, const int32_t* const* block_tables);

// q_nope [tokens, heads, nope] through the key half of kv_b_proj, per head:
// q_latent[t, h, c] = sum_d q_nope[t, h, d] w_uk[h, d, c] (w_uk [heads, nope,
// kv_lora] bf16), float32 accumulation, no rounding of q.
void mla_absorb_query(const float* q_nope, int64_t tokens, int64_t heads, int64_t nope,
                      int64_t kv_lora, const bf16* w_uk, float* q_latent);

// out_latent[t, h] = sum_p softmax_p(scale (q_latent[t, h] . c_p + q_pe[t, h] . k_pe_p)) c_p
// over p = 0..positions[t]. q_latent [tokens, heads, kv_lora], q_pe [tokens,
// heads, rope], out_latent [tokens, heads, kv_lora], float32.
void mla_attention(const float* q_latent, const float* q_pe, int64_t tokens, int64_t heads,
                   int64_t kv_lora, int64_t rope, const PagedKvLayer& kv, const int32_t* positions,
                   const int32_t* const* block_tables, float scale, float* out_latent);

// The plain reference of mla_attention: each token's rows 0..p widened to fp32,
// scores, then softmax and the weighted sum in index order (float32). The
// kernel's levels sum in another order and use a vector exp: they differ from
// it by ~1e-6 relative to the output's largest value.
void mla_attention_reference(const float* q_latent, const float* q_pe, int64_t tokens,
                             int64_t heads, int64_t kv_lora, int64_t rope, const PagedKvLayer& kv,
                             const int32_t* positions, const int32_t* const* block_tables,
                             float scale, float* out_latent);

// The value half: out[t, h, j] = sum_c latent[t, h, c] w_uv[h, j, c] (w_uv
// [heads, v, kv_lora] bf16), float32; out is [tokens, heads * v] (o_proj's input).
void mla_value_up(const float* latent, int64_t tokens, int64_t heads, int64_t kv_lora, int64_t v,
                  const bf16* w_uv, float* out);

// Plain references of the two products (each head's weights widened to fp32,
// sums in index order); the levels read the bf16 weights in place and sum
// value_up's dot products in another order.
void mla_absorb_query_reference(const float* q_nope, int64_t tokens, int64_t heads, int64_t nope,
                                int64_t kv_lora, const bf16* w_uk, float* q_latent);
void mla_value_up_reference(const float* latent, int64_t tokens, int64_t heads, int64_t kv_lora,
                            int64_t v, const bf16* w_uv, float* out);

}  // namespace msinfer::kernels::cpu
