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
enum class WeightFormat { kBf16 = 0, kInt8 = 1, kW8A8 = 2 };
constexpr int64_t kW8A8MaxK = 65536;
const char* weight_format_name(WeightFormat f);  // "bf16" | "int8" | "w8a8"
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
