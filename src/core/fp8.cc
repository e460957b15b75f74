#include "msinfer/core/fp8.h"

#include <cmath>

namespace msinfer {

uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  // The 127 non-negative finite codes 0x00..0x7e are increasing in value:
  // binary search for the nearest, ties to the even code (even mantissa).
  int lo = 0, hi = 0x7e;
  if (a >= e4m3_to_float(0x7e)) return sign | 0x7e;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (e4m3_to_float(static_cast<uint8_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid;
  }
  const float dl = a - e4m3_to_float(static_cast<uint8_t>(lo));
  const float dh = e4m3_to_float(static_cast<uint8_t>(hi)) - a;
  const int code = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | code);
}

}  // namespace msinfer
