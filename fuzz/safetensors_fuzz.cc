// libFuzzer target for the safetensors header parser. Built and run by
// fuzz/run (a short run is part of the test suite; see docs/ENGINE.md for a
// longer one).
#include <cstddef>
#include <cstdint>

#include "msinfer/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = msinfer::model::parse_safetensors(data, size, "fuzz");
  if (r.ok()) {
    for (const auto& t : *r) {
      // Touch every byte a view claims, so out-of-bounds views trip ASan.
      uint8_t acc = 0;
      for (size_t i = 0; i < t.bytes; ++i) acc ^= t.data[i];
      volatile uint8_t sink = acc;
      (void)sink;
    }
  }
  return 0;
}
