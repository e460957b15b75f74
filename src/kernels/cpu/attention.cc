#include "msinfer/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "internal/vec.h"

namespace msinfer::kernels::cpu {

void write_kv(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
              const int32_t* positions, const int32_t* const* block_tables) {
  const int64_t n = kv.slot_elems(), hd = kv.head_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t g = 0; g < kv.kv_heads; ++g) {
      const int64_t off = kv.offset(block_tables[t], positions[t], g);
      internal::to_bf16(k + t * n + g * hd, kv.k + off, hd);
      internal::to_bf16(v + t * n + g * hd, kv.v + off, hd);
    }
  }
}

#if defined(MSINFER_HAVE_AVX512)
namespace {

// Loads KV head g's row for position p of `pool` (K or V) as floats into
// row[hd/16], prefetching the row one block ahead: blocks are scattered, so the
// hardware prefetcher stops at each block's end.
inline void load_row(const bf16* pool, const PagedKvLayer& kv, const int32_t* table, int64_t p,
                     int64_t ctx, int64_t g, __m512* row) {
  const int64_t hd = kv.head_dim;
  if (p + kv.block_size < ctx) {
    const char* nx = reinterpret_cast<const char*>(pool + kv.offset(table, p + kv.block_size, g));
    for (int64_t b = 0; b < hd * 2; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);
  }
  const bf16* r = pool + kv.offset(table, p, g);
  for (int64_t c = 0; c < hd / 16; ++c) row[c] = internal::load_bf16(r + 16 * c);
}

// One (query token, KV head) pair with head_dim a multiple of 16: K and V rows
// are read once for the whole group of query heads.
void attend_group_avx512(const float* qg, int64_t group, int64_t ctx, const PagedKvLayer& kv,
                         const int32_t* table, int64_t g, float scale, std::vector<float>& scores,
                         std::vector<float>& acc, float* out) {
  const int64_t hd = kv.head_dim, nc = hd / 16;
  scores.resize(static_cast<size_t>(group * ctx));
  __m512 kf[16];
  for (int64_t p = 0; p < ctx; ++p) {
    load_row(kv.k, kv, table, p, ctx, g, kf);
    for (int64_t h = 0; h < group; ++h) {
      const float* qh = qg + h * hd;
      __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qh), kf[0]);
      for (int64_t c = 1; c < nc; ++c) a = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * c), kf[c], a);
      scores[h * ctx + p] = _mm512_reduce_add_ps(a) * scale;
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    float* sc = scores.data() + h * ctx;
    float mx = sc[0];
    for (int64_t p = 1; p < ctx; ++p) mx = std::max(mx, sc[p]);
    const __m512 mv = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 16 <= ctx; p += 16) {
      const __m512 e = internal::exp512(_mm512_sub_ps(_mm512_loadu_ps(sc + p), mv));
      _mm512_storeu_ps(sc + p, e);
      sum = _mm512_add_ps(sum, e);
    }
    float total = _mm512_reduce_add_ps(sum);
    for (; p < ctx; ++p) total += (sc[p] = std::exp(sc[p] - mx));
    const float inv = 1.0f / total;
    for (p = 0; p < ctx; ++p) sc[p] *= inv;
  }
  acc.assign(static_cast<size_t>(group * hd), 0.f);
  for (int64_t p = 0; p < ctx; ++p) {
    load_row(kv.v, kv, table, p, ctx, g, kf);
    for (int64_t h = 0; h < group; ++h) {
      const __m512 sv = _mm512_set1_ps(scores[h * ctx + p]);
      float* a = acc.data() + h * hd;
      for (int64_t c = 0; c < nc; ++c) {
        _mm512_storeu_ps(a + 16 * c, _mm512_fmadd_ps(sv, kf[c], _mm512_loadu_ps(a + 16 * c)));
      }
    }
  }
  std::copy(acc.begin(), acc.end(), out);
}

}  // namespace
#endif

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
      const float* qg = q + (t * heads + g * group) * hd;
#if defined(MSINFER_HAVE_AVX512)
      if (hd % 16 == 0 && hd <= 256) {
        attend_group_avx512(qg, group, ctx, kv, table, g, scale, scores, acc,
                            out + (t * heads + g * group) * hd);
        continue;
      }
#endif
      scores.assign(static_cast<size_t>(group * ctx), 0.f);
      // Pass 1: scores for every head of the group, reading each K row once.
      for (int64_t p = 0; p < ctx; ++p) {
        const bf16* kr = kv.k + kv.offset(table, p, g);
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
        const bf16* vr = kv.v + kv.offset(table, p, g);
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
        const bf16* kr = kv.k + kv.offset(block_tables[t], p, g);
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
          acc += s[p] / sum * bf16_to_float(kv.v[kv.offset(block_tables[t], p, g) + i]);
        }
        out[(t * heads + h) * hd + i] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace msinfer::kernels::cpu
