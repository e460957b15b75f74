// Dense GEMMs of the CPU backend: y[M, N] = x[M, K] · W^T with W [N, K] in
// PyTorch Linear layout (out_features x in_features). Numerics: inputs rounded
// to bf16, fp32 accumulation, fp32 output.
//
// PackedLinear holds W in oneDNN's packed bf16 layout (chosen once by the
// matmul primitive; measured to be the same for every M on oneDNN 2.6), which
// streams weights at full memory bandwidth at M = 1. Primitives are created per
// (N, K, M bucket) and cached; M is bucketed (powers of two up to 64, then
// multiples of 64) and padded, so a serving loop creates only a few.
// Thread safety: forward() may be called from several threads; oneDNN runs
// each call on the OpenMP thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/core/status.h"

namespace msinfer::kernels::cpu {

class PackedLinear {
 public:
  PackedLinear() = default;
  // Copies and packs W [n, k] (row-major bf16).
  static StatusOr<PackedLinear> pack(const bf16* w, int64_t n, int64_t k);

  // y[m, n] = round_bf16(x[m, k]) · W^T. m may be 0.
  void forward(const float* x, int64_t m, float* y) const;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  size_t bytes() const;  // packed weight bytes
  bool empty() const { return n_ == 0; }

 private:
  int64_t n_ = 0, k_ = 0;
  std::shared_ptr<void> impl_;  // oneDNN memory with the packed weights
};

// The plain reference: a triple loop in float over bf16 inputs (double accumulation).
void linear_reference(const bf16* w, int64_t n, int64_t k, const float* x, int64_t m, float* y);

// M padded to the bucket PackedLinear uses.
int64_t gemm_m_bucket(int64_t m);

}  // namespace msinfer::kernels::cpu
