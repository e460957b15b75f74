// msinfer's own TCP transport ("socket"). One connection per (writer,
// target) pair; a write is one sendmsg of a 24-byte header (region key,
// offset, length, immediate) and the payload, and the target reads the
// payload with recv straight into the registered region at that offset (one
// copy out of the kernel), then reports the immediate. Local completion: the
// whole message was handed to the kernel, so the source may be reused. Both
// sides make progress in poll() (one epoll_wait when nothing is pending);
// nothing blocks: a full socket buffer queues the rest for the next poll.
//
// Why next to libfabric's tcp provider (tcp;ofi_rxm): side by side with Open
// MPI's tcp btl on this host (docs/BENCHMARKS.md), libfabric's RMA writes
// through rxm took ~1.7x MPI's time at 32 KiB on 2x2; this path has no
// rendezvous, no matching and no bounce buffers.
//
// A peer that dies shows as its connection breaking: a write to it, or a
// read from it cut mid-message, fails naming it. Connections closed between
// messages are a peer that finished.
//
// Strangers cost a bounded number of fds: an accepted connection that has not
// presented its hello is "pending"; it is closed after
// FabricOptions::hello_timeout_ms, and at most kSocketMaxPendingConnections
// are kept (the oldest is closed to make room). Running out of fds at accept
// (EMFILE, ENFILE) closes the oldest pending connection, or, with none,
// pauses accepting for kSocketAcceptBackoffMs and logs once; poll() never
// fails for it. Connections wait in the kernel's backlog meanwhile.
#pragma once

#include <memory>

#include "msinfer/comm/fabric_transport.h"

namespace msinfer::comm {

// Accepted connections without a hello yet, at most (see above).
inline constexpr int kSocketMaxPendingConnections = 64;
// How long accepting pauses when the process has no fd to spare.
inline constexpr int kSocketAcceptBackoffMs = 100;

// Listens on options.address (an IPv4 literal; "" = 127.0.0.1, one host);
// options.write_timeout_ms bounds connecting to a peer; hello_timeout_ms and
// tolerate_peer_loss are the socket transport's own.
StatusOr<std::unique_ptr<Transport>> make_socket_transport(const FabricOptions& options);

}  // namespace msinfer::comm
