// The socket transport's wire format and the parser of one incoming
// connection's byte stream. Private to comm/; separate from the transport so
// that fuzz/socket_wire_fuzz.cc can feed it arbitrary bytes.
//
// A connection opens with a hello from the writer:
//   u32 n (host order, kSecretChars+1..kMaxHello), then n bytes: the target's
//   secret (kSecretChars hex digits, from the target's address, which only
//   the job's bootstrap handed out) and the writer's own transport address
//   ("socket:<ip>:<port>:<secret>"), which the target uses to name it and to
//   write back on this connection
// A connection whose hello is malformed or carries another secret is
// dropped before anything it sent is looked at.
// then carries messages, each a WireHeader and `len` payload bytes that land
// in the target's region `key` at `offset`. The connection's other end (the
// one that connected, when the target writes back) sends no hello.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer::comm::internal {

// Precedes every payload on the wire (host order: both ends are one build).
struct WireHeader {
  uint64_t key;     // region key at the target
  uint64_t offset;  // into that region
  uint64_t len;     // payload bytes that follow
  uint32_t imm;
  uint32_t unused;
};
static_assert(sizeof(WireHeader) == 32);

constexpr uint32_t kMaxHello = 4096;
constexpr size_t kSecretChars = 32;

// Equal strings, compared in time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b);

// The target's registered regions: key -> (base, bytes).
using RegionTable = std::map<uint64_t, std::pair<uint8_t*, size_t>>;

// Parser state of one incoming connection. Not thread-safe.
struct WireReader {
  enum class Part { kHelloLen, kHello, kHeader, kPayload };
  Part part = Part::kHelloLen;
  std::string secret;  // what the hello must present (the target's)
  std::string who;  // the writer's address, from its hello
  uint32_t hello_len = 0;
  size_t got = 0;  // bytes of the current part so far
  WireHeader h{};
  uint8_t* dst = nullptr;  // kPayload: where the payload goes (regions[h.key] + h.offset)

  // Advances over n bytes that arrived; the immediate of every completed
  // write is appended to *imms. An error (the message says what the peer
  // sent, not who it is) means the connection must be dropped: nothing of
  // the offending message has been written anywhere. Before hello_done()
  // the peer has not shown it belongs to the job.
  Status take(const uint8_t* p, size_t n, const RegionTable& regions, std::vector<uint32_t>* imms);
  // The current part is complete (also called by a reader that received a
  // payload straight into dst).
  Status part_done(const RegionTable& regions, std::vector<uint32_t>* imms);
  // At a message boundary: a close here is a peer that finished.
  bool between_messages() const { return part == Part::kHeader && got == 0; }
  bool hello_done() const { return part == Part::kHeader || part == Part::kPayload; }
};

}  // namespace msinfer::comm::internal
