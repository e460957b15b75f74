#include "internal/socket_wire.h"

#include <algorithm>
#include <cstring>

#include "msinfer/comm/transport.h"

namespace msinfer::comm::internal {

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Status WireReader::take(const uint8_t* p, size_t n, const RegionTable& regions,
                        std::vector<uint32_t>* imms) {
  while (n > 0) {
    uint8_t* to = nullptr;
    size_t want = 0;
    switch (part) {
      case Part::kHelloLen:
        to = reinterpret_cast<uint8_t*>(&hello_len);
        want = 4;
        break;
      case Part::kHello:
        to = reinterpret_cast<uint8_t*>(who.data());
        want = hello_len;
        break;
      case Part::kHeader:
        to = reinterpret_cast<uint8_t*>(&h);
        want = sizeof(WireHeader);
        break;
      case Part::kPayload:
        to = dst;
        want = h.len;
        break;
    }
    const size_t k = std::min(n, want - got);
    std::memcpy(to + got, p, k);
    got += k;
    p += k;
    n -= k;
    if (got == want) MSI_RETURN_IF_ERROR(part_done(regions, imms));
  }
  return ok_status();
}

Status WireReader::part_done(const RegionTable& regions, std::vector<uint32_t>* imms) {
  got = 0;
  switch (part) {
    case Part::kHelloLen:
      if (hello_len <= kSecretChars || hello_len > kMaxHello) {
        return invalid_argument("a connection that does not speak msinfer (hello of " +
                                std::to_string(hello_len) + " bytes)");
      }
      who.assign(hello_len, '\0');
      part = Part::kHello;
      break;
    case Part::kHello:
      if (secret.size() != kSecretChars || !same_secret(who.substr(0, kSecretChars), secret)) {
        return invalid_argument("a connection without this job's secret");
      }
      who.erase(0, kSecretChars);
      part = Part::kHeader;
      break;
    case Part::kHeader: {
      auto it = regions.find(h.key);
      if (it == regions.end() || !range_within(h.offset, h.len, it->second.second)) {
        return invalid_argument("wrote " + std::to_string(h.len) + " bytes at offset " +
                                std::to_string(h.offset) + " of region " + std::to_string(h.key) +
                                ", which is not a registered region that holds them");
      }
      dst = it->second.first + h.offset;
      part = Part::kPayload;
      if (h.len == 0) {
        imms->push_back(h.imm);
        part = Part::kHeader;
      }
      break;
    }
    case Part::kPayload:
      imms->push_back(h.imm);
      part = Part::kHeader;
      break;
  }
  return ok_status();
}

}  // namespace msinfer::comm::internal
