// GQA attention over a paged KV cache, for prefill (causal, any chunk) and
// decode alike: every query token carries its position p and its request's
// block table and attends to cache positions 0..p of that request.
//
// KV layout of one layer (bf16): K and V pools of [num_blocks][kv_heads][block_size][head_dim];
// position p of a request lives in block table[p / block_size] at slot p % block_size,
// so one KV head's rows of a block are contiguous (head_dim * block_size elements).
// The caller writes the step's K/V (write_kv) before calling attention.
#pragma once

#include <cstdint>

#include "msinfer/core/bf16.h"
#include "msinfer/kernels/cpu/isa.h"

namespace msinfer::kernels::cpu {

struct PagedKvLayer {
  bf16* k = nullptr;
  bf16* v = nullptr;
  int64_t block_size = 16;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;

  int64_t slot_elems() const { return kv_heads * head_dim; }
  // Element offset of KV head g's row for position pos.
  int64_t offset(const int32_t* block_table, int64_t pos, int64_t g) const {
    return ((static_cast<int64_t>(block_table[pos / block_size]) * kv_heads + g) * block_size +
            pos % block_size) *
           head_dim;
  }
};

// Stores k, v [tokens, kv_heads, head_dim] (rounded to bf16) at each token's position.
void write_kv(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
              const int32_t* positions, const int32_t* const* block_tables);

// out[t, h, :] = softmax(scale * q[t, h] . K[0..p_t]) V[0..p_t], query head h using
// KV head h / (heads / kv_heads). q and out are [tokens, heads, head_dim].
void paged_attention(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                     const int32_t* positions, const int32_t* const* block_tables, float scale,
                     float* out);

// Whether paged_attention at `level` computes the scores q.K as bf16 dot
// products: at avx512bf16 and amx with head_dim a multiple of 32 up to 128,
// q is rounded to bf16 (as an HF bf16 model's q is) and vdpbf16ps runs on
// the K rows as stored; softmax and the value pass stay fp32. References that
// model the engine's numerics round q the same way where this is true.
bool attention_bf16_qk(IsaLevel level, int64_t head_dim);
// The plain reference: gathers each context to dense fp32 and loops in double;
// with bf16_qk, q rounded to bf16 as above.
void paged_attention_reference(const float* q, int64_t tokens, int64_t heads,
                               const PagedKvLayer& kv, const int32_t* positions,
                               const int32_t* const* block_tables, float scale, float* out,
                               bool bf16_qk = false);

}  // namespace msinfer::kernels::cpu
