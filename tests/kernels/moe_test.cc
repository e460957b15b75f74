#include "msinfer/kernels/cpu/moe.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace msinfer::kernels::cpu {
namespace {

using testing::randn;
using testing::randn_bf16;
using testing::rel_err;

void expect_same(const RoutedBatch& a, const RoutedBatch& b) {
  EXPECT_EQ(a.topk_expert, b.topk_expert);
  for (size_t i = 0; i < a.topk_weight.size(); ++i) {
    EXPECT_NEAR(a.topk_weight[i], b.topk_weight[i], 1e-6);
  }
  EXPECT_EQ(a.expert_offset, b.expert_offset);
  EXPECT_EQ(a.expert_count, b.expert_count);
  EXPECT_EQ(a.dest_offset, b.dest_offset);
  EXPECT_EQ(a.row_token, b.row_token);
  EXPECT_EQ(a.slot_row, b.slot_row);
  EXPECT_EQ(a.send, b.send);
}

TEST(GateTest, FusedMatchesReferenceWithEmptyExpertsAndDestinations) {
  const int64_t E = 8, h = 5;
  for (int64_t T : {1, 3, 17}) {
    for (int64_t K : {1, 2, 3}) {
      for (bool norm : {true, false}) {
        auto logits = randn(T * E, 10 * T + K);
        // Make expert 6 never chosen: an empty range.
        for (int64_t t = 0; t < T; ++t) logits[t * E + 6] = -50.f;
        auto x = randn(T * h, 7);
        const int32_t dest[E] = {2, 0, 1, 0, 2, 1, 3, 0};  // 5 destinations, #4 empty
        RoutedBatch a, b;
        fused_gate(logits.data(), T, E, K, norm, dest, 5, x.data(), h, &a);
        gate_reference(logits.data(), T, E, K, norm, dest, 5, x.data(), h, &b);
        expect_same(a, b);
        EXPECT_EQ(a.expert_rows(6), 0);
        EXPECT_EQ(a.dest_offset[4], a.dest_offset[5]);
        EXPECT_EQ(a.dest_offset[5], T * K);
        // Destination 0 holds experts 1, 3, 7 in that order.
        EXPECT_EQ(a.expert_offset[1], 0);
        EXPECT_LE(a.expert_offset[3], a.expert_offset[7]);
        // Rows carry their token's hidden vector.
        for (int64_t r = 0; r < T * K; ++r) {
          for (int64_t i = 0; i < h; ++i) EXPECT_EQ(a.send[r * h + i], x[a.row_token[r] * h + i]);
        }
        if (norm) {
          for (int64_t t = 0; t < T; ++t) {
            float s = 0;
            for (int64_t k = 0; k < K; ++k) s += a.topk_weight[t * K + k];
            EXPECT_NEAR(s, 1.0f, 1e-6);
          }
        }
      }
    }
  }
  // Identity destinations (co-located: each expert its own destination).
  auto logits = randn(4 * E, 3);
  auto x = randn(4 * h, 4);
  RoutedBatch a, b;
  fused_gate(logits.data(), 4, E, 2, true, nullptr, 0, x.data(), h, &a);
  gate_reference(logits.data(), 4, E, 2, true, nullptr, 0, x.data(), h, &b);
  expect_same(a, b);
  EXPECT_EQ(a.destinations, E);
}

TEST(GateTest, CombineWeightsResultsBackIntoTokenOrder) {
  const int64_t T = 3, E = 4, K = 2, h = 2;
  auto logits = randn(T * E, 1);
  auto x = randn(T * h, 2);
  RoutedBatch r;
  fused_gate(logits.data(), T, E, K, true, nullptr, 0, x.data(), h, &r);
  // Expert "output" = row index in every element.
  std::vector<float> res(T * K * h);
  for (int64_t row = 0; row < T * K; ++row) res[row * h] = res[row * h + 1] = float(row);
  std::vector<float> out(T * h, 1.0f);
  moe_combine(r, res.data(), out.data());
  for (int64_t t = 0; t < T; ++t) {
    float want = 1.0f;
    for (int64_t k = 0; k < K; ++k) want += r.topk_weight[t * K + k] * r.slot_row[t * K + k];
    EXPECT_NEAR(out[t * h], want, 1e-6);
  }
}

TEST(ExpertFfnTest, MatchesReferenceIncludingZeroRows) {
  const int64_t h = 24, f = 40;
  auto w1 = randn_bf16(f * h, 1, 0.2f), w3 = randn_bf16(f * h, 2, 0.2f), w2 = randn_bf16(h * f, 3, 0.2f);
  std::vector<bf16> w13(w1);
  w13.insert(w13.end(), w3.begin(), w3.end());
  auto p13 = PackedLinear::pack(w13.data(), 2 * f, h);
  auto p2 = PackedLinear::pack(w2.data(), h, f);
  ASSERT_TRUE(p13.ok() && p2.ok());
  for (int64_t rows : {0, 1, 3, 33}) {
    auto x = randn(rows * h, rows + 5);
    std::vector<float> y(rows * h), ref(rows * h);
    expert_ffn(*p13, *p2, x.data(), rows, y.data());
    expert_ffn_reference(w1.data(), w3.data(), w2.data(), f, h, x.data(), rows, ref.data());
    // The activation is rounded to bf16 before the second GEMM; a different fp32
    // accumulation order can flip that rounding, so allow one bf16 ulp of effect.
    if (rows > 0) {
      EXPECT_LT(rel_err(y, ref), 1e-2) << rows;
    }
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu
