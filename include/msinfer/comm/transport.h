// The transport under the M2N library: a handful of calls — register memory,
// connect, write-with-immediate, poll — with implementations side by side:
// libfabric (fabric_transport.h: shm, tcp, verbs, efa) and an in-process one
// for unit tests (inproc_transport.h).
//
// Semantics every implementation keeps:
// - write() copies `len` bytes from local registered memory into the peer's
//   registered region at `offset`, and raises a remote completion carrying the
//   32-bit `imm` at the peer only after the data is in place (RDMA write with
//   immediate). A zero-length write still raises the remote completion.
// - Completion order: writes from one sender to one peer complete in order.
// - poll() never blocks; it drives progress (libfabric progress is manual), so
//   senders and receivers both poll.
// Not thread-safe: one thread owns a transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer::comm {

// What a peer needs to write into a registered region.
struct RemoteRegion {
  uint64_t key = 0;     // provider key
  uint64_t base = 0;    // address of byte 0 as the peer must name it (virtual
                        // address, or 0 when the provider uses offsets)
  uint64_t length = 0;
  std::string encode() const;  // 24 bytes: key, base, length (host order)
  // Refuses anything but 24 bytes and a region whose end (base + length)
  // wraps around 2^64: the blob comes from another process.
  static StatusOr<RemoteRegion> decode(const std::string& blob);
};

// [offset, offset + len) lies within [0, size), computed without the
// wrap-around of offset + len (both come off the wire or out of a peer's blob).
constexpr bool range_within(uint64_t offset, uint64_t len, uint64_t size) {
  return offset <= size && len <= size - offset;
}

// What a rank publishes through the bootstrap so that peers can write to it:
// its transport address followed by its receive region (RemoteRegion::encode).
struct PeerCard {
  std::string address;
  RemoteRegion region;
  std::string encode() const;
  // INVALID_ARGUMENT naming `who` for a blob too short, an empty address or a
  // bad region; never reads outside `blob`.
  static StatusOr<PeerCard> decode(const std::string& blob, const std::string& who);
};

struct Completion {
  enum class Kind { kRemoteWrite, kLocalWrite };
  Kind kind = Kind::kRemoteWrite;
  uint32_t imm = 0;      // kRemoteWrite: the immediate
  uint64_t context = 0;  // kLocalWrite: the context given to write()
};

// Memory for a receive region, from Transport::allocate.
class RegionMemory {
 public:
  virtual ~RegionMemory() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // This endpoint's address, to hand to peers through the bootstrap.
  virtual std::string address() const = 0;
  // Zeroed memory for a region peers will write into (register it next).
  // Anonymous zero pages (core's ZeroPages: mapped at first touch) unless the
  // transport's peers can store into it directly (the direct transport:
  // shared memory).
  virtual StatusOr<std::unique_ptr<RegionMemory>> allocate(size_t len);
  // Registers [base, base + len) as a source and a target of writes. The memory
  // must stay valid while peers may write into it.
  virtual StatusOr<RemoteRegion> register_memory(void* base, size_t len) = 0;
  // A handle for the peer at `address`.
  virtual StatusOr<int> connect(const std::string& address) = 0;
  // Queues a write; its local completion reports `context`. `src` must lie in
  // registered memory. Retries internally while the provider is busy.
  virtual Status write(int peer, const void* src, size_t len, const RemoteRegion& dst,
                       uint64_t offset, uint32_t imm, uint64_t context) = 0;
  // Appends at most `max` completions to `out`; returns an error (naming the
  // peer when known) if a write failed.
  virtual Status poll(std::vector<Completion>* out, size_t max) = 0;
};

// What every write() checks before anything moves: `peer` is one of the
// `peers` handles and [offset, offset + len) lies in the peer's region.
// INVALID_ARGUMENT naming `transport` otherwise.
Status check_write(const std::string& transport, int peer, size_t peers, size_t len,
                   const RemoteRegion& dst, uint64_t offset);

// strerror(e) and the number, for messages.
std::string errno_text(int e);

}  // namespace msinfer::comm
