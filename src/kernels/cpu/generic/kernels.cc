// The generic level: portable C++ for any x86-64 (or other) CPU, no
// intrinsics; the reference the other levels are tested against. GEMM weights
// in panels of 16 columns.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

namespace msinfer::kernels::cpu::internal::generic {

#include "../internal/portable.inc"

namespace {

constexpr int64_t kPanel = 16;

Status pack(const bf16* w, int64_t n, int64_t k, WeightFormat format, GemmWeights* out) {
  if (format == WeightFormat::kW8A8) return pack_w8a8_panels(w, n, k, kPanel, out);
  return pack_panels(w, n, k, format, kPanel, out);
}

Status pack_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t n, int64_t k,
                  GemmWeights* out) {
  return pack_mxfp4_panels(blocks, scales, n, k, kPanel, out);
}

void forward(const GemmWeights& w, const float* x, int64_t m, float* y) {
  if (w.format == WeightFormat::kW8A8) return w8a8_forward_portable(w, x, m, y);
  thread_local std::vector<float> xr;
  xr.assign(x, x + m * w.k);
  round_bf16_inplace(xr.data(), m * w.k);
  if (w.format == WeightFormat::kMxfp4) {
    mxfp4_forward_portable(w, xr.data(), m, y);
  } else if (w.format == WeightFormat::kBf16) {
    panel_forward_portable<bf16>(w, xr.data(), m, y);
  } else {
    panel_forward_portable<int8_t>(w, xr.data(), m, y);
  }
}

void paged_attention(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                     const int32_t* positions, const int32_t* const* block_tables, float scale,
                     float* out) {
  const int64_t hd = kv.head_dim, group = heads / kv.kv_heads, work = tokens * kv.kv_heads;
  team(true, [&] {
    std::vector<float> scores, kf, acc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t wi = 0; wi < work; ++wi) {
      const int64_t t = wi / kv.kv_heads, g = wi % kv.kv_heads;
      attend_group_portable(q + (t * heads + g * group) * hd, group, positions[t] + 1, kv,
                            block_tables[t], g, scale, scores, kf, acc,
                            out + (t * heads + g * group) * hd);
    }
  });
}

void mla_attention(const float* q_latent, const float* q_pe, int64_t tokens, int64_t heads,
                   int64_t kv_lora, int64_t rope, const PagedKvLayer& kv, const int32_t* positions,
                   const int32_t* const* block_tables, float scale, float* out_latent) {
  mla_attention_driver<MlaPortable>(q_latent, q_pe, tokens, heads, kv_lora, rope, kv, positions,
                                    block_tables, scale, out_latent);
}

void mla_absorb_query(const float* q_nope, int64_t tokens, int64_t heads, int64_t nope,
                      int64_t kv_lora, const bf16* w_uk, float* q_latent) {
  mla_absorb_query_portable(q_nope, tokens, heads, nope, kv_lora, w_uk, q_latent);
}

void mla_value_up(const float* latent, int64_t tokens, int64_t heads, int64_t kv_lora, int64_t v,
                  const bf16* w_uv, float* out) {
  mla_value_up_portable(latent, tokens, heads, kv_lora, v, w_uv, out);
}

void silu_mul(const float* gate_up, int64_t rows, int64_t f, float* out) {
  for_each_row(rows, rows * f > 65536, [&](int64_t r) {
    silu_mul_row_portable(gate_up + r * 2 * f, gate_up + r * 2 * f + f, 0, f, out + r * f);
  });
}

double exp_scaled(const float* x, int64_t n, float shift, float scale, float* out) {
  return exp_scaled_portable(x, 0, n, shift, scale, out);
}

// The largest value over 16 independent lanes (each compare `v > m ? v : m`
// is one packed max at any vector width: the compiler vectorises it), then
// its first index.
int64_t argmax(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  for (float& m : lane) m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  }
  float m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (i = 0; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;
}

}  // namespace

constexpr IsaLevel kLevel = IsaLevel::kGeneric;
#include "../internal/level_table.inc"

}  // namespace msinfer::kernels::cpu::internal::generic
