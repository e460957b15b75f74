// Public entry points of the element-wise kernels: the active level's
// versions (internal/portable.inc, internal/simd.inc).
#include "msinfer/kernels/cpu/ops.h"

#include "internal/level.h"

namespace msinfer::kernels::cpu {

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) {
  internal::active_kernels().rms_norm(x, w, rows, dim, eps, y);
}

void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          double theta) {
  internal::active_kernels().rope(x, positions, tokens, heads, head_dim, theta);
}

void silu_mul(const float* gate_up, int64_t rows, int64_t f, float* out) {
  internal::active_kernels().silu_mul(gate_up, rows, f, out);
}

void add_inplace(float* y, const float* x, int64_t n) {
  internal::active_kernels().add_inplace(y, x, n);
}

void softmax_inplace(float* x, int64_t n) { internal::active_kernels().softmax_inplace(x, n); }

int64_t argmax(const float* x, int64_t n) { return internal::active_kernels().argmax(x, n); }

double exp_scaled(const float* x, int64_t n, float shift, float scale, float* out) {
  return internal::active_kernels().exp_scaled(x, n, shift, scale, out);
}

}  // namespace msinfer::kernels::cpu
