// AVX-512 helpers for the CPU kernels (private). Compiled in when the kernels
// are built for a CPU with AVX-512 (MSINFER_NATIVE on such a machine); every
// user has a scalar path for other builds.
#pragma once

#include <cmath>
#include <cstdint>

#include "msinfer/core/bf16.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define MSINFER_HAVE_AVX512 1
#endif

namespace msinfer::kernels::cpu::internal {

#if defined(MSINFER_HAVE_AVX512)

// exp(x) for 16 floats: range reduction x = n ln2 + r, |r| <= ln2/2, degree-6
// polynomial (Cephes expf coefficients), scaling by 2^n. Max relative error
// ~2e-7 over [-87, 88]; saturates to 0 / inf outside.
inline __m512 exp512(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447504f);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// 16 bf16 values to floats.
inline __m512 load_bf16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#endif

// Floats to bf16, round to nearest even (vcvtneps2bf16 where available).
inline void to_bf16(const float* in, bf16* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)v);
  }
#endif
  for (; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

}  // namespace msinfer::kernels::cpu::internal
