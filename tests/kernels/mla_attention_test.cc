// The absorbed MLA kernels against the naive form DeepSeek's reference also
// has (attn_impl "naive"): per-head keys [W_UK c_p ; k_pe_p] and values W_UV c_p
// expanded from the same bf16 cache rows, plain softmax attention in double.
// Paged blocks out of order, several requests, prefill chunks and decode rows.
#include "msinfer/kernels/cpu/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/threads.h"
#include "test_util.h"

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

// One shape of the level comparison: heads, kv_lora, rope, paged block size,
// and the requests' context lengths (each request's tokens: a prefill chunk of
// `chunk` tokens ending at its last position, so several positions per request).
struct MlaShape {
  int64_t heads, kv_lora, rope, block_size;
  std::vector<int32_t> contexts;
  int32_t chunk;
  float growth;  // row p scaled by 1 + growth * p: the maximum score moves block by block
};

// Every level this CPU runs (capped by MSINFER_ISA) against the plain
// reference, on shapes with tails at every vector width (kv_lora and rope not
// multiples of 8 or 16), histories that cross the kernel's 16-position blocks
// and the paged blocks (out of order in the pool), and several tokens with
// different positions in one call. Levels sum in another order and use a
// vector exp: 1e-5 relative to the largest output (measured 2e-7 .. 2e-6).
TEST(MlaAttentionTest, EveryLevelMatchesTheReferenceOnOddShapes) {
  const std::vector<MlaShape> shapes = {
      {3, 40, 10, 4, {1, 2, 17, 33, 70}, 3, 0.f},   // the exactness test's odd checkpoint
      {5, 72, 8, 16, {16, 31, 48, 129}, 5, 0.05f},  // rope 8, kv_lora 72 (4.5 vectors)
      {4, 17, 6, 5, {1, 23}, 23, 0.1f},             // a whole prefill of 23 tokens
      {8, 256, 32, 128, {300, 1}, 2, 0.01f},        // small-deepseek's shape
      {16, 512, 64, 16, {1, 40, 200}, 2, 0.f},      // DeepSeek-V3's row, fewer heads
      {40, 512, 64, 128, {1, 150}, 2, 0.02f},       // enough heads for blocks of 64 positions
  };
  const IsaLevel saved = active_isa();
  std::vector<IsaLevel> levels;
  for (IsaLevel l : all_isa_levels()) {
    if (isa_supported(l)) levels.push_back(l);
  }
  uint64_t seed = 11;
  for (const MlaShape& sh : shapes) {
    const int64_t H = sh.heads, R = sh.kv_lora, rope = sh.rope, d = R + rope, bs = sh.block_size;
    // Each request's blocks, taken from the pool in a shuffled order.
    std::vector<std::vector<int32_t>> tables;
    int32_t blocks = 0;
    for (int32_t n : sh.contexts) {
      tables.emplace_back((n + bs - 1) / bs);
      for (int32_t& b : tables.back()) b = blocks++;
    }
    std::vector<int32_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
    for (auto& t : tables) {
      for (int32_t& b : t) b = order[b];
    }
    std::vector<bf16> pool(static_cast<size_t>(blocks * bs * d));
    PagedKvLayer kv{pool.data(), nullptr, bs, 1, d};
    std::vector<int32_t> pos;
    std::vector<const int32_t*> tab;
    for (size_t r = 0; r < sh.contexts.size(); ++r) {
      const int32_t n = sh.contexts[r];
      const std::vector<float> rows = testing::randn(static_cast<size_t>(n * d), ++seed);
      for (int32_t p = 0; p < n; ++p) {
        std::vector<float> row(rows.begin() + p * d, rows.begin() + (p + 1) * d);
        for (float& x : row) x *= 1.f + sh.growth * static_cast<float>(p);
        const int32_t* t = tables[r].data();
        mla_write_latent(kv, row.data(), 1, &p, &t);
      }
      for (int32_t p = std::max(0, n - sh.chunk); p < n; ++p) {
        pos.push_back(p);
        tab.push_back(tables[r].data());
      }
    }
    const int64_t T = static_cast<int64_t>(pos.size());
    const std::vector<float> q_lat = testing::randn(static_cast<size_t>(T * H * R), ++seed);
    const std::vector<float> q_pe = testing::randn(static_cast<size_t>(T * H * rope), ++seed);
    const float scale = 1.5f / std::sqrt(static_cast<float>(d));
    std::vector<float> want(static_cast<size_t>(T * H * R));
    mla_attention_reference(q_lat.data(), q_pe.data(), T, H, R, rope, kv, pos.data(), tab.data(),
                            scale, want.data());
    for (IsaLevel level : levels) {
      ASSERT_TRUE(force_isa(level).ok());
      std::vector<float> got(want.size(), NAN);
      mla_attention(q_lat.data(), q_pe.data(), T, H, R, rope, kv, pos.data(), tab.data(), scale,
                    got.data());
      const double err = testing::rel_err(got, want);
      EXPECT_LT(err, 1e-5) << isa_name(level) << " heads " << H << " kv_lora " << R << " rope "
                           << rope << " block " << bs;
      std::printf("[ mla ] %s heads %lld kv_lora %lld rope %lld block %lld tokens %lld: %.2g\n",
                  isa_name(level), static_cast<long long>(H), static_cast<long long>(R),
                  static_cast<long long>(rope), static_cast<long long>(bs),
                  static_cast<long long>(T), err);
    }
  }
  ASSERT_TRUE(force_isa(saved).ok());
}

