// libfabric transport: FI_EP_RDM endpoints, FI_RMA writes with 32-bit remote CQ
// data (fi_writedata) — the "RDMA write with immediate" of the design — on any
// provider that offers them: shm within a host, tcp (tcp;ofi_rxm) across hosts,
// verbs (InfiniBand/RoCE) and efa on clusters.
//
// Things measured on this machine kind that the implementation respects
// (docs/M2N.md, "libfabric"): remote addresses follow the provider's mr_mode
// (shm: FI_MR_VIRT_ADDR, virtual addresses; tcp/rxm: offsets into the region);
// progress is manual, so poll() reads the CQ and write() retries -FI_EAGAIN
// while progressing; local completions and incoming immediates are told apart
// by op_context; providers that need posted receives for remote CQ data
// (FI_RX_CQ_DATA, verbs) get them pre-posted and re-posted.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "msinfer/comm/transport.h"

namespace msinfer::comm {

// The M2N transports a process can ask for (make_transport): msinfer's own
// two, and the libfabric providers it is known to work over.
enum class TransportKind {
  kDirect,       // msinfer's, within a host (direct_transport.h)
  kSocket,       // msinfer's, TCP (socket_transport.h)
  kFabricShm,    // libfabric's shm: within a host
  kFabricTcp,    // libfabric's tcp;ofi_rxm
  kFabricVerbs,  // libfabric's verbs: InfiniBand, RoCE
  kFabricEfa,    // libfabric's efa
};

// The name on the command line and in a worker's configuration: "direct",
// "socket", "shm", "tcp", "verbs", "efa".
const char* transport_name(TransportKind kind);
// The kind so named; INVALID_ARGUMENT listing the names otherwise.
StatusOr<TransportKind> parse_transport(std::string_view name);
// Whether the transport reaches only processes on this host (direct,
// libfabric's shm). The others bind the address other hosts reach this one by.
bool transport_within_host(TransportKind kind);
// Whether it is msinfer's own: a write to a dead peer does not fail the
// writer (direct: it lands in shared memory; socket: with
// tolerate_peer_loss), where a libfabric connection to it fails the
// writer's progress.
bool transport_is_msinfer(TransportKind kind);

struct FabricOptions {
  TransportKind transport = TransportKind::kFabricShm;
  // Pre-posted receives for FI_RX_CQ_DATA providers.
  int posted_receives = 256;
  // Largest single write expected. shm: below 1 MiB bounce buffers
  // (FI_SHM_DISABLE_CMA=1) have the lower latency here, above it single-copy
  // CMA does (docs/BENCHMARKS.md). An explicit FI_SHM_DISABLE_CMA wins.
  int64_t max_message_bytes = 0;
  // shm single-copy (CMA): kAuto decides by max_message_bytes; kOn always.
  // With CMA a write only queues a command, and the receiver copies the data
  // (process_vm_readv) when it next progresses, so the sender's call returns
  // at once; bounce buffers must be drained by the receiver before the sender
  // can go on, so a receiver busy computing stalls the sender.
  enum class SingleCopy { kAuto, kOn };
  SingleCopy shm_single_copy = SingleCopy::kAuto;
  // A write the provider keeps refusing (-FI_EAGAIN: e.g. the peer is gone and
  // tcp cannot connect) fails after this long instead of retrying forever.
  int write_timeout_ms = 5000;
  // Local address to bind (tcp, verbs: the interface peers reach this host
  // by); empty lets the provider choose, which may be loopback.
  std::string address;
  // socket: a peer whose connection fails (it died: reset, closed mid-write,
  // refused) is forgotten instead of failing write() or poll(): what was
  // queued for it completes locally and goes nowhere, so do later writes to
  // it, and a write it had not finished is discarded. Whoever waits for it
  // finds out by its own timeout, or is told to drop it (the disaggregated
  // runtime). The direct transport tolerates a dead peer by nature (its
  // writes land in shared memory); libfabric providers do not.
  bool tolerate_peer_loss = false;
  // socket: a connection that has not presented its hello (the target's
  // secret, socket_wire.h) this long after it was accepted is closed. The
  // job's peers send the hello with the connect, so only strays and silent
  // floods wait this long; socket_transport.h caps how many may wait at once.
  int hello_timeout_ms = 5000;
};

StatusOr<std::unique_ptr<Transport>> make_fabric_transport(const FabricOptions& options);

// The transport options.transport names.
StatusOr<std::unique_ptr<Transport>> make_transport(const FabricOptions& options);

// shm endpoints (libfabric's, and the direct transport's mailboxes and
// regions) are shared-memory objects in /dev/shm; a killed process leaves its
// own behind. msinfer names them "msinfer-<pid>-<16 hex digits>" (a token
// from ShmOwner), and remove_dead_shm_endpoints removes those whose owner is
// gone. Liveness is a lock, not the pid: "<token>.live" in /dev/shm, held
// (flock) by the owner from before its first object exists until after its
// last is unlinked, and released by the kernel when it dies. kill(pid, 0)
// cannot tell: a live process of another PID namespace (containers sharing
// /dev/shm) is ESRCH here too, and its pid may be another process's here.
class ShmOwner {
 public:
  // A fresh token with its lock taken. UNAVAILABLE if /dev/shm is not there.
  static StatusOr<std::unique_ptr<ShmOwner>> create();
  ~ShmOwner();                                       // unlinks and releases the lock
  const std::string& name() const { return name_; }  // "msinfer-<pid>-<16 hex>"

 private:
  ShmOwner() = default;
  std::string name_;
  int fd_ = -1;
};

// Whether the owner of the object so named (by token) holds its lock.
bool shm_owner_alive(const std::string& object_name);

// Removes every msinfer object whose owner is gone. Every new endpoint calls
// it; so does the router after reaping workers.
void remove_dead_shm_endpoints();

}  // namespace msinfer::comm
