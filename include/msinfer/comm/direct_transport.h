// msinfer's own transport between processes of one host ("direct"). Receive
// regions are shared-memory objects (Transport::allocate) that every sender
// maps on its first write, so a write is one memcpy by the sender straight
// into the receiver's region — a single copy, no system call, and nothing to
// do on the receiving side, which is what an RDMA write is — followed by the
// 32-bit immediate posted into the receiver's mailbox, a small shared-memory
// object that the receiver polls, where each connected sender owns a
// single-producer ring (a "link"): a sender that dies breaks only its own.
// The immediate is published (release store) after the data, so a receiver
// that sees it sees the rows. Memory registered without allocate() can be
// the source of a write, never its target.
//
// Why next to libfabric's shm provider: shm moves a write either through
// bounce buffers (two copies, drained by the receiver's progress) or by a
// process_vm_readv the receiver makes when it next progresses, plus a
// completion message back; the target takes part in every write and the
// sender's completion needs a round trip. Side by side with Open MPI's vader
// on this host (docs/BENCHMARKS.md) that costs shm the 32 KiB-8 MiB range.
//
// Objects live in /dev/shm, named like libfabric shm endpoints
// ("msinfer-<pid>-<random>", the mailbox; "...-r<n>", region n; ".live", the
// owner's liveness lock), are unlinked by their owner and, after a crash, by
// the next endpoint (remove_dead_shm_endpoints). A peer's death shows as its
// immediates not arriving (the M2N wait names it) or, once the link to it is
// full, as an error naming it.
#pragma once

#include <memory>

#include "msinfer/comm/fabric_transport.h"

namespace msinfer::comm {

// Uses options.write_timeout_ms (a mailbox that stays full); the other fields
// are libfabric's.
StatusOr<std::unique_ptr<Transport>> make_direct_transport(const FabricOptions& options);

}  // namespace msinfer::comm
