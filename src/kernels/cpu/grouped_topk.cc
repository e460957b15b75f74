#include "msinfer/kernels/cpu/grouped_topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace msinfer::kernels::cpu {

void grouped_topk(const float* logits, int64_t tokens, const GroupedTopK& p, int32_t* topk_expert,
                  float* topk_weight) {
  const int64_t E = p.experts, K = p.top_k, G = std::max<int64_t>(p.n_group, 1);
  const int64_t per_group = E / G;
  std::vector<float> s(E), c(E), group_score(G);
  std::vector<int32_t> order(std::max(E, G));
  std::vector<char> keep(G);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    if (p.sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      const float m = *std::max_element(l, l + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - m));
      for (int64_t e = 0; e < E; ++e) s[e] /= sum;
    }
    for (int64_t e = 0; e < E; ++e) c[e] = p.bias != nullptr ? s[e] + p.bias[e] : s[e];
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        const float* cg = c.data() + g * per_group;
        float best = neg_inf, second = neg_inf;
        for (int64_t i = 0; i < per_group; ++i) {
          if (cg[i] > best) {
            second = best;
            best = cg[i];
          } else if (cg[i] > second) {
            second = cg[i];
          }
        }
        group_score[g] = p.group_by_top2 ? best + second : best;
      }
      std::iota(order.begin(), order.begin() + G, 0);
      std::stable_sort(order.begin(), order.begin() + G,
                       [&](int32_t a, int32_t b) { return group_score[a] > group_score[b]; });
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t i = 0; i < p.topk_group; ++i) keep[order[i]] = 1;
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[e / per_group]) c[e] = neg_inf;
      }
    }
    std::iota(order.begin(), order.begin() + E, 0);
    std::partial_sort(order.begin(), order.begin() + K, order.begin() + E,
                      [&](int32_t a, int32_t b) { return c[a] > c[b] || (c[a] == c[b] && a < b); });
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += s[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      topk_expert[t * K + k] = order[k];
      const float w = p.normalize ? s[order[k]] / sum : s[order[k]];
      topk_weight[t * K + k] = w * p.scale;
    }
  }
}

}  // namespace msinfer::kernels::cpu
