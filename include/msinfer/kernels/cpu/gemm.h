// Dense GEMMs of the CPU backend: y[M, N] = x[M, K] · W^T with W [N, K] in
// PyTorch Linear layout (out_features x in_features). Numerics: inputs rounded
// to bf16, fp32 accumulation, fp32 output.
//
// PackedLinear holds W packed once, at load, in the layout of the kernel level
// that will run it (isa.h):
//   generic, avx2, avx512  panels of P columns (P = 16, 16, 32), K innermost:
//                          panel p holds W[pP .. pP+P-1, :] as [K][P] elements,
//                          the last panel zero-padded. bf16 stays bf16 (decode
//                          streams it); int8 adds one fp32 scale per row.
//   avx512bf16             panels of 32 columns in pairs of K, [ceil(K/2)][32][2]
//                          (the layout vdpbf16ps reads), bf16 and int8.
//   amx                    bf16: oneDNN's packed layout (chosen by its matmul
//                          primitive, the same for every M on oneDNN 2.6);
//                          int8: avx512bf16's pairs.
// int8 weights are symmetric per output row: q = round(w / s), s = max|w_row| / 127
// (docs/ENGINE.md has the accuracy check and the alternatives measured).
// w8a8 stores the same int8 weights in panels of [ceil(K/4)][P][4] (four k
// steps of a column side by side, the layout of an 8-bit dot product), and
// forward() quantises each row of x the same way (symmetric, one scale per
// row, from fp32, quantize_int8_activations) and sums q_x · q_w in int32:
// y = float(sum) · (s_x · s_w). Integer sums are exact, so every level gives
// the same bits, and a row gives the same bits alone or in any batch.
// mxfp4 (OCP microscaling FP4, gpt-oss's experts) keeps the checkpoint's 4-bit
// values: W[j][t] = e2m1(code) * 2^(e - 127), one e8m0 byte e per 32 values
// of a row (K a multiple of 32). Packed by pack_mxfp4 from the checkpoint's
// row-major blocks, at every level in panels of P columns (P as above; 32 at
// avx512bf16 and amx, which run the avx512 kernel), block by block of 32 k:
// panel p, block b is 17 P bytes at (p * K / 32 + b) * 17 P: the P scale
// bytes, then 32 k steps of P / 2 bytes, byte c of a step holding column c in
// its low nibble and column c + P / 2 in its high one (columns past n: code 0,
// scale 127); avx2 keeps a panel's 17 P K / 32 bytes in its own order (its
// blocks' codes, then their scales: src/kernels/cpu/internal/mxfp4_avx2.inc).
// forward() decodes in registers (a 16-entry table of the e2m1 values, with
// the column's 2^(e - 127): exact, the same float as the bf16 decode) and runs
// the bf16 panel kernel's FMAs in the same order, so at the
// generic, avx2 and avx512 levels y is bit for bit what the decoded weights
// packed as bf16 give; at avx512bf16 and amx (whose bf16 kernel is
// vdpbf16ps) it equals them up to float rounding.
// Thread safety: forward() may be called from several threads; each call runs
// on the OpenMP thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "msinfer/core/bf16.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/isa.h"

namespace msinfer::kernels::cpu {

// kInt8: int8 weights, activations as for bf16. kW8A8: int8 weights and int8
// activations (quantised per row on each call), for K up to kW8A8MaxK.
// kMxfp4: MXFP4 weights kept 4-bit (pack_mxfp4 only; as a load option it
// applies to an MXFP4 checkpoint's experts, every other GEMM staying bf16).
enum class WeightFormat { kBf16 = 0, kInt8 = 1, kW8A8 = 2, kMxfp4 = 3 };
constexpr int64_t kW8A8MaxK = 65536;
constexpr int64_t kMxfp4Block = 32;              // values per e8m0 scale
const char* weight_format_name(WeightFormat f);  // "bf16" | "int8" | "w8a8" | "mxfp4"
StatusOr<WeightFormat> parse_weight_format(std::string_view name);

namespace internal {
struct GemmWeights;
}

class PackedLinear {
 public:
  PackedLinear() = default;
  // Copies W [n, k] (row-major bf16) into the layout of `level` (by default the
  // active one), quantising it for kInt8. An error for an empty weight or a
  // level this CPU cannot run.
  static StatusOr<PackedLinear> pack(const bf16* w, int64_t n, int64_t k,
                                     WeightFormat format = WeightFormat::kBf16);
  static StatusOr<PackedLinear> pack(const bf16* w, int64_t n, int64_t k, WeightFormat format,
                                     IsaLevel level);
  // MXFP4 W [n, k] kept 4-bit (format kMxfp4): blocks [n][k / 32][16] bytes
  // (value 2i of a block in byte i's low nibble, 2i + 1 in its high one) and
  // scales [n][k / 32] e8m0 bytes, the checkpoint's layout. Copied; an error
  // for k not a multiple of 32, a scale of 255 (e8m0's NaN) or an unavailable level.
  static StatusOr<PackedLinear> pack_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t n,
                                           int64_t k);
  static StatusOr<PackedLinear> pack_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t n,
                                           int64_t k, IsaLevel level);

  // y[m, n] = round_bf16(x[m, k]) · W^T (w8a8: quantised x, see above), by the
  // kernels of the level it was packed for. m may be 0.
  void forward(const float* x, int64_t m, float* y) const;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  size_t bytes() const;  // packed weight bytes (scales included)
  bool empty() const { return n_ == 0; }
  IsaLevel level() const;
  WeightFormat format() const;

 private:
  int64_t n_ = 0, k_ = 0;
  std::shared_ptr<const internal::GemmWeights> impl_;
};

// The plain reference: a triple loop in float over bf16 inputs (double accumulation).
void linear_reference(const bf16* w, int64_t n, int64_t k, const float* x, int64_t m, float* y);

// One MXFP4 block: 32 values from its 16 bytes and e8m0 scale byte: value 2i
// is e2m1(bytes[i] & 15) * 2^(scale - 127), value 2i + 1 the same of the high
// nibble (e2m1 codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 their
// negatives). Exact in bf16 for every scale byte but 255 (e8m0's NaN).
void mxfp4_decode_block(const uint8_t* bytes16, uint8_t scale, bf16* out32);

// What kInt8 stores for W [n, k]: q [n, k] and scale [n] with W ≈ q · scale.
void quantize_int8_rows(const bf16* w, int64_t n, int64_t k, int8_t* q, float* scale);

// What w8a8's forward() makes of one row of x [k]: q [k] and *scale with
// x ≈ q · scale; symmetric, s = max|x| / 127, q = round-to-nearest-even(x · (127 /
// max|x|)); an all-zero row gets q = 0, s = 1. One function for every level, so
// that they all quantise to the same bytes.
void quantize_int8_activations(const float* x, int64_t k, int8_t* q, float* scale);

// M padded to the bucket the oneDNN levels use: powers of two up to 64, then
// multiples of 64 (one primitive per bucket).
int64_t gemm_m_bucket(int64_t m);

}  // namespace msinfer::kernels::cpu
