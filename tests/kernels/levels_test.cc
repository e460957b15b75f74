// Every kernel of every CPU level this machine runs, against the generic level
// (plain C++, itself checked against the double-precision references in the
// other kernel tests) on odd shapes, bf16 and int8 weights. A level this CPU
// lacks is listed as not run; generic always runs.
//
// Tolerances: levels differ from generic only in fp32 summation order (FMA
// chains, blocked K, reductions of 8 partial sums) and, in exp, by the
// polynomial's ~2e-7 relative error: 1e-5 relative to the largest output.
// Attention at avx512bf16 and amx computes the scores as bf16 dot products
// (q rounded to bf16, as an HF bf16 model's q is): there the level is
// compared with the double-precision reference that rounds q the same way,
// at kTol too (measured ~1e-7: summation order); leaving q unrounded in the
// reference gives ~1.5e-3 here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/moe.h"
#include "msinfer/kernels/cpu/ops.h"
#include "test_util.h"

namespace msinfer::kernels::cpu {
namespace {

using testing::randn;
using testing::randn_bf16;
using testing::rel_err;

constexpr double kTol = 1e-5;

// Every level this CPU runs, generic included.
std::vector<IsaLevel> levels_here() {
  std::vector<IsaLevel> out;
  for (IsaLevel l : all_isa_levels()) {
    if (isa_supported(l)) out.push_back(l);
  }
  return out;
}

// Levels above generic that this CPU runs (may be empty).
std::vector<IsaLevel> higher_levels() {
  std::vector<IsaLevel> out = levels_here();
  out.erase(std::remove(out.begin(), out.end(), IsaLevel::kGeneric), out.end());
  return out;
}

// The level's attention output `l` against generic's `g` or, where the level
// rounds q for the scores (attention_bf16_qk), against `rounded_ref()`: the
// double-precision reference with q rounded the same way.
void expect_attention_matches(IsaLevel level, int64_t hd, int64_t group,
                              const std::vector<float>& l, const std::vector<float>& g,
                              const std::function<std::vector<float>()>& rounded_ref) {
  if (!attention_bf16_qk(level, hd)) {
    EXPECT_LT(rel_err(l, g), kTol) << isa_name(level) << " hd=" << hd << " group=" << group;
    return;
  }
  const std::vector<float> ref = rounded_ref();
  EXPECT_LT(rel_err(l, ref), kTol) << isa_name(level) << " hd=" << hd << " group=" << group;
  std::printf("[ levels ] %s attention hd=%lld group=%lld: bf16 q %.2g, unrounded %.2g\n",
              isa_name(level), static_cast<long long>(hd), static_cast<long long>(group),
              rel_err(l, ref), rel_err(l, g));
}

// Restores the active level after a test that forces others.
class LevelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = active_isa();
    std::string run = "generic";
    for (IsaLevel l : higher_levels()) run += std::string(" ") + isa_name(l);
    std::printf("[ levels ] comparing with generic: %s (CPU: %s)\n", run.c_str(),
                isa_name(detected_isa()));
  }
  void TearDown() override { ASSERT_TRUE(force_isa(saved_).ok()); }

  // f() run at generic and at `level`; returns (generic output, level output).
  static std::pair<std::vector<float>, std::vector<float>> both(
      IsaLevel level, const std::function<std::vector<float>()>& f) {
    EXPECT_TRUE(force_isa(IsaLevel::kGeneric).ok());
    auto g = f();
    EXPECT_TRUE(force_isa(level).ok());
    auto l = f();
    return {g, l};
  }

  IsaLevel saved_ = IsaLevel::kGeneric;
};

TEST_F(LevelsTest, GemmBf16AndInt8MatchGenericOverOddShapes) {
  // K = 1100 crosses the direct path's k blocks (512 and 256 steps at the
  // avx2 and avx512 levels); up to 24 and 48 rows it runs in 6- and 12-row
  // tiles there (more: the blocked fp32 path).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {7, 13}, {17, 33}, {33, 300}, {64, 128}, {130, 67}, {20, 1100}};
  const std::vector<int64_t> ms = {1, 2, 3, 5, 6, 7, 8, 12, 13, 17, 24, 25, 37, 48, 49, 65, 200};
  for (auto [n, k] : shapes) {
    auto w = randn_bf16(n * k, 1 + n + k);
    for (WeightFormat fmt : {WeightFormat::kBf16, WeightFormat::kInt8}) {
      auto gen = PackedLinear::pack(w.data(), n, k, fmt, IsaLevel::kGeneric);
      ASSERT_TRUE(gen.ok()) << gen.status().to_string();
      // Generic against the double-precision reference (int8: on the dequantised weights).
      std::vector<bf16> wref = w;
      if (fmt == WeightFormat::kInt8) {
        std::vector<int8_t> q(n * k);
        std::vector<float> s(n);
        quantize_int8_rows(w.data(), n, k, q.data(), s.data());
        // q * s is not a bf16 value in general; compare against float math instead.
        for (int64_t m : {1, 13}) {
          auto x = randn(m * k, 7 + m);
          std::vector<float> y(m * n), ref(m * n);
          gen->forward(x.data(), m, y.data());
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double acc = 0;
              for (int64_t t = 0; t < k; ++t) {
                acc += static_cast<double>(round_to_bf16(x[i * k + t])) * q[j * k + t];
              }
              ref[i * n + j] = static_cast<float>(acc * s[j]);
            }
          }
          EXPECT_LT(rel_err(y, ref), kTol) << "generic int8 n=" << n << " k=" << k << " m=" << m;
        }
      } else {
        auto x = randn(5 * k, 9);
        std::vector<float> y(5 * n), ref(5 * n);
        gen->forward(x.data(), 5, y.data());
        linear_reference(w.data(), n, k, x.data(), 5, ref.data());
        EXPECT_LT(rel_err(y, ref), kTol) << "generic bf16 n=" << n << " k=" << k;
      }
      for (IsaLevel level : higher_levels()) {
        auto lv = PackedLinear::pack(w.data(), n, k, fmt, level);
        ASSERT_TRUE(lv.ok()) << isa_name(level) << ": " << lv.status().to_string();
        EXPECT_EQ(lv->level(), level);
        EXPECT_EQ(lv->format(), fmt);
        for (int64_t m : ms) {
          auto x = randn(m * k, 100 + m);
          std::vector<float> yg(m * n, -1.f), yl(m * n, -2.f);
          gen->forward(x.data(), m, yg.data());
          lv->forward(x.data(), m, yl.data());
          EXPECT_LT(rel_err(yl, yg), kTol) << isa_name(level) << " " << weight_format_name(fmt)
                                           << " n=" << n << " k=" << k << " m=" << m;
        }
      }
    }
  }
}

// MXFP4 weights kept 4-bit (gemm.h) against the same weights decoded to bf16
// and packed as bf16 at the same level: at generic, avx2 and avx512 the mxfp4
// kernel runs the bf16 kernel's FMAs in its order on exactly the decoded
// values, so the outputs are the same bits; at avx512bf16 and amx (bf16 by
// vdpbf16ps, mxfp4 by the avx512 kernel) they differ by summation order only
// (kTol). Generic's mxfp4 also against the double-precision reference. Odd
// row counts (n not a multiple of the 16- or 32-column panels), K multiples
// of 32 that cross the k blocks of the multi-tile path (1088 > 512, 256) and
// avx2's 64-step decode buffer (96, 320: a last sub-block of one mxfp4 block),
// and batch sizes around the 6- and 12-row tiles (avx2: 1, 2 and 4 rows decode
// in registers, 3, 5, 6 and several tiles through the buffer).
TEST_F(LevelsTest, GemmMxfp4IsTheBf16KernelOnTheDecodedWeights) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 32}, {7, 64}, {17, 96}, {33, 320}, {64, 128}, {130, 64}, {20, 1088}};
  const std::vector<int64_t> ms = {1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 24, 25, 49, 200};
  for (auto [n, k] : shapes) {
    const testing::Mxfp4Weight mx = testing::random_mxfp4(n, k, 3 + n + k);
    std::vector<bf16> w(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < n * k / 32; ++i) {
      mxfp4_decode_block(mx.blocks.data() + 16 * i, mx.scales[i], w.data() + 32 * i);
    }
    for (IsaLevel level : levels_here()) {
      auto q = PackedLinear::pack_mxfp4(mx.blocks.data(), mx.scales.data(), n, k, level);
      ASSERT_TRUE(q.ok()) << isa_name(level) << ": " << q.status().to_string();
      EXPECT_EQ(q->format(), WeightFormat::kMxfp4);
      EXPECT_EQ(q->level(), level);
      EXPECT_LT(q->bytes(), static_cast<size_t>((n + 31) / 32 * 32 * k * 17 / 32 + 1));
      auto b = PackedLinear::pack(w.data(), n, k, WeightFormat::kBf16, level);
      ASSERT_TRUE(b.ok()) << b.status().to_string();
      const bool same_bits =
          level == IsaLevel::kGeneric || level == IsaLevel::kAvx2 || level == IsaLevel::kAvx512;
      for (int64_t m : ms) {
        auto x = randn(m * k, 50 + m);
        std::vector<float> ym(m * n, -1.f), yb(m * n, -2.f);
        q->forward(x.data(), m, ym.data());
        b->forward(x.data(), m, yb.data());
        if (same_bits) {
          EXPECT_EQ(0, std::memcmp(ym.data(), yb.data(), sizeof(float) * ym.size()))
              << isa_name(level) << " n=" << n << " k=" << k << " m=" << m << " rel err "
              << rel_err(ym, yb);
        } else {
          EXPECT_LT(rel_err(ym, yb), kTol)
              << isa_name(level) << " n=" << n << " k=" << k << " m=" << m;
          if (m == 1 || m == 200) {
            std::printf("[ levels ] %s mxfp4 n=%lld k=%lld m=%lld: %.2g from its bf16 kernel\n",
                        isa_name(level), static_cast<long long>(n), static_cast<long long>(k),
                        static_cast<long long>(m), rel_err(ym, yb));
          }
        }
        if (level == IsaLevel::kGeneric && (m == 1 || m == 13)) {
          std::vector<float> ref(m * n);
          linear_reference(w.data(), n, k, x.data(), m, ref.data());
          EXPECT_LT(rel_err(ym, ref), kTol) << "generic n=" << n << " k=" << k << " m=" << m;
        }
      }
    }
  }
}

// Every e8m0 byte but 255, each in a panel block of its own: the 16 rows of
// group g (a 16-column panel at avx2, half of one at avx512) have scale
// g % 255 in their first block and 127 in their second, so the avx2 kernel's
// choice per block is tested at each value: exponent arithmetic (2..251) or
// a multiply (0, 1: denormal weights; 252..254: the top of the float range,
// where the largest values are infinite and some sums NaN); one large scale
// per row, so that a block decoded wrong is not hidden by another block's
// infinity. Same bits as the bf16 kernel on the decoded weights wherever
// that is the contract (panels that mix scales: the test above).
TEST_F(LevelsTest, GemmMxfp4IsExactAtEveryScaleByte) {
  const int64_t n = 16 * 255 + 3, k = 64;
  testing::Mxfp4Weight mx = testing::random_mxfp4(n, k, 11);
  for (int64_t j = 0; j < n; ++j) {
    mx.scales[j * 2] = static_cast<uint8_t>(j / 16 % 255);
    mx.scales[j * 2 + 1] = 127;
  }
  std::vector<bf16> w(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k / 32; ++i) {
    mxfp4_decode_block(mx.blocks.data() + 16 * i, mx.scales[i], w.data() + 32 * i);
  }
  for (IsaLevel level : levels_here()) {
    if (level != IsaLevel::kGeneric && level != IsaLevel::kAvx2 && level != IsaLevel::kAvx512) {
      continue;  // summation order differs there; infinities make that moot
    }
    auto q = PackedLinear::pack_mxfp4(mx.blocks.data(), mx.scales.data(), n, k, level);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    auto b = PackedLinear::pack(w.data(), n, k, WeightFormat::kBf16, level);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    for (int64_t m : {1, 2, 3, 4, 6, 16}) {
      auto x = randn(m * k, 70 + m);
      std::vector<float> ym(m * n, -1.f), yb(m * n, -2.f);
      q->forward(x.data(), m, ym.data());
      b->forward(x.data(), m, yb.data());
      EXPECT_EQ(0, std::memcmp(ym.data(), yb.data(), sizeof(float) * ym.size()))
          << isa_name(level) << " m=" << m;
    }
  }
}

TEST_F(LevelsTest, GemmMxfp4RefusesBadShapesAndScales) {
  const testing::Mxfp4Weight mx = testing::random_mxfp4(4, 64, 1);
  for (IsaLevel level : levels_here()) {
    // K = 48: not whole blocks of 32.
    auto odd = PackedLinear::pack_mxfp4(mx.blocks.data(), mx.scales.data(), 4, 48, level);
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(odd.status().message().find("multiple of 32"), std::string::npos)
        << odd.status().to_string();
    testing::Mxfp4Weight nan = mx;
    nan.scales[5] = 0xFF;
    auto bad = PackedLinear::pack_mxfp4(nan.blocks.data(), nan.scales.data(), 4, 64, level);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("[2, 1] is 255"), std::string::npos)
        << bad.status().to_string();
    std::vector<bf16> w(4 * 64);
    EXPECT_FALSE(PackedLinear::pack(w.data(), 4, 64, WeightFormat::kMxfp4, level).ok());
  }
}

// The avx512bf16 level's bf16 GEMM sums each output in k order whatever m,
// the row's place in the batch or the K blocking: a token's row gives the
// same bits alone (decode of one request) as inside a batch of 200 (prefill,
// or an expert's rows from many requests), so batching never changes a
// request's tokens. Shapes cross the kernel's K block (300 = 2 blocks of
// pairs), its row chunk (200 > 192) and odd K.
TEST_F(LevelsTest, Avx512Bf16GemmRowsAreTheSameBitsAtEveryBatchSize) {
  if (!isa_supported(IsaLevel::kAvx512Bf16)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (auto [n, k] : {std::pair<int64_t, int64_t>{33, 300}, {130, 67}, {64, 1}}) {
    auto w = randn_bf16(n * k, 5 + n + k);
    auto p = PackedLinear::pack(w.data(), n, k, WeightFormat::kBf16, IsaLevel::kAvx512Bf16);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    const int64_t m = 200;
    auto x = randn(m * k, 17 + k);
    std::vector<float> batch(m * n);
    p->forward(x.data(), m, batch.data());
    for (int64_t i : {0, 1, 11, 12, 13, 191, 192, 199}) {
      std::vector<float> alone(n);
      p->forward(x.data() + i * k, 1, alone.data());
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(alone[j], batch[i * n + j]) << "n=" << n << " k=" << k << " row " << i;
      }
      // And as row 3 of a batch of 7 (the direct, unblocked path at m <= 12).
      std::vector<float> x7(7 * k), y7(7 * n);
      for (int64_t r = 0; r < 7; ++r) {  // rows i - 3 .. i + 3 of x
        const int64_t src = (i + r - 3 + m) % m;
        std::copy(x.data() + src * k, x.data() + (src + 1) * k, x7.data() + r * k);
      }
      p->forward(x7.data(), 7, y7.data());
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(y7[3 * n + j], batch[i * n + j]) << "n=" << n << " k=" << k << " row " << i;
      }
    }
  }
}

// w8a8 (gemm.h): the integer sums are exact, so every level must give the
// same bits as the exact reference below (int64 sums of the quantised values,
// then the same float expression), for every m. The reference treats each
// row on its own, so this also says a row's output never depends on its
// batch. Shapes: K not a multiple of 4, K past the 16 KiB block (1100 words
// of 16 columns is > 256 steps at avx2), rows on both sides of the tile
// heights (4 at avx2, 12 at avx512) and the chunks (64, 192); an all-zero row
// and a row with one large outlier.
TEST_F(LevelsTest, GemmW8A8IsTheExactIntegerProductAtEveryLevel) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {7, 13},   {17, 33},
                                                           {33, 300}, {130, 67}, {20, 4400}};
  const std::vector<int64_t> ms = {1, 2, 3, 4, 5, 7, 12, 13, 17, 25, 64, 65, 200};
  for (auto [n, k] : shapes) {
    auto w = randn_bf16(n * k, 11 + n + k);
    std::vector<int8_t> qw(n * k);
    std::vector<float> sw(n);
    quantize_int8_rows(w.data(), n, k, qw.data(), sw.data());
    for (IsaLevel level : levels_here()) {
      auto lv = PackedLinear::pack(w.data(), n, k, WeightFormat::kW8A8, level);
      ASSERT_TRUE(lv.ok()) << isa_name(level) << ": " << lv.status().to_string();
      EXPECT_EQ(lv->level(), level);
      EXPECT_EQ(lv->format(), WeightFormat::kW8A8);
      for (int64_t m : ms) {
        auto x = randn(m * k, 300 + m);
        if (m > 2) std::fill(x.begin() + k, x.begin() + 2 * k, 0.f);  // row 1: zeros
        if (m > 3) x[2 * k + k / 2] = 40.f;                           // row 2: an outlier
        std::vector<float> y(m * n, -1.f), ref(m * n);
        lv->forward(x.data(), m, y.data());
        std::vector<int8_t> qx(k);
        for (int64_t i = 0; i < m; ++i) {
          float sx = 0;
          quantize_int8_activations(x.data() + i * k, k, qx.data(), &sx);
          for (int64_t j = 0; j < n; ++j) {
            int64_t acc = 0;
            for (int64_t t = 0; t < k; ++t) acc += int64_t{qx[t]} * qw[j * k + t];
            ref[i * n + j] = static_cast<float>(acc) * (sx * sw[j]);
          }
        }
        int64_t differ = 0;
        for (int64_t e = 0; e < m * n; ++e) differ += std::memcmp(&y[e], &ref[e], 4) != 0;
        EXPECT_EQ(differ, 0) << isa_name(level) << " n=" << n << " k=" << k << " m=" << m
                             << ": outputs that are not the exact integer product";
      }
    }
  }
}

// Past kW8A8MaxK the int32 sums could wrap: packing refuses, at every level.
TEST_F(LevelsTest, GemmW8A8RefusesAKWhoseSumsCouldOverflow) {
  std::vector<bf16> w(kW8A8MaxK + 1, float_to_bf16(1.0f));
  for (IsaLevel level : levels_here()) {
    auto bad = PackedLinear::pack(w.data(), 1, kW8A8MaxK + 1, WeightFormat::kW8A8, level);
    ASSERT_FALSE(bad.ok()) << isa_name(level);
    EXPECT_NE(bad.status().message().find("could overflow"), std::string::npos)
        << bad.status().message();
    EXPECT_TRUE(PackedLinear::pack(w.data(), 1, kW8A8MaxK, WeightFormat::kW8A8, level).ok())
        << isa_name(level);
  }
}

// What w8a8 costs against the bf16 GEMM on Gaussian data: one activation and
// one weight quantisation per product: 1.2% of the largest output here (a
// fixed seed; K = 1024 sums ~32 quantisation errors of each side); bar 2%.
TEST_F(LevelsTest, GemmW8A8IsWithinTwoPercentOfBf16) {
  const int64_t n = 96, k = 1024, m = 9;
  auto w = randn_bf16(n * k, 21);
  auto x = randn(m * k, 22);
  auto p = PackedLinear::pack(w.data(), n, k, WeightFormat::kW8A8, IsaLevel::kGeneric);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::vector<float> y(m * n), ref(m * n);
  p->forward(x.data(), m, y.data());
  linear_reference(w.data(), n, k, x.data(), m, ref.data());
  const double err = rel_err(y, ref);
  std::printf("[ levels ] w8a8 against bf16: %.3g of the largest output\n", err);
  EXPECT_LT(err, 0.02);
  EXPECT_GT(err, 0.0);  // it does quantise the activations
}

TEST_F(LevelsTest, Int8ActivationsAreSymmetricPerRowWithinHalfAStep) {
  const int64_t k = 37;
  auto x = randn(k, 5);
  x[3] = 0.f;
  std::vector<int8_t> q(k);
  float s = 0;
  quantize_int8_activations(x.data(), k, q.data(), &s);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  EXPECT_FLOAT_EQ(s, amax / 127.0f);
  int peak = 0;
  for (int64_t t = 0; t < k; ++t) {
    EXPECT_LE(std::fabs(q[t] * s - x[t]), 0.5f * s + 1e-6f) << t;
    peak = std::max(peak, std::abs(static_cast<int>(q[t])));
  }
  EXPECT_EQ(peak, 127);
  EXPECT_EQ(q[3], 0);
  std::vector<float> zeros(k, 0.f);
  quantize_int8_activations(zeros.data(), k, q.data(), &s);
  EXPECT_EQ(s, 1.0f);
  for (int8_t v : q) EXPECT_EQ(v, 0);
  // A NaN element becomes 0 instead of undefined behaviour.
  x[7] = std::nanf("");
  quantize_int8_activations(x.data(), k, q.data(), &s);
  EXPECT_EQ(q[7], 0);
}

TEST_F(LevelsTest, Int8WeightsAreSymmetricPerRowWithinHalfAStep) {
  const int64_t n = 9, k = 70;
  auto w = randn_bf16(n * k, 3);
  w[5] = float_to_bf16(0.f);  // zero rows and values survive
  for (int64_t t = 0; t < k; ++t) w[2 * k + t] = float_to_bf16(0.f);
  std::vector<int8_t> q(n * k);
  std::vector<float> s(n);
  quantize_int8_rows(w.data(), n, k, q.data(), s.data());
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0;
    for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(bf16_to_float(w[j * k + t])));
    int peak = 0;
    for (int64_t t = 0; t < k; ++t) {
      const float v = bf16_to_float(w[j * k + t]);
      EXPECT_LE(std::fabs(q[j * k + t] * s[j] - v), 0.5f * s[j] + 1e-7f) << j << "," << t;
      EXPECT_GE(q[j * k + t], -127);
      peak = std::max(peak, std::abs(static_cast<int>(q[j * k + t])));
    }
    if (amax > 0) {
      EXPECT_EQ(peak, 127) << "row " << j << " uses the full range";
      EXPECT_FLOAT_EQ(s[j], amax / 127.0f);
    } else {
      EXPECT_EQ(peak, 0);
    }
  }
}

TEST_F(LevelsTest, AttentionMatchesGenericForEveryHeadDimAndGroup) {
  for (IsaLevel level : higher_levels()) {
    for (int64_t hd : {1, 5, 8, 16, 33, 64, 128}) {
      for (int64_t group : {1, 3, 9}) {
        const int64_t kvh = 2, heads = kvh * group, bs = 4, blocks = 24;
        std::vector<bf16> kpool(blocks * bs * kvh * hd), vpool(kpool.size());
        PagedKvLayer kv{kpool.data(), vpool.data(), bs, kvh, hd};
        std::vector<int32_t> table_a = {7, 2, 9, 20, 3, 15, 11, 1, 0, 23};
        std::vector<int32_t> pos;
        std::vector<const int32_t*> tables;
        for (int p = 0; p < 37; ++p) {
          pos.push_back(p);
          tables.push_back(table_a.data());
        }
        const int64_t T = static_cast<int64_t>(pos.size());
        auto k = randn(T * kvh * hd, 1 + hd), v = randn(T * kvh * hd, 2 + hd);
        auto q = randn(T * heads * hd, 3 + hd);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        auto [g, l] = both(level, [&] {
          write_kv(kv, k.data(), v.data(), T, pos.data(), tables.data());
          std::vector<float> out(q.size());
          paged_attention(q.data(), T, heads, kv, pos.data(), tables.data(), scale, out.data());
          return out;
        });
        expect_attention_matches(level, hd, group, l, g, [&] {
          std::vector<float> ref(q.size());
          paged_attention_reference(q.data(), T, heads, kv, pos.data(), tables.data(), scale,
                                    ref.data(), /*bf16_qk=*/true);
          return ref;
        });
      }
    }
  }
}

// Decode over contexts longer than the value pass's chunk of positions (128),
// with a block size that does not divide it, so chunks start and end inside
// blocks; head groups that need several slices of head dims per chunk.
TEST_F(LevelsTest, AttentionOverLongContextsMatchesGeneric) {
  for (IsaLevel level : higher_levels()) {
    for (int64_t hd : {64, 128}) {
      for (int64_t group : {1, 4, 8}) {
        const int64_t kvh = 2, heads = kvh * group, bs = 12, ctx = 301;
        const int64_t blocks = (ctx + bs - 1) / bs + 3;
        std::vector<bf16> kpool(blocks * bs * kvh * hd), vpool(kpool.size());
        PagedKvLayer kv{kpool.data(), vpool.data(), bs, kvh, hd};
        std::vector<int32_t> table(blocks);
        for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>((b * 7 + 3) % blocks);
        std::vector<int32_t> pos;
        std::vector<const int32_t*> tables;
        for (int p = 0; p < ctx; ++p) {
          pos.push_back(p);
          tables.push_back(table.data());
        }
        auto k = randn(ctx * kvh * hd, 11 + hd), v = randn(ctx * kvh * hd, 12 + hd);
        // Decode the last three positions (three queries over ~300 positions each).
        auto q = randn(3 * heads * hd, 13 + hd);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<int32_t> dpos = {ctx - 3, ctx - 2, ctx - 1};
        std::vector<const int32_t*> dtables = {table.data(), table.data(), table.data()};
        auto [g, l] = both(level, [&] {
          write_kv(kv, k.data(), v.data(), ctx, pos.data(), tables.data());
          std::vector<float> out(q.size());
          paged_attention(q.data(), 3, heads, kv, dpos.data(), dtables.data(), scale, out.data());
          return out;
        });
        expect_attention_matches(level, hd, group, l, g, [&] {
          std::vector<float> ref(q.size());
          paged_attention_reference(q.data(), 3, heads, kv, dpos.data(), dtables.data(), scale,
                                    ref.data(), /*bf16_qk=*/true);
          return ref;
        });
      }
    }
  }
}

TEST_F(LevelsTest, ElementwiseKernelsMatchGeneric) {
  for (IsaLevel level : higher_levels()) {
    for (int64_t dim : {1, 7, 16, 33, 130}) {
      const int64_t rows = 5;
      auto x = randn(rows * dim, dim), w = randn(dim, 2 * dim);
      auto [g1, l1] = both(level, [&] {
        std::vector<float> y(x.size());
        rms_norm(x.data(), w.data(), rows, dim, 1e-6f, y.data());
        return y;
      });
      EXPECT_LT(rel_err(l1, g1), kTol) << isa_name(level) << " rms_norm " << dim;
      auto [g2, l2] = both(level, [&] {
        std::vector<float> gate_up = randn(rows * 2 * dim, 3 * dim, 4.0f), out(rows * dim);
        silu_mul(gate_up.data(), rows, dim, out.data());
        return out;
      });
      EXPECT_LT(rel_err(l2, g2), kTol) << isa_name(level) << " silu_mul " << dim;
      auto [g3, l3] = both(level, [&] {
        std::vector<float> s = randn(dim, 5 * dim, 3.0f);
        softmax_inplace(s.data(), dim);
        std::vector<float> y = randn(dim, 6);
        add_inplace(y.data(), s.data(), dim);
        return y;
      });
      EXPECT_LT(rel_err(l3, g3), kTol) << isa_name(level) << " softmax/add " << dim;
      if (dim % 2 == 0) {
        std::vector<int32_t> positions = {0, 3, 17, 1000, 5};
        auto [g4, l4] = both(level, [&] {
          std::vector<float> r = randn(5 * 3 * dim, 8);
          rope(r.data(), positions.data(), 5, 3, dim, 1e6);
          return r;
        });
        EXPECT_LT(rel_err(l4, g4), kTol) << isa_name(level) << " rope " << dim;
      }
    }
    // Gate and combine at odd sizes.
    const int64_t T = 11, E = 6, K = 2, h = 19;
    auto logits = randn(T * E, 4), xs = randn(T * h, 5);
    auto [g5, l5] = both(level, [&] {
      RoutedBatch r;
      fused_gate(logits.data(), T, E, K, true, nullptr, 0, xs.data(), h, &r);
      std::vector<float> results = randn(r.rows() * h, 6), out(T * h, 0.5f);
      moe_combine(r, results.data(), out.data());
      return out;
    });
    EXPECT_LT(rel_err(l5, g5), kTol) << isa_name(level) << " gate + combine";
  }
}

// The sampler's kernels at every level this CPU runs, against a scalar
// reference: exp_scaled within the vector exp's error (and -infinity, a
// suppressed token, exactly 0 with no weight), argmax exactly (the first
// largest; ties inside and across vectors, a maximum in the tail, NaNs that
// must not win, all -infinity, all NaN).
TEST_F(LevelsTest, SamplerKernelsAtEveryLevel) {
  const float ninf = -std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const IsaLevel saved = active_isa();
  for (IsaLevel level : levels_here()) {
    ASSERT_TRUE(force_isa(level).ok());
    for (int64_t n : {1, 7, 16, 63, 64, 65, 130, 4096 + 5}) {
      std::vector<float> x = randn(n, 31 + n, 3.0f);
      x[n / 3] = ninf;
      std::vector<float> out(n, -1.f);
      const float shift = 2.5f, scale = 1.0f / 0.7f;
      const double sum = exp_scaled(x.data(), n, shift, scale, out.data());
      double want_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp((static_cast<double>(x[i]) - shift) * scale);
        want_sum += want;
        EXPECT_NEAR(out[i], want, 2e-6 * want) << isa_name(level) << " n " << n << " i " << i;
      }
      EXPECT_EQ(out[n / 3], 0.f) << isa_name(level) << " n " << n;
      EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << isa_name(level) << " n " << n;
      // argmax: random values, then the same with the largest tied at two
      // places, in the tail, and behind NaNs.
      for (int trial = 0; trial < 6; ++trial) {
        std::vector<float> v = randn(n, 97 * n + trial, 2.0f);
        if (trial == 1 && n > 1) v[n - 1] = v[0] = 100.f;
        if (trial == 2) v[n - 1] = 100.f;
        if (trial == 3) {
          for (int64_t i = 0; i < n; i += 2) v[i] = nan;
        }
        if (trial == 4) std::fill(v.begin(), v.end(), ninf);
        if (trial == 5) std::fill(v.begin(), v.end(), nan);
        int64_t want = 0;
        float m = ninf;
        bool found = false;
        for (int64_t i = 0; i < n; ++i) {
          if (v[i] > m || (!found && v[i] == m)) {
            m = v[i];
            want = i;
            found = true;
          }
        }
        EXPECT_EQ(argmax(v.data(), n), want) << isa_name(level) << " n " << n << " trial " << trial;
      }
    }
    EXPECT_EQ(argmax(nullptr, 0), 0) << isa_name(level);
    EXPECT_EQ(exp_scaled(nullptr, 0, 0.f, 1.f, nullptr), 0.0) << isa_name(level);
  }
  ASSERT_TRUE(force_isa(saved).ok());
}

TEST(IsaTest, NamesParseAndForcingAboveTheCpuIsRefused) {
  for (IsaLevel l : all_isa_levels()) {
    auto p = parse_isa(isa_name(l));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, l);
  }
  EXPECT_FALSE(parse_isa("avx3").ok());
  EXPECT_FALSE(parse_isa("").ok());
  EXPECT_TRUE(isa_supported(IsaLevel::kGeneric));
  EXPECT_LE(active_isa(), detected_isa());
  const IsaLevel saved = active_isa();
  for (IsaLevel l : all_isa_levels()) {
    Status s = force_isa(l);
    EXPECT_EQ(s.ok(), isa_supported(l)) << isa_name(l);
    if (!s.ok()) {
      EXPECT_NE(s.message().find("not available"), std::string::npos) << s.message();
      // Packing for a level the CPU cannot run is an error too, never a crash.
      bf16 one = float_to_bf16(1.0f);
      EXPECT_FALSE(PackedLinear::pack(&one, 1, 1, WeightFormat::kBf16, l).ok());
    }
  }
  ASSERT_TRUE(force_isa(saved).ok());
  EXPECT_FALSE(parse_weight_format("int4").ok());
  EXPECT_EQ(*parse_weight_format("int8"), WeightFormat::kInt8);
  EXPECT_EQ(*parse_weight_format("w8a8"), WeightFormat::kW8A8);
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kInt8, WeightFormat::kW8A8}) {
    EXPECT_EQ(*parse_weight_format(weight_format_name(f)), f);
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu
