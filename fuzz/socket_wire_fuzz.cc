// libFuzzer target for the socket transport's wire parser (hello, headers,
// payloads of one incoming connection: src/comm/internal/socket_wire.h). The
// input is split into chunks of varying size, as recv() would hand it over.
// Built and run by fuzz/run-comm (a short run is part of the test suite).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../src/comm/internal/socket_wire.h"

using msinfer::comm::internal::RegionTable;
using msinfer::comm::internal::WireReader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Two small regions in one allocation with guard bytes between: a write
  // outside a region trips ASan (outside the allocation) or the guard check.
  static std::vector<uint8_t> memory(3 * 256);
  RegionTable regions{{1, {memory.data() + 256, 128}}, {7, {memory.data() + 512, 256}}};
  for (size_t i = 0; i < 256; ++i) memory[i] = memory[384 + i] = 0xa5;
  WireReader in;
  in.secret = "0123456789abcdef0123456789abcdef";
  std::vector<uint32_t> imms;
  if (size == 0) return 0;
  // First byte odd: the stream of a peer that knows the secret (a valid hello
  // is fed first; the rest is headers and payloads). Even: the raw stream,
  // hello included.
  if (data[0] & 1) {
    const std::string hello = std::string("\x25\0\0\0", 4) + in.secret + "hello";
    if (!in.take(reinterpret_cast<const uint8_t*>(hello.data()), hello.size(), regions, &imms)
             .ok()) {
      __builtin_trap();
    }
  }
  size_t i = 1, step = 1;
  while (i < size) {
    const size_t n = std::min(size - i, step);
    if (!in.take(data + i, n, regions, &imms).ok()) break;  // the connection is dropped
    i += n;
    step = step * 3 % 61 + 1;
  }
  for (size_t k = 0; k < 256; ++k) {
    if (memory[k] != 0xa5 || (k < 128 && memory[384 + k] != 0xa5)) __builtin_trap();
  }
  return 0;
}
