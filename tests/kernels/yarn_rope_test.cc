#include "msinfer/kernels/cpu/yarn_rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"

namespace msinfer::kernels::cpu {
namespace {

TEST(YarnRopeTest, PlainFrequenciesAndTheRamp) {
  // factor 1: base^(-2i/d).
  std::vector<float> f = yarn_inv_freq(8, 10000, 1, 4096, 32, 1);
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / 8), 1e-7);
  // dim 16, original 128: correction range [0, 3] (d(32) = -0.39 -> 0,
  // d(1) = 2.62 -> 3): pair 0 keeps its frequency, pairs >= 3 are / 4, 1 and 2
  // are interpolated 2/3 and 1/3 of the way.
  std::vector<float> y = yarn_inv_freq(16, 10000, 4, 128, 32, 1);
  std::vector<float> p = yarn_inv_freq(16, 10000, 1, 128, 32, 1);
  EXPECT_FLOAT_EQ(y[0], p[0]);
  EXPECT_NEAR(y[1], p[1] * (2.0 / 3 + 1.0 / 3 / 4), 1e-7);
  EXPECT_NEAR(y[2], p[2] * (1.0 / 3 + 2.0 / 3 / 4), 1e-7);
  for (int i = 3; i < 8; ++i) EXPECT_NEAR(y[i], p[i] / 4, 1e-9) << i;
}

TEST(YarnRopeTest, RotatesInterleavedPairs) {
  const std::vector<float> inv = {1.0f, 0.5f};
  std::vector<float> x = {1, 0, 0, 1, /*head 1*/ 2, 0, 0, 2};
  const int32_t pos = 1;
  rope_interleaved(x.data(), &pos, 1, 2, 4, inv.data(), 2.0f);
  // (1 + 0i) * 2 e^{i}, (0 + 1i) * 2 e^{0.5 i}
  EXPECT_NEAR(x[0], 2 * std::cos(1.f), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::sin(1.f), 1e-6);
  EXPECT_NEAR(x[2], -2 * std::sin(0.5f), 1e-6);
  EXPECT_NEAR(x[3], 2 * std::cos(0.5f), 1e-6);
  EXPECT_NEAR(x[4], 4 * std::cos(1.f), 1e-6);
}

// Against DeepSeek's own precompute_freqs_cis + apply_rotary_emb
// (tests/runtime/deepseek_reference.py --rope): the tiny presets' YaRN, DeepSeek-V3's
// (factor 40 over 4096 positions, far positions), and plain RoPE. Skips
// without torch or the reference checkout.
TEST(YarnRopeTest, MatchesDeepSeekReference) {
  struct Case {
    int64_t dim;
    double base, factor;
    int64_t original, max_seq;
    int32_t start;
  };
  const std::vector<Case> cases = {{16, 10000, 4, 128, 512, 100},
                                   {64, 10000, 40, 4096, 163840, 150000},
                                   {8, 10000, 1, 4096, 4096, 7}};
  const std::string script =
      std::string(MSINFER_SOURCE_DIR) + "/tests/runtime/deepseek_reference.py";
  const int64_t T = 5, H = 3;
  for (const Case& c : cases) {
    char args[256];
    std::snprintf(args, sizeof(args), " --rope %ld %g %g %ld %ld 32 1 %d %ld %ld 3", c.dim, c.base,
                  c.factor, c.original, c.max_seq, c.start, T, H);
    const std::string out = msinfer::testing::run_capture("/usr/bin/python3 " + script + args +
                                                          " 2>&1; echo \" rc=$?\"");
    // The script exits 77 where it cannot run here (no checkout, no torch).
    if (out.find("rc=77") != std::string::npos) GTEST_SKIP() << out;
    ASSERT_NE(out.find("rc=0"), std::string::npos) << out;
    auto j = parse_json(out.substr(0, out.rfind(" rc=")), "deepseek_reference.py --rope");
    ASSERT_TRUE(j.ok()) << j.status().to_string();
    std::vector<float> x = (*j)["x"].get<std::vector<float>>();
    const std::vector<float> y = (*j)["y"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(x.size()), T * H * c.dim);
    // The reference's YaRN is on when max_seq_len > original_seq_len.
    const double factor = c.max_seq > c.original ? c.factor : 1.0;
    const std::vector<float> inv = yarn_inv_freq(c.dim, c.base, factor, c.original, 32, 1);
    std::vector<int32_t> pos(T);
    std::iota(pos.begin(), pos.end(), c.start);
    rope_interleaved(x.data(), pos.data(), T, H, c.dim, inv.data());
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, double(std::fabs(x[i] - y[i])));
    // Both sides do the same float32 operations (angle = pos * inv_freq,
    // cos/sin, complex product): measured identical to 1e-6 at every case,
    // angles up to 1.5e5 rad included. A different angle rounding would show
    // as errors of ~1e-2 there.
    EXPECT_LT(worst, 2e-5) << "dim " << c.dim << " start " << c.start;
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu
