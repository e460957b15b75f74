// The avx512 level: AVX-512 F/BW/VL/DQ without BF16 (Skylake-X, Ice Lake), and
// the int8 GEMMs and non-GEMM kernels of the levels above it. GEMMs are the
// panel kernels of internal/simd.inc with 32-column panels. The target is set
// after the headers for the reason given in avx2/kernels.cc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace msinfer::kernels::cpu::internal::avx512 {

#include "../internal/portable.inc"

struct V {
  using reg = __m512;
  static constexpr int64_t kLanes = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float v) { return _mm512_set1_ps(v); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static float reduce_max(reg v) { return _mm512_reduce_max_ps(v); }
  static reg load_bf16(const bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static reg load_i8(const int8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  static float reduce_add(reg v) { return _mm512_reduce_add_ps(v); }
  static __m256 fold8(reg v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static void store8(float* p, __m256 v) { _mm256_store_ps(p, v); }
  static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }
  static reg round(reg x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static reg fnma(reg a, reg b, reg c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
  static reg pow2(reg n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
};

// 12 rows x 32 columns: 24 accumulators of the 32 zmm registers.
constexpr int64_t kRows = 12;
constexpr int kAccRegs = 24;

#include "../internal/simd.inc"

constexpr IsaLevel kLevel = IsaLevel::kAvx512;
#include "../internal/level_table.inc"

}  // namespace msinfer::kernels::cpu::internal::avx512

#pragma GCC pop_options
