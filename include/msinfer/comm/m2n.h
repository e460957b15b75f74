// The M2N library: moves rows of token activations from M senders to N
// receivers (dispatch, attention -> experts) and, as a second channel, back
// (combine, N2M), once per layer and micro-batch (docs/RUNTIME.md, "One layer of one micro-batch").
//
// Receive layout: each receiver registers one region of
//   senders x slots x slot_bytes,  slot_bytes = max_rows * row_bytes (+ 8 with checksums)
// Sender s writes its rows for micro-batch slot k at ((s * slots) + k) * slot_bytes,
// row r at r * row_bytes; with checksums a 64-bit FNV-1a of the rows follows
// them. One write per destination, an empty one (0 rows) included, so a
// receiver never waits for a sender with nothing to say.
//
// The 32-bit immediate of each write (docs/M2N.md):
//   bit 31     channel (0 dispatch, 1 combine; the runtime's expert tp
//              partials to shard 0 use 1 too: a process may have one
//              receiver and one sender per channel)
//   bits 30-24 sender index (M <= 128)
//   bits 23-20 slot (<= 16 slots)
//   bits 19-16 sequence number mod 16 (a stale write from an earlier round is detected)
//   bits 15-0  row count (<= 65535)
//
// Flow control needs no extra messages: a receiver reuses slot k only after it
// released it (after its results for k were sent back), and a sender only
// writes slot k again after it received those results.
//
// Not thread-safe: an M2NEndpoint and its channels belong to one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "msinfer/comm/transport.h"
#include "msinfer/core/status.h"

namespace msinfer::comm {

struct Immediate {
  int channel = 0, sender = 0, slot = 0;
  uint32_t seq = 0;  // mod 16
  uint32_t rows = 0;
  uint32_t pack() const;
  static Immediate unpack(uint32_t imm);
};

struct M2NShape {
  int senders = 1, receivers = 1, slots = 2;
  int64_t max_rows = 1024;
  int64_t row_bytes = 2048;
  bool checksum = false;  // debug: verify every payload
  int channel = 0;
  int64_t slot_bytes() const { return max_rows * row_bytes + (checksum ? 8 : 0); }
  Status validate() const;
};

uint64_t fnv1a64(const uint8_t* p, size_t n);

// A spin-wait hint for loops that poll: the core's resources go to its other
// hyperthread, and a hypervisor sees a vCPU that waits.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class M2NEndpoint;

// The receiving side of one channel on one receiver.
class M2NReceiver {
 public:
  M2NReceiver(const M2NShape& shape, int index);
  const M2NShape& shape() const { return shape_; }
  // Allocates the receive region from the endpoint's transport and registers
  // it; the returned region goes to every sender through the bootstrap.
  StatusOr<RemoteRegion> attach(M2NEndpoint& ep);
  // Blocks (polling, yielding when idle) until every sender's write for `slot`
  // carrying `seq` arrived; DEADLINE_EXCEEDED naming the missing senders after
  // the endpoint's timeout; DATA_LOSS-like INTERNAL on a checksum mismatch or a
  // stale sequence number. `between_polls`, when given, runs at every 64th
  // poll that finds the slot incomplete (a worker reads its control channel
  // there, and may drop a sender that died); its error ends the wait.
  Status wait(int slot, uint32_t seq, const std::function<Status()>& between_polls = {});
  // Non-blocking parts of wait(): every sender's write for the slot is in, and
  // the sequence numbers and checksums of a complete slot are right.
  bool all_arrived(int slot) const;
  std::vector<int> missing(int slot) const;
  Status verify(int slot, uint32_t seq) const;
  const uint8_t* data(int slot, int sender) const;
  int64_t rows(int slot, int sender) const;
  // Slot may be written again (its results were sent back).
  void release(int slot);
  // Sender `s` is gone (its process died): from now on no slot waits for it,
  // verify() skips it, rows() is 0 for it and a late write from it is
  // ignored. The runtime drops a dead attention worker this way, so the
  // expert workers go on serving the others. Idempotent.
  void drop_sender(int s);
  // A new process took dropped sender `s`'s place (between rounds): its
  // writes count again, from an empty slot. Idempotent.
  void restore_sender(int s);
  bool dropped(int sender) const { return dropped_[static_cast<size_t>(sender)] != 0; }

 private:
  friend class M2NEndpoint;
  Status on_immediate(const Immediate& imm);
  M2NShape shape_;
  int index_;
  M2NEndpoint* ep_ = nullptr;
  std::unique_ptr<RegionMemory> region_;  // from the transport, at attach()
  struct Arrival {
    bool arrived = false;
    uint32_t seq = 0;
    uint32_t rows = 0;
  };
  std::vector<Arrival> arrivals_;  // [slot][sender]
  std::vector<char> dropped_;      // [sender]
};

// The sending side of one channel on one sender.
class M2NSender {
 public:
  M2NSender(const M2NShape& shape, int index);
  const M2NShape& shape() const { return shape_; }
  Status attach(M2NEndpoint& ep);
  // Receiver r's transport peer handle and receive region.
  void set_receiver(int r, int peer, const RemoteRegion& region);
  // Where to put the rows for `receiver` in `slot` (registered memory).
  uint8_t* buffer(int slot, int receiver);
  // One write per receiver with rows[r] rows (0 allowed). INVALID_ARGUMENT before
  // anything is sent if a count exceeds max_rows, the slot is out of range, or
  // the slot's previous writes have not completed.
  Status send(int slot, uint32_t seq, const std::vector<int64_t>& rows);
  // Blocks until the slot's writes completed locally (its buffer may be reused).
  Status wait_sent(int slot);
  // Receiver `r` is gone: send() writes nothing more to it (its row count is
  // ignored). Idempotent.
  void drop_receiver(int r);
  // A new process took dropped receiver `r`'s place: set_receiver() first,
  // then send() writes to it again.
  void restore_receiver(int r);
  bool dropped(int receiver) const { return dropped_[static_cast<size_t>(receiver)] != 0; }

 private:
  friend class M2NEndpoint;
  M2NShape shape_;
  int index_;
  M2NEndpoint* ep_ = nullptr;
  std::vector<uint8_t> buffer_;
  std::vector<int> peers_;
  std::vector<RemoteRegion> regions_;
  std::vector<int> in_flight_;  // per slot
  std::vector<char> dropped_;   // per receiver
};

// One process's transport plus the channels it takes part in; routes
// completions to them and implements waiting with a timeout.
class M2NEndpoint {
 public:
  explicit M2NEndpoint(std::unique_ptr<Transport> t,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  ~M2NEndpoint();
  // For error exits: the transport is left open instead of closed when the
  // endpoint is destroyed. Closing a libfabric tcp endpoint whose peer died can
  // block for a long time (flushing to a dead connection); a process that is
  // about to exit with an error must not hang there.
  void abandon() { abandon_ = true; }
  Transport& transport() { return *t_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // Whether waiting gives the core away at an empty poll (sched_yield) or
  // keeps spinning (with a pause hint). Yield where this host has more
  // processes than cores (comm::oversubscribed): there a spinning waiter
  // takes the core from the peer it waits for. Spin otherwise: a yield hands
  // a whole scheduler slice (~2 ms) to any other process on the core.
  // Default: yield.
  void set_yield_when_idle(bool y) { yield_when_idle_ = y; }
  bool yield_when_idle() const { return yield_when_idle_; }
  // Empty polls before yielding starts (default 64). Measured on 2 cores: a
  // pure exchange (bench m2n 2x2, 4x4) is faster yielding at once (p50 at
  // 32 KiB, msinfer/MPI: socket 0.88-1.01 -> 0.71-0.82, direct 7.8 -> 5.7
  // us); the runtime (bench serve 2+2, m=2), where compute fills the gaps,
  // is not (TTFT p50 12.7/13.6 ms with 64 vs 15.0/18.4 with none).
  void set_spins_before_yield(int n) { spins_before_yield_ = n; }
  // What a polling loop does after its `idle_polls`-th empty poll in a row:
  // yield or spin, as above. wait_until uses it; so do loops of their own.
  void relax(int64_t idle_polls) const;
  // Polls until done() holds; after the timeout returns DEADLINE_EXCEEDED with
  // `what()` in the message.
  Status wait_until(const std::function<bool()>& done, const std::function<std::string()>& what);
  // Reads completions once; returns how many it handled in *n (if given).
  Status progress(size_t* n = nullptr);

 private:
  friend class M2NReceiver;
  friend class M2NSender;
  std::unique_ptr<Transport> t_;
  std::chrono::milliseconds timeout_;
  bool abandon_ = false;
  bool yield_when_idle_ = true;
  int spins_before_yield_ = 64;
  std::vector<M2NReceiver*> receivers_;  // by channel
  std::vector<M2NSender*> senders_;      // by channel
  std::vector<Completion> scratch_;
};

}  // namespace msinfer::comm
