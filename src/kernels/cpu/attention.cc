#include "msinfer/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace msinfer::kernels::cpu {

void write_kv(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
              const int32_t* positions, const int32_t* const* block_tables) {
  const int64_t n = kv.slot_elems();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t off = kv.offset(block_tables[t], positions[t]);
    float_to_bf16_n(k + t * n, kv.k + off, n);
    float_to_bf16_n(v + t * n, kv.v + off, n);
  }
}

void paged_attention(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                     const int32_t* positions, const int32_t* const* block_tables, float scale,
                     float* out) {
  const int64_t hd = kv.head_dim;
  const int64_t group = heads / kv.kv_heads;
  const int64_t work = tokens * kv.kv_heads;
#pragma omp parallel
  {
    std::vector<float> scores, kf(hd), acc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t t = w / kv.kv_heads, g = w % kv.kv_heads;
      const int64_t ctx = positions[t] + 1;
      const int32_t* table = block_tables[t];
      scores.assign(static_cast<size_t>(group * ctx), 0.f);
      const float* qg = q + (t * heads + g * group) * hd;
      // Pass 1: scores for every head of the group, reading each K row once.
      for (int64_t p = 0; p < ctx; ++p) {
        const bf16* kr = kv.k + kv.offset(table, p) + g * hd;
        for (int64_t i = 0; i < hd; ++i) kf[i] = bf16_to_float(kr[i]);
        for (int64_t h = 0; h < group; ++h) {
          const float* qh = qg + h * hd;
          float dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kf[i];
          scores[h * ctx + p] = dot * scale;
        }
      }
      // Softmax per head.
      for (int64_t h = 0; h < group; ++h) {
        float* s = scores.data() + h * ctx;
        float mx = *std::max_element(s, s + ctx);
        float sum = 0;
        for (int64_t p = 0; p < ctx; ++p) {
          s[p] = std::exp(s[p] - mx);
          sum += s[p];
        }
        const float inv = 1.0f / sum;
        for (int64_t p = 0; p < ctx; ++p) s[p] *= inv;
      }
      // Pass 2: weighted sum of V, each V row read once for the group.
      acc.assign(static_cast<size_t>(group * hd), 0.f);
      for (int64_t p = 0; p < ctx; ++p) {
        const bf16* vr = kv.v + kv.offset(table, p) + g * hd;
        for (int64_t i = 0; i < hd; ++i) kf[i] = bf16_to_float(vr[i]);
        for (int64_t h = 0; h < group; ++h) {
          const float s = scores[h * ctx + p];
          float* a = acc.data() + h * hd;
          for (int64_t i = 0; i < hd; ++i) a[i] += s * kf[i];
        }
      }
      std::copy(acc.begin(), acc.end(), out + (t * heads + g * group) * hd);
    }
  }
}

void paged_attention_reference(const float* q, int64_t tokens, int64_t heads,
                               const PagedKvLayer& kv, const int32_t* positions,
                               const int32_t* const* block_tables, float scale, float* out) {
  const int64_t hd = kv.head_dim;
  const int64_t group = heads / kv.kv_heads;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t ctx = positions[t] + 1;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> s(ctx);
      double mx = -1e300;
      for (int64_t p = 0; p < ctx; ++p) {
        const bf16* kr = kv.k + kv.offset(block_tables[t], p) + g * hd;
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += q[(t * heads + h) * hd + i] * bf16_to_float(kr[i]);
        s[p] = dot * scale;
        mx = std::max(mx, s[p]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < ctx; ++p) {
          acc += s[p] / sum * bf16_to_float(kv.v[kv.offset(block_tables[t], p) + g * hd + i]);
        }
        out[(t * heads + h) * hd + i] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace msinfer::kernels::cpu
