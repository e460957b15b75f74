#include "msinfer/kernels/cpu/yarn_rope.h"

#include <algorithm>
#include <cmath>

namespace msinfer::kernels::cpu {

std::vector<float> yarn_inv_freq(int64_t dim, double base, double factor,
                                 int64_t original_max_position, double beta_fast, double beta_slow,
                                 bool truncate) {
  const int64_t half = dim / 2;
  std::vector<float> f(half);
  const float fbase = static_cast<float>(base);
  for (int64_t i = 0; i < half; ++i) {
    // float32 as torch computes 1 / base ** (arange(0, dim, 2) / dim).
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[i] = 1.0f / std::pow(fbase, e);
  }
  if (!(factor > 1)) return f;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original_max_position / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::max(std::floor(low), 0.0);
    high = std::min(std::ceil(high), static_cast<double>(dim - 1));
  }
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    // float32 as torch: (arange(dim / 2) - low) / (high - low), clamped to [0, 1].
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float smooth = 1.0f - ramp;
    f[i] = f[i] / static_cast<float>(factor) * (1.0f - smooth) + f[i] * smooth;
  }
  return f;
}

void rope_interleaved(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                      int64_t dim, const float* inv_freq, float mscale) {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float a = pos * inv_freq[i];
      const float c = std::cos(a) * mscale, s = std::sin(a) * mscale;
      for (int64_t hd = 0; hd < heads; ++hd) {
        float* p = x + (t * heads + hd) * dim + 2 * i;
        const float re = p[0], im = p[1];
        p[0] = re * c - im * s;
        p[1] = re * s + im * c;
      }
    }
  }
}

void rope_rotate_half(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                      int64_t dim, const float* inv_freq, float mscale) {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float a = pos * inv_freq[i];
      const float c = std::cos(a) * mscale, s = std::sin(a) * mscale;
      for (int64_t hd = 0; hd < heads; ++hd) {
        float* p = x + (t * heads + hd) * dim;
        const float x1 = p[i], x2 = p[i + half];
        p[i] = x1 * c - x2 * s;
        p[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace msinfer::kernels::cpu
