// The avx512bf16 level (AVX512-BF16 and AVX512-VNNI): bf16 and int8 GEMMs as
// vdpbf16ps over weights packed in pairs of K (below); w8a8 as vpdpbusd; every
// other kernel is the avx512 level's, except
// attention scores as bf16 dot products; floats to bf16 with
// vcvtneps2bf16 (round to nearest even, as float_to_bf16). The amx level runs
// the same kernels but its bf16 GEMMs through oneDNN, which uses AMX tiles
// (onednn_gemm.cc).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

// Attention scores q.K as bf16 dot products and w8a8 with vpdpbusd:
// internal/simd.inc instantiated for AVX-512 with kDotBf16 and
// MSINFER_W8A8_VNNI (its other kernels are the avx512 level's, which this
// level takes; only paged_attention and w8a8's pack and forward are used from
// here).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16,avx512vnni")
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// w8a8 with vpdpbusd (isa.cc gives this level only to CPUs with AVX512-VNNI).
#define MSINFER_W8A8_VNNI 1
namespace msinfer::kernels::cpu::internal::avx512bf16::simd {
// portable.inc first, as in the other level files.
// clang-format off
#include "../internal/portable.inc"
#include "../internal/avx512_vec.inc"
// clang-format on
constexpr int64_t kRows = 12;
constexpr int kAccRegs = 24;
constexpr int64_t kW8Rows = 8;  // w8a8 (vpdpbusd): 16 int32 accumulators (12 measured the same)
constexpr bool kDotBf16 = true;
#include "../internal/simd.inc"
}  // namespace msinfer::kernels::cpu::internal::avx512bf16::simd
#undef MSINFER_W8A8_VNNI
#pragma GCC pop_options

