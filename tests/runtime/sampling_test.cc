#include "msinfer/runtime/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace msinfer::runtime {
namespace {

TEST(SamplingTest, GreedyTopKOneAndTinyTopPPickTheArgmax) {
  std::vector<float> l = {0.1f, 2.0f, 1.9f, -1.f};
  std::mt19937_64 rng(1);
  SamplingParams p;
  EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
  p.top_k = 0;
  p.top_p = 1e-6f;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
}

// The two-pass argmax against std::max_element (the first largest): sizes
// around the lane count, ties (many equal maxima, signed zeros), all-negative
// and infinite values, a NaN that must not win.
TEST(SamplingTest, ArgmaxIsTheFirstLargest) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> small(-3, 3);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 390, 1000, 32000}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (auto& v : x) v = trial % 2 ? static_cast<float>(small(rng)) : normal(rng) - 100.f;
      if (trial == 4) x[n / 2] = std::numeric_limits<float>::infinity();
      const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
      EXPECT_EQ(argmax(x.data(), n), want) << "n " << n << " trial " << trial;
    }
  }
  std::vector<float> z = {-0.f, 0.f, -1.f};  // equal under ==: the first
  EXPECT_EQ(argmax(z.data(), 3), 0);
  std::vector<float> nan(40, -5.f);
  nan[3] = std::nanf("");
  nan[37] = -4.f;
  EXPECT_EQ(argmax(nan.data(), 40), 37);
  std::vector<float> all(20, std::nanf(""));
  EXPECT_EQ(argmax(all.data(), 20), 0);
  EXPECT_EQ(argmax(all.data(), 0), 0);
}

TEST(SamplingTest, FrequenciesFollowTheTemperatureSoftmax) {
  std::vector<float> l = {0.f, 1.f, 2.f};
  SamplingParams p;
  p.temperature = 2.0f;
  std::mt19937_64 rng(42);
  std::vector<int> count(3, 0);
  const int n = 60000;
  for (int i = 0; i < n; ++i) ++count[sample_token(l.data(), 3, p, rng)];
  double z = 1 + std::exp(0.5) + std::exp(1.0);
  EXPECT_NEAR(count[0] / double(n), 1 / z, 0.01);
  EXPECT_NEAR(count[2] / double(n), std::exp(1.0) / z, 0.01);
  // top-k 2 removes token 0 entirely.
  p.top_k = 2;
  for (int i = 0; i < 1000; ++i) EXPECT_NE(sample_token(l.data(), 3, p, rng), 0);
}

TEST(SamplingTest, SeededAndValidated) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 1.3f);
  SamplingParams p;
  p.temperature = 1.0f;
  auto draw = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v;
    for (int i = 0; i < 20; ++i) v.push_back(sample_token(l.data(), 50, p, rng));
    return v;
  };
  EXPECT_EQ(draw(3), draw(3));
  EXPECT_NE(draw(3), draw(4));
  SamplingParams bad;
  bad.temperature = -1;
  EXPECT_FALSE(bad.validate().ok());
  bad.temperature = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(bad.validate().ok());
  bad = SamplingParams{};
  bad.max_tokens = 0;
  EXPECT_FALSE(bad.validate().ok());
}

}  // namespace
}  // namespace msinfer::runtime
