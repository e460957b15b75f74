// The absorbed MLA kernels against the naive form DeepSeek's reference also
// has (attn_impl "naive"): per-head keys [W_UK c_p ; k_pe_p] and values W_UV c_p
// expanded from the same bf16 cache rows, plain softmax attention in double.
// Paged blocks out of order, several requests, prefill chunks and decode rows.
#include "msinfer/kernels/cpu/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace msinfer::kernels::cpu {
namespace {

TEST(MlaAttentionTest, AbsorbedEqualsNaiveOverPagedBlocks) {
  const int64_t H = 3, nope = 8, rope = 4, R = 16, V = 6, bs = 4, blocks = 12;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<bf16> w_uk(H * nope * R), w_uv(H * V * R);
  for (auto& x : w_uk) x = float_to_bf16(nd(rng) * 0.3f);
  for (auto& x : w_uv) x = float_to_bf16(nd(rng) * 0.3f);
  std::vector<bf16> pool(blocks * bs * (R + rope));
  PagedKvLayer kv{pool.data(), nullptr, bs, 1, R + rope};
  // Two requests: 11 positions (blocks 5, 2, 9) and 6 (blocks 0, 7).
  const std::vector<int32_t> t0 = {5, 2, 9}, t1 = {0, 7};
  const std::vector<std::pair<const int32_t*, int32_t>> rows = {
      {t0.data(), 0},  {t0.data(), 1}, {t0.data(), 2}, {t0.data(), 3}, {t0.data(), 4},
      {t0.data(), 5},  {t0.data(), 6}, {t0.data(), 7}, {t0.data(), 8}, {t0.data(), 9},
      {t0.data(), 10}, {t1.data(), 0}, {t1.data(), 1}, {t1.data(), 2}, {t1.data(), 3},
      {t1.data(), 4},  {t1.data(), 5}};
  const int64_t T = static_cast<int64_t>(rows.size());
  std::vector<int32_t> pos(T);
  std::vector<const int32_t*> tables(T);
  std::vector<float> latent(T * (R + rope)), q_nope(T * H * nope), q_pe(T * H * rope);
  for (int64_t t = 0; t < T; ++t) {
    tables[t] = rows[t].first;
    pos[t] = rows[t].second;
  }
  for (auto& x : latent) x = nd(rng);
  for (auto& x : q_nope) x = nd(rng);
  for (auto& x : q_pe) x = nd(rng);
  mla_write_latent(kv, latent.data(), T, pos.data(), tables.data());
  const float scale = 0.3f;
  std::vector<float> q_lat(T * H * R), out_lat(T * H * R), out(T * H * V);
  mla_absorb_query(q_nope.data(), T, H, nope, R, w_uk.data(), q_lat.data());
  mla_attention(q_lat.data(), q_pe.data(), T, H, R, rope, kv, pos.data(), tables.data(), scale,
                out_lat.data());
  mla_value_up(out_lat.data(), T, H, R, V, w_uv.data(), out.data());

  double max_err = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = pos[t] + 1;
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(n), v(n * V);
      for (int64_t j = 0; j < n; ++j) {
        const bf16* row = kv.k + kv.offset(tables[t], j, 0);
        double acc = 0;
        for (int64_t d = 0; d < nope; ++d) {
          double k = 0;  // key d of head h: W_UK[h, d, :] . c_j
          for (int64_t c = 0; c < R; ++c) {
            k += double(bf16_to_float(w_uk[(h * nope + d) * R + c])) * bf16_to_float(row[c]);
          }
          acc += double(q_nope[(t * H + h) * nope + d]) * k;
        }
        for (int64_t r = 0; r < rope; ++r) {
          acc += double(q_pe[(t * H + h) * rope + r]) * bf16_to_float(row[R + r]);
        }
        s[j] = acc * scale;
        for (int64_t e = 0; e < V; ++e) {
          double val = 0;
          for (int64_t c = 0; c < R; ++c) {
            val += double(bf16_to_float(w_uv[(h * V + e) * R + c])) * bf16_to_float(row[c]);
          }
          v[j * V + e] = val;
        }
      }
      double mx = -1e300, sum = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t e = 0; e < V; ++e) {
        double want = 0;
        for (int64_t j = 0; j < n; ++j) want += s[j] / sum * v[j * V + e];
        max_err = std::max(max_err, std::fabs(want - out[t * H * V + h * V + e]));
      }
    }
  }
  EXPECT_LT(max_err, 1e-4);
  // The cache holds the rows rounded to bf16.
  EXPECT_EQ(bf16_to_float(kv.k[kv.offset(t1.data(), 5, 0) + 3]),
            round_to_bf16(latent[16 * (R + rope) + 3]));
}

}  // namespace
}  // namespace msinfer::kernels::cpu
