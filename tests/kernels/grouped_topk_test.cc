#include "msinfer/kernels/cpu/grouped_topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"

namespace msinfer::kernels::cpu {
namespace {

struct Picked {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Picked pick(const std::vector<float>& logits, const GroupedTopK& p) {
  const int64_t T = static_cast<int64_t>(logits.size()) / p.experts;
  Picked r{std::vector<int32_t>(T * p.top_k), std::vector<float>(T * p.top_k)};
  grouped_topk(logits.data(), T, p, r.experts.data(), r.weights.data());
  return r;
}

// DeepSeek-V3's rule (noaux_tc): the bias moves experts 4 and 5 ahead of 7,
// whose sigmoid score is the highest but whose group (and bias) drop it; the
// weights are the unbiased scores, renormalised and scaled.
TEST(GroupedTopKTest, SigmoidWithCorrectionBiasPicksGroupsByTheirTwoBest) {
  const std::vector<float> bias = {0, 0, 0, 0, 1, 1, 0, -1};
  GroupedTopK p;
  p.experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.sigmoid = true;
  p.bias = bias.data();
  p.group_by_top2 = true;
  p.normalize = true;
  p.scale = 2.5f;
  // sigmoid: .881 .119 | .731 .731 | .269 .269 | .5 .953; + bias, groups by
  // the sum of their two best: 1.0, 1.46, 2.54, .45 -> groups 2 and 1 stay.
  Picked r = pick({2, -2, 1, 1, -1, -1, 0, 3}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{4, 5}));  // tie: lower id first
  EXPECT_NEAR(r.weights[0], 1.25f, 1e-6);
  EXPECT_NEAR(r.weights[1], 1.25f, 1e-6);
  // Without the bias the groups' two-best sums are 1.0, 1.46, .54, 1.45:
  // groups 1 and 3 stay (not 0, although expert 0's .881 is the second best
  // score) -> 7, then 2 (tied with 3).
  p.bias = nullptr;
  r = pick({2, -2, 1, 1, -1, -1, 0, 3}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{7, 2}));
  const float s7 = 1 / (1 + std::exp(-3.f)), s2 = 1 / (1 + std::exp(-1.f));
  EXPECT_NEAR(r.weights[0], 2.5f * s7 / (s7 + s2), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5f * s2 / (s7 + s2), 1e-6);
}

// DeepSeek-V2-Lite's rule: softmax over all experts, top-K, no renormalisation.
TEST(GroupedTopKTest, SoftmaxGreedyKeepsTheSoftmaxWeights) {
  GroupedTopK p;
  p.experts = 4;
  p.top_k = 3;
  Picked r = pick({0, std::log(2.f), std::log(3.f), 0, /*token 2*/ 5, 5, 5, 5}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 1, 0, 0, 1, 2}));  // ties: lower id
  EXPECT_NEAR(r.weights[0], 3.f / 7, 1e-6);
  EXPECT_NEAR(r.weights[1], 2.f / 7, 1e-6);
  EXPECT_NEAR(r.weights[2], 1.f / 7, 1e-6);
  EXPECT_NEAR(r.weights[3], 0.25f, 1e-6);
}

// DeepSeek-V2's group_limited_greedy ranks a group by its best score; the
// two-best sum (noaux_tc) would keep the other group.
TEST(GroupedTopKTest, GroupLimitedGreedyRanksGroupsByTheirBest) {
  GroupedTopK p;
  p.experts = 6;
  p.top_k = 2;
  p.n_group = 3;
  p.topk_group = 1;
  const std::vector<float> logits = {0, 3, 2.9f, 2.9f, 0, 0};
  Picked r = pick(logits, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 0}));
  float z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(r.weights[0], std::exp(3.f) / z, 1e-6);
  EXPECT_NEAR(r.weights[1], 1.f / z, 1e-6);
  p.group_by_top2 = true;
  r = pick(logits, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 3}));
}

// Against DeepSeek's own Gate (inference/model.py, through
// tests/runtime/deepseek_reference.py --gate) on seeded random logits, in the
// shapes of V3 (sigmoid, bias, 8 of 256 in 4 of 8 groups), V2 (softmax, 6 of
// 160 in 3 of 8 groups, scale 16), V2-Lite (softmax greedy) and the tiny V3
// preset. Skips without torch or the reference checkout.
TEST(GroupedTopKTest, MatchesDeepSeekReferenceGate) {
  struct Shape {
    int64_t E, K, G, TG;
    bool sigmoid, bias;
    float scale;
  };
  const std::vector<Shape> shapes = {{256, 8, 8, 4, true, true, 2.5f},
                                     {160, 6, 8, 3, false, false, 16.f},
                                     {64, 6, 1, 1, false, false, 1.f},
                                     {16, 4, 4, 2, true, true, 2.5f}};
  const std::string script =
      std::string(MSINFER_SOURCE_DIR) + "/tests/runtime/deepseek_reference.py";
  int seed = 0;
  for (const Shape& s : shapes) {
    const std::string cmd = "/usr/bin/python3 " + script + " --gate " + std::to_string(s.E) + " " +
                            std::to_string(s.K) + " " + std::to_string(s.G) + " " +
                            std::to_string(s.TG) + (s.sigmoid ? " sigmoid " : " softmax ") +
                            (s.bias ? "1 " : "0 ") + std::to_string(s.scale) + " 300 " +
                            std::to_string(++seed) + " 2>&1; echo \" rc=$?\"";
    const std::string out = msinfer::testing::run_capture(cmd);
    // The script exits 77 where it cannot run here (no checkout, no torch).
    if (out.find("rc=77") != std::string::npos) GTEST_SKIP() << out;
    ASSERT_NE(out.find("rc=0"), std::string::npos) << out;
    auto j = parse_json(out.substr(0, out.rfind(" rc=")), "deepseek_reference.py --gate");
    ASSERT_TRUE(j.ok()) << j.status().to_string();
    std::vector<float> logits, bias;
    for (const auto& row : (*j)["logits"]) {
      for (const auto& v : row) logits.push_back(v.get<float>());
    }
    GroupedTopK p;
    p.experts = s.E;
    p.top_k = s.K;
    p.n_group = s.G;
    p.topk_group = s.TG;
    p.sigmoid = s.sigmoid;
    p.group_by_top2 = s.bias;  // the reference's rule: top-2 sums exactly when the gate has a bias
    p.normalize = s.sigmoid;   // and renormalises exactly for sigmoid scores
    p.scale = s.scale;
    if (s.bias) {
      bias = (*j)["bias"].get<std::vector<float>>();
      p.bias = bias.data();
    }
    const int64_t T = static_cast<int64_t>(logits.size()) / s.E;
    ASSERT_EQ(T, 300);
    Picked r = pick(logits, p);
    for (int64_t t = 0; t < T; ++t) {
      // The reference lists the K experts in torch.topk's order; compare as sets.
      std::vector<std::pair<int32_t, float>> got, want;
      for (int64_t k = 0; k < s.K; ++k) {
        got.push_back({r.experts[t * s.K + k], r.weights[t * s.K + k]});
        want.push_back({(*j)["experts"][t][k].get<int32_t>(), (*j)["weights"][t][k].get<float>()});
      }
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      for (int64_t k = 0; k < s.K; ++k) {
        ASSERT_EQ(got[k].first, want[k].first) << "E " << s.E << " token " << t;
        EXPECT_NEAR(got[k].second, want[k].second, 1e-6 * s.scale) << "E " << s.E << " token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu
