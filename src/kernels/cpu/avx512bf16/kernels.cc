// The avx512bf16 level (also what the amx level runs: oneDNN picks AMX itself
// when allowed, see onednn_gemm.cc): bf16 GEMMs through oneDNN's packed
// weights; int8 GEMMs and every other kernel are the avx512 level's; floats
// to bf16 with vcvtneps2bf16 (round to nearest even, as float_to_bf16).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

// Attention scores q.K as bf16 dot products: internal/simd.inc instantiated
// for AVX-512 with kDotBf16 (its other kernels are the avx512 level's, which
// this level takes; only paged_attention is used from here).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16")
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace msinfer::kernels::cpu::internal::avx512bf16::simd {
#include "../internal/portable.inc"
#include "../internal/avx512_vec.inc"
constexpr int64_t kRows = 12;
constexpr int kAccRegs = 24;
constexpr bool kDotBf16 = true;
#include "../internal/simd.inc"
}  // namespace msinfer::kernels::cpu::internal::avx512bf16::simd
#pragma GCC pop_options

namespace msinfer::kernels::cpu::internal::avx512bf16 {
namespace {

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void to_bf16(const float* in,
                                                                               bf16* out,
                                                                               int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)v);
  }
  for (; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

Status pack(const bf16* w, int64_t n, int64_t k, WeightFormat format, GemmWeights* out) {
  if (format == WeightFormat::kInt8) return avx512::kernels().pack(w, n, k, format, out);
  return onednn_pack(w, n, k, out);
}

void forward(const GemmWeights& w, const float* x, int64_t m, float* y) {
  if (w.onednn) return onednn_forward(w, x, m, y);
  avx512::kernels().forward(w, x, m, y);
}

}  // namespace

const LevelKernels& kernels() {
  static const LevelKernels k = [] {
    LevelKernels t = avx512::kernels();
    t.level = IsaLevel::kAvx512Bf16;
    t.pack = pack;
    t.forward = forward;
    t.to_bf16 = to_bf16;
    t.paged_attention = simd::paged_attention;
    return t;
  }();
  return k;
}

}  // namespace msinfer::kernels::cpu::internal::avx512bf16
