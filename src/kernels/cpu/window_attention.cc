#include "msinfer/kernels/cpu/window_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace msinfer::kernels::cpu {
namespace {

int64_t first_position(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

}  // namespace

void paged_attention_window(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                            const int32_t* positions, const int32_t* const* block_tables,
                            float scale, int64_t window, const float* sinks, float* out) {
  const int64_t hd = kv.head_dim, group = heads / kv.kv_heads, work = tokens * kv.kv_heads;
  int64_t cost = 0;  // positions read, to decide whether a team pays off
  for (int64_t t = 0; t < tokens && cost < (1 << 16); ++t) {
    cost += (positions[t] + 1 - first_position(positions[t], window)) * kv.kv_heads * hd;
  }
#pragma omp parallel if (work > 1 && cost >= (1 << 16))
  {
    std::vector<float> s, kf, acc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t wi = 0; wi < work; ++wi) {
      const int64_t t = wi / kv.kv_heads, g = wi % kv.kv_heads;
      const int64_t p1 = positions[t] + 1, p0 = first_position(positions[t], window);
      const int64_t ctx = p1 - p0;
      const int32_t* table = block_tables[t];
      const float* qg = q + (t * heads + g * group) * hd;
      s.assign(static_cast<size_t>(group * ctx), 0.f);
      kf.resize(hd);
      for (int64_t p = p0; p < p1; ++p) {
        const bf16* kr = kv.k + kv.offset(table, p, g);
        for (int64_t i = 0; i < hd; ++i) kf[i] = bf16_to_float(kr[i]);
        for (int64_t h = 0; h < group; ++h) {
          const float* qh = qg + h * hd;
          float dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kf[i];
          s[h * ctx + (p - p0)] = dot * scale;
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        float* sh = s.data() + h * ctx;
        const float sink = sinks != nullptr ? sinks[g * group + h] : -INFINITY;
        const float mx = std::max(sink, *std::max_element(sh, sh + ctx));
        float sum = sinks != nullptr ? std::exp(sink - mx) : 0.f;
        for (int64_t p = 0; p < ctx; ++p) {
          sh[p] = std::exp(sh[p] - mx);
          sum += sh[p];
        }
        const float inv = 1.0f / sum;
        for (int64_t p = 0; p < ctx; ++p) sh[p] *= inv;
      }
      acc.assign(static_cast<size_t>(group * hd), 0.f);
      for (int64_t p = p0; p < p1; ++p) {
        const bf16* vr = kv.v + kv.offset(table, p, g);
        for (int64_t i = 0; i < hd; ++i) kf[i] = bf16_to_float(vr[i]);
        for (int64_t h = 0; h < group; ++h) {
          const float w = s[h * ctx + (p - p0)];
          float* a = acc.data() + h * hd;
          for (int64_t i = 0; i < hd; ++i) a[i] += w * kf[i];
        }
      }
      std::copy(acc.begin(), acc.end(), out + (t * heads + g * group) * hd);
    }
  }
}

void paged_attention_window_reference(const float* q, int64_t tokens, int64_t heads,
                                      const PagedKvLayer& kv, const int32_t* positions,
                                      const int32_t* const* block_tables, float scale,
                                      int64_t window, const float* sinks, float* out) {
  const int64_t hd = kv.head_dim, group = heads / kv.kv_heads;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p1 = positions[t] + 1, p0 = first_position(positions[t], window);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> s;
      double mx = sinks != nullptr ? sinks[h] : -1e300;
      for (int64_t p = p0; p < p1; ++p) {
        const bf16* kr = kv.k + kv.offset(block_tables[t], p, g);
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) {
          dot += static_cast<double>(q[(t * heads + h) * hd + i]) * bf16_to_float(kr[i]);
        }
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      double sum = sinks != nullptr ? std::exp(sinks[h] - mx) : 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double a = 0;
        for (int64_t p = p0; p < p1; ++p) {
          a += s[p - p0] / sum * bf16_to_float(kv.v[kv.offset(block_tables[t], p, g) + i]);
        }
        out[(t * heads + h) * hd + i] = static_cast<float>(a);
      }
    }
  }
}

}  // namespace msinfer::kernels::cpu
