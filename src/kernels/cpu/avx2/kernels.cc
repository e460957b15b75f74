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
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace msinfer::kernels::cpu::internal::avx2 {

#include "../internal/portable.inc"

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
  static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  // The first lane where a == b, or -1.
  static int first_equal(reg a, reg b) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    return mask ? __builtin_ctz(static_cast<unsigned>(mask)) : -1;
  }
  // v where a >= limit, else 0 (and where a is NaN).
  static reg zero_below(reg a, reg limit, reg v) {
    return _mm256_and_ps(v, _mm256_cmp_ps(a, limit, _CMP_GE_OQ));
  }
  static reg round(reg x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg fnma(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
  // w8a8's integer operations (simd.inc, w8a8_direct).
  using ireg = __m256i;
  static ireg izero() { return _mm256_setzero_si256(); }
  static ireg iload(const int8_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  }
  static ireg iloadu(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static void istoreu(int32_t* p, ireg v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static ireg ibcast(const int32_t* p) { return _mm256_set1_epi32(*p); }
  static ireg iabs8(ireg w) { return _mm256_abs_epi8(w); }
  static ireg isign8(ireg x, ireg w) { return _mm256_sign_epi8(x, w); }  // x * sign(w)
  // acc + the sums of each 4 u x s byte products (u unsigned, s signed).
  static ireg idot(ireg acc, ireg u, ireg s) {
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  // 2^n for integral n in [-126, 127], built in the exponent bits.
  static reg pow2(reg n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
};

// 6 rows x 16 columns: 12 accumulators, 2 weight vectors and a broadcast fit
// the 16 ymm registers.
constexpr int64_t kRows = 6;
constexpr int kAccRegs = 12;
// w8a8: 3 rows x 16 columns, 6 int32 accumulators; the two weight vectors,
// their absolute values, the broadcast, the ones and temporaries take the
// rest. At 4 rows GCC 12 kept two accumulators on the stack (a load and a
// store per step each), and 3 rows measured as fast or faster
// (docs/benchmarks-history.md).
constexpr int64_t kW8Rows = 3;

constexpr bool kDotBf16 = false;  // no vdpbf16ps at this level

// mxfp4: this level's own layout and kernel (internal/mxfp4_avx2.inc).
#define MSINFER_MXFP4_AVX2
#include "../internal/simd.inc"
#undef MSINFER_MXFP4_AVX2

constexpr IsaLevel kLevel = IsaLevel::kAvx2;
#include "../internal/level_table.inc"

}  // namespace msinfer::kernels::cpu::internal::avx2

#pragma GCC pop_options
