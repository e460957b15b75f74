#include "msinfer/kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "internal/level.h"
#include "msinfer/kernels/cpu/ops.h"

namespace msinfer::kernels::cpu {
namespace {

void init(RoutedBatch* out, int64_t tokens, int64_t experts, int64_t top_k, int64_t destinations,
          int64_t hidden) {
  out->tokens = tokens;
  out->top_k = top_k;
  out->experts = experts;
  out->destinations = destinations;
  out->hidden = hidden;
  out->topk_expert.assign(tokens * top_k, 0);
  out->topk_weight.assign(tokens * top_k, 0.f);
  out->expert_offset.assign(experts + 1, 0);
  out->expert_count.assign(experts, 0);
  out->dest_offset.assign(destinations + 1, 0);
  out->row_token.assign(tokens * top_k, 0);
  out->slot_row.assign(tokens * top_k, 0);
  out->send.resize(static_cast<size_t>(tokens * top_k * hidden));
}

// Expert order in the send buffer: by destination, then by expert id.
std::vector<int32_t> expert_order(int64_t experts, const int32_t* dest, int64_t destinations) {
  std::vector<int32_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  if (dest != nullptr) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return dest[a] < dest[b]; });
  }
  return order;
}

}  // namespace

void fused_gate(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                bool normalize, const int32_t* expert_dest, int64_t destinations, const float* x,
                int64_t hidden, RoutedBatch* out) {
  if (expert_dest == nullptr) destinations = experts;
  init(out, tokens, experts, top_k, destinations, hidden);
  std::vector<float> p(experts);
  // Top-K by partial selection on the softmax (monotone in the logits, so
  // only the K chosen probabilities need the full softmax denominator).
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    float mx = l[0];
    for (int64_t e = 1; e < experts; ++e) mx = std::max(mx, l[e]);
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(l[e] - mx));
    int32_t* ids = out->topk_expert.data() + t * top_k;
    float* w = out->topk_weight.data() + t * top_k;
    for (int64_t k = 0; k < top_k; ++k) {
      int32_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t j = 0; j < k; ++j) taken |= ids[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
      }
      ids[k] = best;
      w[k] = static_cast<float>(p[best] / sum);
    }
    if (normalize) {
      float s = 0;
      for (int64_t k = 0; k < top_k; ++k) s += w[k];
      for (int64_t k = 0; k < top_k; ++k) w[k] /= s;
    }
  }
  route_rows(tokens, experts, top_k, expert_dest, destinations, x, hidden, out);
}

void topk_softmax(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                  int32_t* expert, float* weight) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    int32_t* ids = expert + t * top_k;
    float* w = weight + t * top_k;
    for (int64_t k = 0; k < top_k; ++k) {
      int32_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t j = 0; j < k; ++j) taken |= ids[j] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = static_cast<int32_t>(e);
      }
      ids[k] = best;
    }
    const float mx = l[ids[0]];
    float sum = 0;
    for (int64_t k = 0; k < top_k; ++k) sum += (w[k] = std::exp(l[ids[k]] - mx));
    const float inv = 1.0f / sum;
    for (int64_t k = 0; k < top_k; ++k) w[k] *= inv;
  }
}

void route_rows(int64_t tokens, int64_t experts, int64_t top_k, const int32_t* expert_dest,
                int64_t destinations, const float* x, int64_t hidden, RoutedBatch* out) {
  if (expert_dest == nullptr) destinations = experts;
  out->tokens = tokens;
  out->top_k = top_k;
  out->experts = experts;
  out->destinations = destinations;
  out->hidden = hidden;
  out->expert_offset.assign(experts + 1, 0);
  out->dest_offset.assign(destinations + 1, 0);
  out->row_token.assign(tokens * top_k, 0);
  out->slot_row.assign(tokens * top_k, 0);
  out->send.resize(static_cast<size_t>(tokens * top_k * hidden));
  std::vector<int32_t> count(experts, 0);
  for (int64_t i = 0; i < tokens * top_k; ++i) ++count[out->topk_expert[i]];
  // Offsets: destinations in order, experts by id inside each.
  const std::vector<int32_t> order = expert_order(experts, expert_dest, destinations);
  int32_t row = 0;
  size_t oi = 0;
  for (int64_t d = 0; d < destinations; ++d) {
    out->dest_offset[d] = row;
    while (oi < order.size() && (expert_dest ? expert_dest[order[oi]] : order[oi]) == d) {
      out->expert_offset[order[oi]] = row;
      row += count[order[oi]];
      ++oi;
    }
  }
  out->dest_offset[destinations] = row;
  out->expert_offset[experts] = row;
  out->expert_count = count;
  // Scatter, in token order (so rows of one expert stay in token order).
  std::vector<int32_t> next(experts);
  for (int64_t e = 0; e < experts; ++e) next[e] = out->expert_offset[e];
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = out->topk_expert[t * top_k + k];
      const int32_t r = next[e]++;
      out->row_token[r] = static_cast<int32_t>(t);
      out->slot_row[t * top_k + k] = r;
      std::memcpy(out->send.data() + static_cast<int64_t>(r) * hidden, x + t * hidden,
                  sizeof(float) * hidden);
    }
  }
}

