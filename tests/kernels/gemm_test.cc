#include "msinfer/kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

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

// Weights packed by one thread count and run by another. oneDNN (the amx
// level's GEMM) picks its packed layout by M and by thread count: on an AMX
// CPU with two threads, N = 64 gets one layout at M < 8 and another from 8 on,
// so every M must run on the layout the weights were packed in (the engine's
// workers aborted on it at M = 8 before).
TEST(GemmTest, WeightsPackedAtOneThreadCountRunAtAnother) {
  const int threads = omp_get_max_threads();
  for (auto [pack_threads, run_threads] : {std::pair<int, int>{1, 2}, {2, 1}, {2, 2}}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{64, 64}, {64, 128}, {96, 256}}) {
      auto w = randn_bf16(n * k, 7 + n + k);
      omp_set_num_threads(pack_threads);
      auto p = PackedLinear::pack(w.data(), n, k);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      omp_set_num_threads(run_threads);
      for (int64_t m : {1, 4, 8, 16, 32, 64, 128}) {
        auto x = randn(m * k, 300 + m);
        std::vector<float> y(m * n, -1.f), ref(m * n);
        p->forward(x.data(), m, y.data());
        linear_reference(w.data(), n, k, x.data(), m, ref.data());
        EXPECT_LT(rel_err(y, ref), 1e-5) << "packed by " << pack_threads << " thread(s), run by "
                                         << run_threads << ": n=" << n << " k=" << k << " m=" << m;
      }
    }
  }
  omp_set_num_threads(threads);
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
