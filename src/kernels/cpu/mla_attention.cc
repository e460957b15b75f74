#include "msinfer/kernels/cpu/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "internal/level.h"

namespace msinfer::kernels::cpu {

void mla_write_latent(const PagedKvLayer& kv, const float* latent, int64_t tokens,
                      const int32_t* positions, const int32_t* const* block_tables) {
  const int64_t d = kv.head_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    bf16* row = kv.k + kv.offset(block_tables[t], positions[t], 0);
    for (int64_t i = 0; i < d; ++i) row[i] = float_to_bf16(latent[t * d + i]);
  }
}

void mla_absorb_query(const float* q_nope, int64_t tokens, int64_t heads, int64_t nope,
                      int64_t kv_lora, const bf16* w_uk, float* q_latent) {
  internal::active_kernels().mla_absorb_query(q_nope, tokens, heads, nope, kv_lora, w_uk, q_latent);
}

void mla_absorb_query_reference(const float* q_nope, int64_t tokens, int64_t heads, int64_t nope,
                                int64_t kv_lora, const bf16* w_uk, float* q_latent) {
  std::vector<float> w(static_cast<size_t>(nope * kv_lora));
  for (int64_t h = 0; h < heads; ++h) {
    bf16_to_float_n(w_uk + h * nope * kv_lora, w.data(), nope * kv_lora);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* q = q_nope + (t * heads + h) * nope;
      float* out = q_latent + (t * heads + h) * kv_lora;
      std::fill(out, out + kv_lora, 0.0f);
      for (int64_t d = 0; d < nope; ++d) {
        const float qd = q[d];
        const float* wr = w.data() + d * kv_lora;
        for (int64_t c = 0; c < kv_lora; ++c) out[c] += qd * wr[c];
      }
    }
  }
}

void mla_attention(const float* q_latent, const float* q_pe, int64_t tokens, int64_t heads,
                   int64_t kv_lora, int64_t rope, const PagedKvLayer& kv, const int32_t* positions,
                   const int32_t* const* block_tables, float scale, float* out_latent) {
  internal::active_kernels().mla_attention(q_latent, q_pe, tokens, heads, kv_lora, rope, kv,
                                           positions, block_tables, scale, out_latent);
}

void mla_attention_reference(const float* q_latent, const float* q_pe, int64_t tokens,
                             int64_t heads, int64_t kv_lora, int64_t rope, const PagedKvLayer& kv,
                             const int32_t* positions, const int32_t* const* block_tables,
                             float scale, float* out_latent) {
  const int64_t d = kv.head_dim;  // kv_lora + rope
  std::vector<float> ctx, p;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t n = static_cast<int64_t>(positions[t]) + 1;
    // The request's rows 0..p as float32.
    ctx.resize(static_cast<size_t>(n * d));
    for (int64_t j = 0; j < n; ++j) {
      bf16_to_float_n(kv.k + kv.offset(block_tables[t], j, 0), ctx.data() + j * d, d);
    }
    p.resize(static_cast<size_t>(n));
    for (int64_t h = 0; h < heads; ++h) {
      const float* ql = q_latent + (t * heads + h) * kv_lora;
      const float* qp = q_pe + (t * heads + h) * rope;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* row = ctx.data() + j * d;
        float a = 0, b = 0;
        for (int64_t c = 0; c < kv_lora; ++c) a += ql[c] * row[c];
        for (int64_t r = 0; r < rope; ++r) b += qp[r] * row[kv_lora + r];
        p[j] = (a + b) * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      float* out = out_latent + (t * heads + h) * kv_lora;
      std::fill(out, out + kv_lora, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float w = p[j] / sum;
        const float* row = ctx.data() + j * d;
        for (int64_t c = 0; c < kv_lora; ++c) out[c] += w * row[c];
      }
    }
  }
}

void mla_value_up(const float* latent, int64_t tokens, int64_t heads, int64_t kv_lora, int64_t v,
                  const bf16* w_uv, float* out) {
  internal::active_kernels().mla_value_up(latent, tokens, heads, kv_lora, v, w_uv, out);
}

void mla_value_up_reference(const float* latent, int64_t tokens, int64_t heads, int64_t kv_lora,
                            int64_t v, const bf16* w_uv, float* out) {
  std::vector<float> w(static_cast<size_t>(v * kv_lora));
  for (int64_t h = 0; h < heads; ++h) {
    bf16_to_float_n(w_uv + h * v * kv_lora, w.data(), v * kv_lora);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* l = latent + (t * heads + h) * kv_lora;
      float* o = out + t * heads * v + h * v;
      for (int64_t j = 0; j < v; ++j) {
        const float* wr = w.data() + j * kv_lora;
        float s = 0;
        for (int64_t c = 0; c < kv_lora; ++c) s += l[c] * wr[c];
        o[j] = s;
      }
    }
  }
}

}  // namespace msinfer::kernels::cpu