void gate_reference(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                    bool normalize, const int32_t* expert_dest, int64_t destinations,
                    const float* x, int64_t hidden, RoutedBatch* out) {
  if (expert_dest == nullptr) destinations = experts;
  init(out, tokens, experts, top_k, destinations, hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> p(logits + t * experts, logits + (t + 1) * experts);
    softmax_inplace(p.data(), experts);
    std::vector<int32_t> idx(experts);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    float s = 0;
    for (int64_t k = 0; k < top_k; ++k) s += p[idx[k]];
    for (int64_t k = 0; k < top_k; ++k) {
      out->topk_expert[t * top_k + k] = idx[k];
      out->topk_weight[t * top_k + k] = normalize ? p[idx[k]] / s : p[idx[k]];
    }
  }
  // Rows: (destination, expert, token) sorted.
  struct Row {
    int32_t dest, expert, token, k;
  };
  std::vector<Row> rows;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      int32_t e = out->topk_expert[t * top_k + k];
      rows.push_back({expert_dest ? expert_dest[e] : e, e, static_cast<int32_t>(t),
                      static_cast<int32_t>(k)});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.dest, a.expert, a.token) < std::tie(b.dest, b.expert, b.token);
  });
  // Offsets by counting: rows that sort before (dest(e), e), and before destination d.
  for (int64_t e = 0; e < experts; ++e) {
    const int32_t d = expert_dest ? expert_dest[e] : static_cast<int32_t>(e);
    int32_t before = 0;
    for (const Row& x : rows) {
      before += (x.dest < d || (x.dest == d && x.expert < e)) ? 1 : 0;
      out->expert_count[e] += x.expert == e ? 1 : 0;
    }
    out->expert_offset[e] = before;
  }
  out->expert_offset[experts] = static_cast<int32_t>(rows.size());
  for (int64_t d = 0; d <= destinations; ++d) {
    int32_t before = 0;
    for (const Row& x : rows) before += x.dest < d ? 1 : 0;
    out->dest_offset[d] = before;
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    out->row_token[r] = rows[r].token;
    out->slot_row[rows[r].token * top_k + rows[r].k] = static_cast<int32_t>(r);
    std::memcpy(out->send.data() + r * hidden, x + rows[r].token * hidden, sizeof(float) * hidden);
  }
}

void moe_combine(const RoutedBatch& r, const float* results, float* out) {
  internal::active_kernels().combine(r.topk_weight.data(), r.slot_row.data(), r.tokens, r.top_k,
                                     r.hidden, results, out);
}

void expert_ffn(const PackedLinear& w13, const PackedLinear& w2, const float* x, int64_t rows,
                float* y) {
  if (rows <= 0) return;
  const int64_t f = w2.k();
  thread_local std::vector<float> gate_up, act;
  gate_up.resize(static_cast<size_t>(rows * 2 * f));
  act.resize(static_cast<size_t>(rows * f));
  w13.forward(x, rows, gate_up.data());
  silu_mul(gate_up.data(), rows, f, act.data());
  w2.forward(act.data(), rows, y);
}

void clamped_swiglu(const float* gate_up, int64_t rows, int64_t f, ClampedSwiglu act, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * f;
    const float* u = g + f;
    float* o = out + r * f;
    for (int64_t j = 0; j < f; ++j) {
      const float gj = std::min(g[j], act.limit);
      const float uj = std::clamp(u[j], -act.limit, act.limit);
      o[j] = gj / (1.0f + std::exp(-act.alpha * gj)) * (uj + 1.0f);
    }
  }
}

void expert_ffn_clamped(const PackedLinear& w13, const float* b13, const PackedLinear& w2,
                        const float* b2, ClampedSwiglu act, const float* x, int64_t rows,
                        float* y) {
  if (rows <= 0) return;
  const int64_t f = w2.k(), h = w2.n();
  thread_local std::vector<float> gate_up, a;
  gate_up.resize(static_cast<size_t>(rows * 2 * f));
  a.resize(static_cast<size_t>(rows * f));
  w13.forward(x, rows, gate_up.data());
  for (int64_t r = 0; r < rows; ++r) add_inplace(gate_up.data() + r * 2 * f, b13, 2 * f);
  clamped_swiglu(gate_up.data(), rows, f, act, a.data());
  w2.forward(a.data(), rows, y);
  if (b2 != nullptr) {
    for (int64_t r = 0; r < rows; ++r) add_inplace(y + r * h, b2, h);
  }
}

void expert_ffn_reference(const bf16* w1, const bf16* w3, const bf16* w2, int64_t f, int64_t h,
                          const float* x, int64_t rows, float* y) {
  std::vector<float> g(rows * f), u(rows * f), gu(rows * 2 * f), a(rows * f);
  linear_reference(w1, f, h, x, rows, g.data());
  linear_reference(w3, f, h, x, rows, u.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const double gv = g[r * f + j];
      a[r * f + j] = static_cast<float>(gv / (1.0 + std::exp(-gv)) * u[r * f + j]);
    }
  }
  linear_reference(w2, h, f, a.data(), rows, y);
}

}  // namespace msinfer::kernels::cpu
