#include "msinfer/core/bf16.h"

namespace msinfer {

void bf16_to_float_n(const bf16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void float_to_bf16_n(const float* in, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

}  // namespace msinfer
