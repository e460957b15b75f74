#include "msinfer/kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace msinfer::kernels::cpu {
namespace {

using testing::randn;
using testing::randn_bf16;
using testing::rel_err;

// oneDNN against the plain loop. Both see the same bf16-rounded inputs; only the
// fp32 accumulation order differs: 1e-5 relative to the largest output.
TEST(GemmTest, PackedMatchesReferenceOverOddShapes) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {17, 33}, {64, 128}, {130, 67}}) {
    auto w = randn_bf16(n * k, 1 + n);
    auto p = PackedLinear::pack(w.data(), n, k);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->n(), n);
    EXPECT_EQ(p->k(), k);
    for (int64_t m : {0, 1, 2, 3, 5, 16, 17, 65, 130}) {
      auto x = randn(m * k, 100 + m);
      std::vector<float> y(m * n, -1.f), ref(m * n);
      p->forward(x.data(), m, y.data());
      linear_reference(w.data(), n, k, x.data(), m, ref.data());
      if (m > 0) {
        EXPECT_LT(rel_err(y, ref), 1e-5) << "n=" << n << " k=" << k << " m=" << m;
      }
    }
  }
}

TEST(GemmTest, BucketsArePowersOfTwoThenMultiplesOf64) {
  EXPECT_EQ(gemm_m_bucket(1), 1);
  EXPECT_EQ(gemm_m_bucket(3), 4);
  EXPECT_EQ(gemm_m_bucket(64), 64);
  EXPECT_EQ(gemm_m_bucket(65), 128);
  EXPECT_EQ(gemm_m_bucket(200), 256);
  EXPECT_EQ(gemm_m_bucket(1000), 1024);
}

TEST(GemmTest, RejectsEmptyWeights) { EXPECT_FALSE(PackedLinear::pack(nullptr, 0, 4).ok()); }

}  // namespace
}  // namespace msinfer::kernels::cpu
