#include "msinfer/kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "internal/vec.h"

namespace msinfer::kernels::cpu {

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) {
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          double theta) {
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim);
  }
#pragma omp parallel for if (tokens * heads * head_dim > 65536)
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> c(half), s(half);
    for (int64_t i = 0; i < half; ++i) {
      // HF computes the angle in fp32: float(pos) * float(inv_freq).
      const float angle = static_cast<float>(positions[t]) * static_cast<float>(inv_freq[i]);
      c[i] = std::cos(angle);
      s[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void silu_mul(const float* gate_up, int64_t rows, int64_t f, float* out) {
#pragma omp parallel for if (rows * f > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * f;
    const float* u = g + f;
    float* o = out + r * f;
    int64_t j = 0;
#if defined(MSINFER_HAVE_AVX512)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= f; j += 16) {
      const __m512 gv = _mm512_loadu_ps(g + j);
      const __m512 e = internal::exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
      const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
      _mm512_storeu_ps(o + j, _mm512_mul_ps(s, _mm512_loadu_ps(u + j)));
    }
#endif
    for (; j < f; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax_inplace(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace msinfer::kernels::cpu
