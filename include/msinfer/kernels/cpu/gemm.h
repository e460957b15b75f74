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
//   avx512bf16, amx        bf16: oneDNN's packed layout (chosen by its matmul
//                          primitive, the same for every M on oneDNN 2.6);
//                          int8: the avx512 panels.
// int8 weights are symmetric per output row: q = round(w / s), s = max|w_row| / 127
// (docs/ENGINE.md has the accuracy check and the alternatives measured).
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

enum class WeightFormat { kBf16 = 0, kInt8 = 1 };
const char* weight_format_name(WeightFormat f);  // "bf16" | "int8"
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

  // y[m, n] = round_bf16(x[m, k]) · W^T, by the kernels of the level it was
  // packed for. m may be 0.
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

// M padded to the bucket the oneDNN levels use: powers of two up to 64, then
// multiples of 64 (one primitive per bucket).
int64_t gemm_m_bucket(int64_t m);

}  // namespace msinfer::kernels::cpu
