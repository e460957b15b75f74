// gpt-oss's CPU kernels (plain C++, the same at every level): attention with
// a sliding window and sinks against its double reference and by hand, the
// clamped SwiGLU expert against the formula, the rotate_half rotation with
// YaRN's frequencies against ops.h's plain RoPE and the reference's formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "msinfer/kernels/cpu/moe.h"
#include "msinfer/kernels/cpu/ops.h"
#include "msinfer/kernels/cpu/window_attention.h"
#include "msinfer/kernels/cpu/yarn_rope.h"
#include "test_util.h"

namespace msinfer::kernels::cpu {
namespace {

using testing::randn;
using testing::rel_err;

// Two requests with scattered blocks: a prefill chunk of one (positions 0..9)
// and a decode token of the other (position 13), GQA group 3, windows of 0
// (all), 1, 3, 5 and 16 (more than any context), with and without sinks.
TEST(WindowAttentionTest, MatchesReferenceForPrefillAndDecode) {
  for (int64_t hd : {5, 16, 64}) {
    for (int64_t window : {0, 1, 3, 5, 16}) {
      for (bool with_sinks : {false, true}) {
        const int64_t kvh = 2, heads = 6, bs = 4, blocks = 12;
        std::vector<bf16> kpool(blocks * bs * kvh * hd), vpool(kpool.size());
        PagedKvLayer kv{kpool.data(), vpool.data(), bs, kvh, hd};
        std::vector<int32_t> table_a = {7, 2, 9}, table_b = {0, 11, 4, 5};
        std::vector<int32_t> pos;
        std::vector<const int32_t*> tables;
        for (int p = 0; p < 10; ++p) {
          pos.push_back(p);
          tables.push_back(table_a.data());
        }
        auto cache_k = randn(13 * kvh * hd, 77), cache_v = randn(13 * kvh * hd, 78);
        std::vector<int32_t> cpos(13);
        std::iota(cpos.begin(), cpos.end(), 0);
        std::vector<const int32_t*> ctab(13, table_b.data());
        write_kv(kv, cache_k.data(), cache_v.data(), 13, cpos.data(), ctab.data());
        pos.push_back(13);
        tables.push_back(table_b.data());
        const int64_t T = static_cast<int64_t>(pos.size());
        auto k = randn(T * kvh * hd, 1 + hd), v = randn(T * kvh * hd, 2 + hd);
        write_kv(kv, k.data(), v.data(), T, pos.data(), tables.data());
        auto q = randn(T * heads * hd, 3 + hd);
        auto sinks = randn(heads, 4);
        const float* s = with_sinks ? sinks.data() : nullptr;
        std::vector<float> out(q.size()), ref(q.size()), full(q.size());
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        paged_attention_window(q.data(), T, heads, kv, pos.data(), tables.data(), scale, window, s,
                               out.data());
        paged_attention_window_reference(q.data(), T, heads, kv, pos.data(), tables.data(), scale,
                                         window, s, ref.data());
        EXPECT_LT(rel_err(out, ref), 1e-5) << hd << " " << window << " " << with_sinks;
        if (!with_sinks && (window == 0 || window == 16)) {  // the plain kernel's result
          paged_attention_reference(q.data(), T, heads, kv, pos.data(), tables.data(), scale,
                                    full.data());
          EXPECT_LT(rel_err(out, full), 1e-5) << hd << " " << window;
        }
        if (window == 1) {  // only itself: its V row, times 1 / (1 + e^(sink - s))
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t g = h / 3, t = 4;
            double f = 1;
            if (with_sinks) {
              double dot = 0;
              for (int64_t i = 0; i < hd; ++i) {
                dot += double(q[(t * heads + h) * hd + i]) *
                       bf16_to_float(float_to_bf16(k[(t * kvh + g) * hd + i]));
              }
              f = 1.0 / (1.0 + std::exp(sinks[h] - dot * scale));
            }
            for (int64_t i = 0; i < hd; ++i) {
              EXPECT_NEAR(out[(t * heads + h) * hd + i],
                          f * bf16_to_float(float_to_bf16(v[(t * kvh + g) * hd + i])), 1e-5);
            }
          }
        }
      }
    }
  }
}

TEST(ClampedSwigluTest, ExpertMatchesTheFormula) {
  const int64_t h = 40, f = 24, rows = 7;
  auto w13 = randn(2 * f * h, 1), w2 = randn(h * f, 2), x = randn(rows * h, 3);
  auto b13 = randn(2 * f, 4), b2 = randn(h, 5);
  for (float& v : x) v *= 3;  // gate and up values beyond the limit on both sides
  std::vector<bf16> w13b(w13.size()), w2b(w2.size());
  for (size_t i = 0; i < w13.size(); ++i) w13b[i] = float_to_bf16(w13[i]);
  for (size_t i = 0; i < w2.size(); ++i) w2b[i] = float_to_bf16(w2[i]);
  auto p13 = PackedLinear::pack(w13b.data(), 2 * f, h);
  auto p2 = PackedLinear::pack(w2b.data(), h, f);
  ASSERT_TRUE(p13.ok() && p2.ok());
  const ClampedSwiglu act{1.702f, 2.5f};
  for (bool down_bias : {true, false}) {
    std::vector<float> y(rows * h);
    expert_ffn_clamped(*p13, b13.data(), *p2, down_bias ? b2.data() : nullptr, act, x.data(), rows,
                       y.data());
    int clamped = 0;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> a(f);
      for (int64_t j = 0; j < f; ++j) {
        double g = b13[j], u = b13[f + j];
        for (int64_t c = 0; c < h; ++c) {
          const double xc = bf16_to_float(float_to_bf16(x[r * h + c]));
          g += xc * bf16_to_float(w13b[j * h + c]);
          u += xc * bf16_to_float(w13b[(f + j) * h + c]);
        }
        clamped += (g > 2.5) + (std::fabs(u) > 2.5);
        g = std::min(g, 2.5);
        u = std::clamp(u, -2.5, 2.5);
        a[j] = g / (1 + std::exp(-1.702 * g)) * (u + 1);
      }
      for (int64_t c = 0; c < h; ++c) {
        double yc = down_bias ? b2[c] : 0;
        for (int64_t j = 0; j < f; ++j) {
          yc += bf16_to_float(float_to_bf16(static_cast<float>(a[j]))) *
                bf16_to_float(w2b[c * f + j]);
        }
        EXPECT_NEAR(y[r * h + c], yc, 1e-3 * (1 + std::fabs(yc))) << r << " " << c;
      }
    }
    EXPECT_GT(clamped, 20);  // the clamps were exercised
  }
}