namespace msinfer::kernels::cpu::internal::avx512bf16 {
namespace {

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void to_bf16(const float* in,
                                                                             bf16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)v);
  }
  for (; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

// bf16 GEMM in pairs of K. A panel holds 32 output columns as [ceil(K/2)]
// [32][2] bf16: for each pair of k steps, column c's two weights side by side
// in one dword, the layout vdpbf16ps multiplies. x is packed the same way per
// row (x[2t], x[2t+1] in one dword), into tiles of kRows rows: [pairs][kRows].
// One instruction then does 16 columns x 2 k steps, where widening bf16 to
// fp32 takes a load, a zero extension, a shift and an FMA per 16 x 1.
//  - m <= kRows: each thread streams whole panels once (decode: bound by
//    memory bandwidth); prefetches every line kPrefetchBytes ahead.
//  - m > kRows: a work item is (panel, chunk of kChunkRows rows); it runs the
//    same kRows x 32 block over kKBlock pairs at a time, which stay in L1
//    for all the chunk's row tiles (bound by vdpbf16ps throughput).
// Odd K is padded with a zero weight (and x's pad is zero too).
//
// int8 weights (symmetric, one fp32 scale per output column, as every level
// quantises them) use the same [ceil(K/2)][32][2] layout in int8, 64 bytes per
// pair step; each step widens them to bf16 in registers (sign-extend, convert
// to fp32, vcvtne2ps2bf16: exact, |q| <= 127 needs 7 bits) and runs the same
// vdpbf16ps; the scale multiplies the finished sums. Against the avx512
// panels' fp32 FMAs this is ~0.6x the instructions per row tile (10 to widen
// 64 weights, then 2 per row, against 8 and 4 per row), which is what large
// batches of int8 experts are bound by.
namespace dp {

constexpr int64_t kPanel = 32;
constexpr int64_t kRows = 12;  // 24 zmm accumulators
constexpr int64_t kChunkRows = kRows * 16;
constexpr int64_t kPrefetchBytes = 4096;

int64_t pairs(int64_t k) { return (k + 1) / 2; }

// Bytes of one pair step of a panel, and pair steps per 16 KiB block in L1.
template <typename W>
constexpr int64_t kStepBytes = kPanel * 2 * static_cast<int64_t>(sizeof(W));
template <typename W>
constexpr int64_t kKBlock = 16384 / kStepBytes<W>;

// src [n][k] (bf16, or int8 from quantize_int8_rows) into 32-column panels of
// [ceil(k/2)][32][2], zero-padded past n and k.
template <typename W>
Status pack_pairs(const W* src, int64_t n, int64_t k, GemmWeights* out) {
  out->n = n;
  out->k = k;
  out->panel = kPanel;
  out->panels = (n + kPanel - 1) / kPanel;
  const int64_t kp = pairs(k);
  MSI_RETURN_IF_ERROR(
      alloc_weight_data(static_cast<size_t>(out->panels * kp * kStepBytes<W>), out));
  W* dst = reinterpret_cast<W*>(out->data.get());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = j / kPanel, c = j % kPanel;
    W* panel = dst + p * kp * kPanel * 2;
    for (int64_t t = 0; t < k; ++t) panel[((t / 2) * kPanel + c) * 2 + (t & 1)] = src[j * k + t];
  }
  return ok_status();
}

Status pack(const bf16* w, int64_t n, int64_t k, WeightFormat format, GemmWeights* out) {
  if (format == WeightFormat::kW8A8) return simd::pack(w, n, k, format, out);  // avx512's w8a8
  out->format = format;
  if (format == WeightFormat::kBf16) return pack_pairs(w, n, k, out);
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  out->scale.assign(static_cast<size_t>((n + kPanel - 1) / kPanel * kPanel), 0.f);
  quantize_int8_rows(w, n, k, q.data(), out->scale.data());
  return pack_pairs(q.data(), n, k, out);
}

// One pair step of 32 columns as two bf16 vectors of [16][2].
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void load_step(
    const bf16* wp, __m512bh* w0, __m512bh* w1) {
  *w0 = (__m512bh)_mm512_load_si512(wp);
  *w1 = (__m512bh)_mm512_load_si512(wp + 32);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline __m512bh widen16(
    __m128i lo, __m128i hi) {
  const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
  const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
  return _mm512_cvtne2ps_pbh(b, a);  // a in the low half: columns 0-7, then 8-15
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void load_step(
    const int8_t* wp, __m512bh* w0, __m512bh* w1) {
  // Four 16-byte loads that vpmovsxbd takes as its memory operand (no
  // extracts from one 64-byte load).
  const __m128i* q = reinterpret_cast<const __m128i*>(wp);
  *w0 = widen16(_mm_load_si128(q), _mm_load_si128(q + 1));
  *w1 = widen16(_mm_load_si128(q + 2), _mm_load_si128(q + 3));
}

// c[r * 32 + :] (+)= x[r] . W for rows r < R over pairs [0, np) of one panel
// (w: [np][32][2]); xt: a packed x tile at the same first pair, `xs` dwords
// per pair (kRows, or m on the direct path). One
// accumulator chain per 16 columns and row, in k order: a row's result is
// the same bits whatever m, its place in the batch, or the K blocking (the
// blocks continue the chain through c), so a request's tokens do not depend
// on what else is batched with it. One chain is also fast enough: at one row
// a vdpbf16ps latency per 128 bytes (64 in int8) is far above the memory
// stream.
template <int R, typename W>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void block(
    const W* w, int64_t np, const uint32_t* xt, int64_t xs, float* c, bool first) {
  __m512 a0[R], a1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    a0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * kPanel);
    a1[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * kPanel + 16);
  }
  for (int64_t t = 0; t < np; ++t) {
    const W* wp = w + t * kPanel * 2;
    const char* line = reinterpret_cast<const char*>(wp) + kPrefetchBytes;
    __builtin_prefetch(line);
    if constexpr (kStepBytes<W> != 64) __builtin_prefetch(line + 64);
    __m512bh w0, w1;
    load_step(wp, &w0, &w1);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xt[t * xs + r]));
      a0[r] = _mm512_dpbf16_ps(a0[r], xv, w0);
      a1[r] = _mm512_dpbf16_ps(a1[r], xv, w1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * kPanel, a0[r]);
    _mm512_storeu_ps(c + r * kPanel + 16, a1[r]);
  }
}

template <int R = static_cast<int>(kRows), typename W>
inline void block_n(int64_t rows, const W* w, int64_t np, const uint32_t* xt, int64_t xs, float* c,
                    bool first) {
  if constexpr (R > 0) {
    if (rows == R) return block<R>(w, np, xt, xs, c, first);
    return block_n<R - 1>(rows, w, np, xt, xs, c, first);
  }
}

