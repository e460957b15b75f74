// The avx2 level: AVX2 + FMA + F16C (Haswell and later, AMD Zen 1-3). oneDNN
// 2.6 has no bf16 GEMM here, so GEMMs are msinfer's panel kernels
// (internal/simd.inc) with bf16 widened by zero extension and a shift.
//
// The target is set with a pragma after every header is included, so that
// inline functions and templates of shared headers (std::, msinfer core) are
// never compiled with AVX2 in this file: the linker could otherwise keep that
// copy for every caller and a CPU without AVX2 would fault. Only the code
// below, in namespace internal::avx2, uses AVX2.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace msinfer::kernels::cpu::internal::avx2 {

#include "../internal/portable.inc"

// Sums of 8 vectors of 8 floats: out[j] = sum(v[j][0..8)).
inline void reduce8_avx(const float (*v)[8], float* out) {
  __m256 r[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_load_ps(v[j]);
  const __m256 t0 = _mm256_hadd_ps(r[0], r[1]), t1 = _mm256_hadd_ps(r[2], r[3]);
  const __m256 t2 = _mm256_hadd_ps(r[4], r[5]), t3 = _mm256_hadd_ps(r[6], r[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  _mm256_store_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                     _mm256_permute2f128_ps(u0, u1, 0x31)));
}

struct V {
  using reg = __m256;
  static constexpr int64_t kLanes = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float v) { return _mm256_set1_ps(v); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static float reduce_max(reg v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  // 8 bf16 -> floats: zero-extend to 32 bits, shift into the high half.
  static reg load_bf16(const bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static reg load_i8(const int8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  static float reduce_add(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static __m256 fold8(reg v) { return v; }
  static void store8(float* p, __m256 v) { _mm256_store_ps(p, v); }
  static void reduce8(const float (*v)[8], float* out) { reduce8_avx(v, out); }
  // exp(x): x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial (Cephes expf
  // coefficients), 2^n built in the exponent bits. Relative error ~2e-7 on
  // [-87, 88]; clamped outside (0 below, exp(88) above).
  static reg exp(reg x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
};

// 6 rows x 16 columns: 12 accumulators, 2 weight vectors and a broadcast fit
// the 16 ymm registers.
constexpr int64_t kRows = 6;
constexpr int kAccRegs = 12;

#include "../internal/simd.inc"

constexpr IsaLevel kLevel = IsaLevel::kAvx2;
#include "../internal/level_table.inc"

}  // namespace msinfer::kernels::cpu::internal::avx2

#pragma GCC pop_options
