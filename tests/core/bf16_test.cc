#include "msinfer/core/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace msinfer {
namespace {

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_to_float(bf16{0x3f80}), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 and 1.015625: ties to even (1.015625).
  EXPECT_EQ(float_to_bf16(1.01171875f).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(round_to_bf16(-2.0f), -2.0f);
}

TEST(F16Test, RoundTripsEveryHalf) {
  // Every finite half converts to float and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    const float f = f16_to_float(static_cast<uint16_t>(h));
    EXPECT_EQ(float_to_f16(f), h) << std::hex << h << " " << f;
  }
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);                    // overflow to inf
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

}  // namespace
}  // namespace msinfer
