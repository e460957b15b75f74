#include "msinfer/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "internal/level.h"

namespace msinfer::kernels::cpu {

void write_kv(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
              const int32_t* positions, const int32_t* const* block_tables) {
  internal::active_kernels().write_kv(kv, k, v, tokens, positions, block_tables);
}

void paged_attention(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                     const int32_t* positions, const int32_t* const* block_tables, float scale,
                     float* out) {
  internal::active_kernels().paged_attention(q, tokens, heads, kv, positions, block_tables, scale,
                                             out);
}

void paged_attention_reference(const float* q, int64_t tokens, int64_t heads,
                               const PagedKvLayer& kv, const int32_t* positions,
                               const int32_t* const* block_tables, float scale, float* out,
                               bool bf16_qk) {
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
        for (int64_t i = 0; i < hd; ++i) {
          const float qi = q[(t * heads + h) * hd + i];
          dot += (bf16_qk ? round_to_bf16(qi) : qi) * bf16_to_float(kr[i]);
        }
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

bool attention_bf16_qk(IsaLevel level, int64_t head_dim) {
  // internal/simd.inc: attend_heads takes attention_scores_dpbf16 there.
  return level >= IsaLevel::kAvx512Bf16 && head_dim % 32 == 0 && head_dim <= 128;
}

}  // namespace msinfer::kernels::cpu