TEST(RopeRotateHalfTest, PlainFrequenciesGiveOpsRope) {
  const int64_t T = 5, H = 3, d = 64;
  auto x = randn(T * H * d, 9);
  std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
  auto a = x, b = x;
  const auto inv = yarn_inv_freq(d, 150000, 0, 0, 32, 1);
  rope_rotate_half(a.data(), pos.data(), T, H, d, inv.data());
  rope(b.data(), pos.data(), T, H, d, 150000);
  // ops.h's rope takes its angles in double, these in float32 (as torch): at
  // position 4095 the float32 angle is off by up to 2^-12 radians.
  EXPECT_LT(rel_err(a, b), 1e-4);
}

// The reference's _compute_concentration_and_inv_freq (gpt_oss/torch/model.py)
// in double: YaRN by parts with the unrounded correction range.
TEST(RopeRotateHalfTest, UntruncatedYarnFrequencies) {
  const int64_t d = 64;
  const double base = 150000, factor = 32, ctx = 4096, alpha = 1, beta = 32;
  const auto inv = yarn_inv_freq(d, base, factor, 4096, beta, alpha, /*truncate=*/false);
  const double half = d / 2.0;
  const double low = half * std::log(ctx / (beta * 2 * M_PI)) / std::log(base);
  const double high = half * std::log(ctx / (alpha * 2 * M_PI)) / std::log(base);
  ASSERT_TRUE(0 < low && low < high && high < half - 1);
  EXPECT_NE(low, std::floor(low));  // the rounded range would differ
  for (int64_t i = 0; i < d / 2; ++i) {
    const double freq = std::pow(base, 2.0 * i / d);
    const double mask = 1 - std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = 1 / (factor * freq) * (1 - mask) + 1 / freq * mask;
    EXPECT_NEAR(inv[i], want, 2e-6 * want) << i;
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu

namespace msinfer::kernels::cpu {
namespace {

// The reference's gate (top-K of the logits, softmax over them) equals
// fused_gate's renormalised softmax up to rounding, picks by logit, breaks
// ties to the lower id, and weights in descending order.
TEST(TopkSoftmaxTest, SoftmaxOverTheTopKLogits) {
  const int64_t T = 9, E = 7, K = 3;
  auto l = randn(T * E, 11);
  l[2 * E + 1] = l[2 * E + 4] = 5.0f;  // a tie in token 2
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  topk_softmax(l.data(), T, E, K, ids.data(), w.data());
  RoutedBatch rb;
  rb.topk_expert.resize(T * K);
  rb.topk_weight.resize(T * K);
  std::vector<float> x(T * 4, 1.0f);
  fused_gate(l.data(), T, E, K, /*normalize=*/true, nullptr, 0, x.data(), 4, &rb);
  EXPECT_EQ(ids, rb.topk_expert);
  for (int64_t i = 0; i < T * K; ++i) EXPECT_NEAR(w[i], rb.topk_weight[i], 1e-6) << i;
  EXPECT_EQ(ids[2 * K], 1);
  EXPECT_EQ(ids[2 * K + 1], 4);
  EXPECT_FLOAT_EQ(w[2 * K], w[2 * K + 1]);
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0, denom = 0;
    for (int64_t k = 0; k < K; ++k) denom += std::exp(double(l[t * E + ids[t * K + k]]));
    for (int64_t k = 0; k < K; ++k) {
      sum += w[t * K + k];
      EXPECT_NEAR(w[t * K + k], std::exp(double(l[t * E + ids[t * K + k]])) / denom, 1e-6);
      if (k > 0) {
        EXPECT_GE(w[t * K + k - 1], w[t * K + k]);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu
