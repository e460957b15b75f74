#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "msinfer/core/bf16.h"

namespace msinfer::kernels::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<bf16> randn_bf16(size_t n, uint64_t seed, float scale = 1.0f) {
  auto f = randn(n, seed, scale);
  std::vector<bf16> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = float_to_bf16(f[i]);
  return b;
}

// A random MXFP4 weight [n, k] (k a multiple of 32) in the checkpoint's
// layout: blocks [n][k / 32][16] of random e2m1 pairs, scales [n][k / 32]
// drawn around 2^0 (120..131, so outputs stay O(1)), with row 0's first
// block at e8m0 0 (2^-127: denormal values) where there is one.
struct Mxfp4Weight {
  std::vector<uint8_t> blocks, scales;
};
inline Mxfp4Weight random_mxfp4(int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Mxfp4Weight w;
  w.blocks.resize(static_cast<size_t>(n * k / 2));
  w.scales.resize(static_cast<size_t>(n * k / 32));
  for (auto& b : w.blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : w.scales) s = static_cast<uint8_t>(120 + rng() % 12);
  if (!w.scales.empty()) w.scales[0] = 0;
  return w;
}

// max |a - b| / (max |b| + tiny)
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return num / den;
}

}  // namespace msinfer::kernels::testing
