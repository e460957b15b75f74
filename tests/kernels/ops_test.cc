#include "msinfer/kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace msinfer::kernels::cpu {
namespace {

using testing::randn;

TEST(OpsTest, RmsNormMatchesFormula) {
  for (int64_t dim : {1, 7, 64, 129}) {
    auto x = randn(3 * dim, dim);
    auto w = randn(dim, 2 * dim);
    std::vector<float> y(x.size());
    rms_norm(x.data(), w.data(), 3, dim, 1e-6f, y.data());
    for (int r = 0; r < 3; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      double inv = 1 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i) {
        EXPECT_NEAR(y[r * dim + i], x[r * dim + i] * inv * w[i], 1e-5);
      }
    }
    rms_norm(x.data(), w.data(), 3, dim, 1e-6f, x.data());  // in place
    EXPECT_EQ(x, y);
  }
}

TEST(OpsTest, RopeRotatesHalvesByPositionAngle) {
  const int64_t heads = 3, hd = 8;
  auto x = randn(2 * heads * hd, 5);
  auto y = x;
  int32_t pos[2] = {0, 37};
  rope(y.data(), pos, 2, heads, hd, 10000.0);
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        double a = pos[t] * std::pow(10000.0, -2.0 * i / hd);
        const float* v = x.data() + (t * heads + h) * hd;
        const float* o = y.data() + (t * heads + h) * hd;
        EXPECT_NEAR(o[i], v[i] * std::cos(a) - v[i + hd / 2] * std::sin(a), 2e-5);
        EXPECT_NEAR(o[i + hd / 2], v[i + hd / 2] * std::cos(a) + v[i] * std::sin(a), 2e-5);
      }
    }
  }
  // Position 0 is the identity.
  for (int i = 0; i < heads * hd; ++i) EXPECT_FLOAT_EQ(y[i], x[i]);
}

TEST(OpsTest, SiluMulAndSoftmax) {
  auto gu = randn(2 * 2 * 5, 9);
  std::vector<float> out(2 * 5);
  silu_mul(gu.data(), 2, 5, out.data());
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 5; ++j) {
      double g = gu[r * 10 + j], u = gu[r * 10 + 5 + j];
      EXPECT_NEAR(out[r * 5 + j], g / (1 + std::exp(-g)) * u, 1e-6);
    }
  }
  std::vector<float> s = {1000.f, 1001.f, 999.f};
  softmax_inplace(s.data(), 3);
  double z = 1 + std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(s[0], 1 / z, 1e-6);
  EXPECT_NEAR(s[1], std::exp(1.0) / z, 1e-6);
}

}  // namespace
}  // namespace msinfer::kernels::cpu
