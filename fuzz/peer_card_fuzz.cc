// libFuzzer target for the bootstrap blob parser (PeerCard::decode: a peer's
// transport address and receive region) and the bounds check every transport
// applies to a write into a region so described (range_within, check_write).
// Built and run by fuzz/run-comm.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "msinfer/comm/transport.h"

using namespace msinfer::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  uint64_t offset, len;
  std::memcpy(&offset, data, 8);
  std::memcpy(&len, data + 8, 8);
  const std::string blob(reinterpret_cast<const char*>(data + 16), size - 16);
  auto card = PeerCard::decode(blob, "fuzz");
  if (!card.ok()) return 0;
  const RemoteRegion& r = card->region;
  if (card->address.empty() || r.length > UINT64_MAX - r.base) __builtin_trap();
  if (check_write("fuzz", 0, 1, len, r, offset).ok()) {
    // Accepted: then every byte written lies in the region, with no wrap.
    const unsigned __int128 end = static_cast<unsigned __int128>(offset) + len;
    if (end > r.length) __builtin_trap();
    if (static_cast<unsigned __int128>(r.base) + end >
        UINT64_MAX + static_cast<unsigned __int128>(1)) {
      __builtin_trap();
    }
  }
  return 0;
}
