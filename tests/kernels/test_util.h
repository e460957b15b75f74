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
