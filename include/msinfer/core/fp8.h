// float8 e4m3fn (torch.float8_e4m3fn, the OCP "E4M3" of DeepSeek-V3's
// checkpoints) to and from float: 1 sign bit, 4 exponent bits (bias 7), 3
// mantissa bits; no infinities; S.1111.111 is NaN; largest finite 448;
// subnormals m/8 * 2^-6.
#pragma once

#include <cstdint>

namespace msinfer {

inline float e4m3_to_float(uint8_t v) {
  const int exp = (v >> 3) & 0xf, mant = v & 0x7;
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  if (exp == 0xf && mant == 0x7) return __builtin_nanf("");
  if (exp == 0) return sign * static_cast<float>(mant) * (1.0f / 512.0f);  // m/8 * 2^-6
  return sign * (1.0f + static_cast<float>(mant) / 8.0f) *
         static_cast<float>(exp >= 7 ? (1 << (exp - 7)) : 1.0 / (1 << (7 - exp)));
}

// Nearest e4m3fn value, ties to even mantissa (as PyTorch's cast); NaN stays
// NaN; finite values beyond 448 saturate to +-448 (PyTorch gives NaN there:
// callers scale into range first).
uint8_t float_to_e4m3(float f);

}  // namespace msinfer