// The two products around the attention at every level against their plain
// references: kv_lora and head sizes with tails at every vector width, token
// counts not multiples of the kernels' tiles of 4.
TEST(MlaAttentionTest, AbsorbAndValueUpMatchTheReferenceAtEveryLevel) {
  struct Shape {
    int64_t heads, nope, kv_lora, v, tokens;
  };
  const std::vector<Shape> shapes = {
      {3, 24, 40, 20, 5}, {5, 17, 72, 13, 9}, {8, 64, 256, 64, 1}, {2, 128, 512, 128, 6}};
  const IsaLevel saved = active_isa();
  uint64_t seed = 101;
  for (const Shape& sh : shapes) {
    const int64_t H = sh.heads, T = sh.tokens, R = sh.kv_lora;
    const std::vector<bf16> w_uk = testing::randn_bf16(H * sh.nope * R, ++seed, 0.2f);
    const std::vector<bf16> w_uv = testing::randn_bf16(H * sh.v * R, ++seed, 0.2f);
    const std::vector<float> q = testing::randn(T * H * sh.nope, ++seed);
    const std::vector<float> lat = testing::randn(T * H * R, ++seed);
    std::vector<float> want_q(T * H * R), want_o(T * H * sh.v);
    mla_absorb_query_reference(q.data(), T, H, sh.nope, R, w_uk.data(), want_q.data());
    mla_value_up_reference(lat.data(), T, H, R, sh.v, w_uv.data(), want_o.data());
    for (IsaLevel level : all_isa_levels()) {
      if (!isa_supported(level)) continue;
      ASSERT_TRUE(force_isa(level).ok());
      std::vector<float> got_q(want_q.size(), NAN), got_o(want_o.size(), NAN);
      mla_absorb_query(q.data(), T, H, sh.nope, R, w_uk.data(), got_q.data());
      mla_value_up(lat.data(), T, H, R, sh.v, w_uv.data(), got_o.data());
      EXPECT_LT(testing::rel_err(got_q, want_q), 1e-5) << isa_name(level) << " kv_lora " << R;
      EXPECT_LT(testing::rel_err(got_o, want_o), 1e-5) << isa_name(level) << " kv_lora " << R;
    }
  }
  ASSERT_TRUE(force_isa(saved).ok());
}

// One decode token on more threads than tokens: the heads are split between
// the threads (ranges of >= 4 heads); the result is the same as on one.
TEST(MlaAttentionTest, HeadsSplitBetweenThreadsGiveTheSameResult) {
  const int64_t H = 13, R = 48, rope = 8, d = R + rope, bs = 16, n = 50;
  std::vector<int32_t> table = {3, 0, 2, 1};
  std::vector<bf16> pool(static_cast<size_t>(4 * bs * d));
  PagedKvLayer kv{pool.data(), nullptr, bs, 1, d};
  const std::vector<float> rows = testing::randn(static_cast<size_t>(n * d), 5);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<const int32_t*> tab(n, table.data());
  mla_write_latent(kv, rows.data(), n, pos.data(), tab.data());
  const std::vector<float> q_lat = testing::randn(H * R, 6), q_pe = testing::randn(H * rope, 7);
  const int32_t last = n - 1;
  const int32_t* t0 = table.data();
  std::vector<float> want(H * R), one(H * R), three(H * R);
  mla_attention_reference(q_lat.data(), q_pe.data(), 1, H, R, rope, kv, &last, &t0, 0.2f,
                          want.data());
  set_compute_threads(1);
  enter_compute_thread();
  mla_attention(q_lat.data(), q_pe.data(), 1, H, R, rope, kv, &last, &t0, 0.2f, one.data());
  set_compute_threads(3);
  enter_compute_thread();
  mla_attention(q_lat.data(), q_pe.data(), 1, H, R, rope, kv, &last, &t0, 0.2f, three.data());
  set_compute_threads(0);
  enter_compute_thread();
  EXPECT_EQ(one, three);  // each head's sums run in the same order on any thread
  // An empty micro-batch touches nothing.
  mla_attention(nullptr, nullptr, 0, H, R, rope, kv, nullptr, nullptr, 0.2f, nullptr);
  EXPECT_LT(testing::rel_err(one, want), 1e-5);
}

}  // namespace
}  // namespace msinfer::kernels::cpu
