// bfloat16 and float16 storage types with conversions to and from float.
// float -> bf16 rounds to nearest even (NaN stays NaN), as PyTorch does.
#pragma once

#include <cstdint>
#include <cstring>

namespace msinfer {

struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// Rounds a float to the nearest bf16 value and back (what a bf16 GEMM input sees).
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// IEEE half to float (subnormals, inf and NaN included).
inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Float to IEEE half, round to nearest even; overflow gives inf, NaN stays NaN.
uint16_t float_to_f16(float f);

void bf16_to_float_n(const bf16* in, float* out, int64_t n);
void float_to_bf16_n(const float* in, bf16* out, int64_t n);

}  // namespace msinfer
