// The parts of transport.h that judge what comes from another process —
// bounds of a write, a peer's region and bootstrap blob — apart from the
// transports themselves, so that fuzz/peer_card_fuzz.cc can link them alone.
#include <cstring>

#include "msinfer/comm/transport.h"

namespace msinfer::comm {

Status check_write(const std::string& transport, int peer, size_t peers, size_t len,
                   const RemoteRegion& dst, uint64_t offset) {
  if (peer < 0 || static_cast<size_t>(peer) >= peers) {
    return invalid_argument(transport + ": unknown peer " + std::to_string(peer));
  }
  if (!range_within(offset, len, dst.length)) {
    return invalid_argument(transport + ": write of " + std::to_string(len) + " bytes at offset " +
                            std::to_string(offset) + " outside the peer's " +
                            std::to_string(dst.length) + "-byte region");
  }
  return ok_status();
}

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

std::string RemoteRegion::encode() const {
  std::string s(24, '\0');
  std::memcpy(s.data(), &key, 8);
  std::memcpy(s.data() + 8, &base, 8);
  std::memcpy(s.data() + 16, &length, 8);
  return s;
}

StatusOr<RemoteRegion> RemoteRegion::decode(const std::string& blob) {
  if (blob.size() != 24) return invalid_argument("remote region blob must be 24 bytes");
  RemoteRegion r;
  std::memcpy(&r.key, blob.data(), 8);
  std::memcpy(&r.base, blob.data() + 8, 8);
  std::memcpy(&r.length, blob.data() + 16, 8);
  if (r.length > UINT64_MAX - r.base) {
    return invalid_argument("remote region blob: base " + std::to_string(r.base) + " + length " +
                            std::to_string(r.length) + " wraps around");
  }
  return r;
}

std::string PeerCard::encode() const { return address + region.encode(); }

StatusOr<PeerCard> PeerCard::decode(const std::string& blob, const std::string& who) {
  constexpr size_t kRegion = 24;
  if (blob.size() <= kRegion) {
    return invalid_argument("bootstrap blob from " + who + ": " + std::to_string(blob.size()) +
                            " bytes, expected an address and a 24-byte region");
  }
  PeerCard c;
  c.address = blob.substr(0, blob.size() - kRegion);
  auto r = RemoteRegion::decode(blob.substr(blob.size() - kRegion));
  if (!r.ok()) return r.status().with_context("bootstrap blob from " + who);
  c.region = *r;
  return c;
}

}  // namespace msinfer::comm