// The target pragma as well as the attribute: the team's body is a lambda,
// and a lambda does not take its enclosing function's target attribute.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
template <typename W>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void forward_w(const GemmWeights& w,
                                                                               const float* x,
                                                                               int64_t m,
                                                                               float* y) {
  const int64_t K = w.k, N = w.n, kp = pairs(K), tiles = (m + kRows - 1) / kRows;
  // x rounded to bf16 (vcvtneps2bf16: nearest even, as round_bf16_inplace),
  // in pairs, tiles of kRows rows: [tile][kp][kRows], rows past m zero; at
  // m <= kRows one tile of [kp][m] (at one token, just the row).
  const int64_t xs = m <= kRows ? m : kRows;
  thread_local std::vector<uint32_t> xp;
  thread_local std::vector<bf16> row;
  xp.resize(static_cast<size_t>(tiles * kp * xs));
  if (m % xs != 0) std::fill(xp.end() - kp * xs, xp.end(), 0u);
  row.resize(static_cast<size_t>(kp * 2));
  row.back() = bf16{0};  // odd K's pad
  for (int64_t i = 0; i < m; ++i) {
    to_bf16(x + i * K, row.data(), K);
    uint32_t* dst = xp.data() + (i / xs) * kp * xs + i % xs;
    for (int64_t t = 0; t < kp; ++t) {
      std::memcpy(&dst[t * xs], row.data() + 2 * t, sizeof(uint32_t));
    }
  }
  const bool direct = m <= kRows;
  const W* data = reinterpret_cast<const W*>(w.data.get());
  constexpr int64_t kb = kKBlock<W>;
  const uint32_t* xtiles = xp.data();  // xp is this thread's; the team reads it
  simd::for_each_panel_chunk<float, kChunkRows, kPanel>(
      w.panels, m, [&](int64_t p, int64_t m0, int64_t rows, float* cbuf) {
        const W* panel = data + p * kp * kPanel * 2;
        const int64_t cols = std::min(kPanel, N - p * kPanel);
        if (direct) {
          block_n(rows, panel, kp, xtiles, xs, cbuf, true);
        } else {
          for (int64_t t0 = 0; t0 < kp; t0 += kb) {
            const int64_t nb = std::min(kb, kp - t0);
            for (int64_t r = 0; r < rows; r += kRows) {
              const uint32_t* xt = xtiles + ((m0 + r) / kRows * kp + t0) * kRows;
              block_n(std::min(kRows, rows - r), panel + t0 * kPanel * 2, nb, xt, kRows,
                      cbuf + r * kPanel, t0 == 0);
            }
          }
        }
        if constexpr (std::is_same_v<W, int8_t>) {
          const __m512 s0 = _mm512_loadu_ps(w.scale.data() + p * kPanel);
          const __m512 s1 = _mm512_loadu_ps(w.scale.data() + p * kPanel + 16);
          for (int64_t r = 0; r < rows; ++r) {
            float* cr = cbuf + r * kPanel;
            _mm512_storeu_ps(cr, _mm512_mul_ps(_mm512_loadu_ps(cr), s0));
            _mm512_storeu_ps(cr + 16, _mm512_mul_ps(_mm512_loadu_ps(cr + 16), s1));
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(y + (m0 + r) * N + p * kPanel, cbuf + r * kPanel, sizeof(float) * cols);
        }
      });
}
#pragma GCC pop_options

void forward(const GemmWeights& w, const float* x, int64_t m, float* y) {
  // w8a8 and mxfp4: the avx512 kernels (mxfp4's 32-column panels, simd.inc).
  if (w.format == WeightFormat::kW8A8 || w.format == WeightFormat::kMxfp4) {
    return simd::forward(w, x, m, y);
  }
  if (w.format == WeightFormat::kInt8) return forward_w<int8_t>(w, x, m, y);
  forward_w<bf16>(w, x, m, y);
}

}  // namespace dp

// The amx level: bf16 GEMMs through oneDNN (AMX tiles where it finds them).
// int8 weights take the avx512bf16 level's pairs kernel (AMX CPUs have
// AVX512-BF16).
Status amx_pack(const bf16* w, int64_t n, int64_t k, WeightFormat format, GemmWeights* out) {
  if (format != WeightFormat::kBf16) return dp::pack(w, n, k, format, out);
  return onednn_pack(w, n, k, out);
}

void amx_forward(const GemmWeights& w, const float* x, int64_t m, float* y) {
  if (w.onednn) return onednn_forward(w, x, m, y);
  dp::forward(w, x, m, y);
}

}  // namespace

const LevelKernels& kernels() {
  static const LevelKernels k = [] {
    LevelKernels t = avx512::kernels();
    t.level = IsaLevel::kAvx512Bf16;
    t.pack = dp::pack;
    t.pack_mxfp4 = simd::pack_mxfp4;
    t.forward = dp::forward;
    t.to_bf16 = to_bf16;
    t.paged_attention = simd::paged_attention;
    return t;
  }();
  return k;
}

const LevelKernels& amx_kernels() {
  static const LevelKernels k = [] {
    LevelKernels t = kernels();
    t.level = IsaLevel::kAmx;
    t.pack = amx_pack;
    t.forward = amx_forward;
    return t;
  }();
  return k;
}

}  // namespace msinfer::kernels::cpu::internal::avx512bf16
