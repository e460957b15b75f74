// Plain TCP sockets for the control plane (bootstrap rounds, the router's
// commands to workers on other hosts). Data never goes through here.
#pragma once

#include <chrono>
#include <string>

#include "msinfer/core/status.h"

namespace msinfer::comm {

// A listening socket on host (IPv4 literal) and port (0: any free port); the
// port bound is returned in *bound_port.
StatusOr<int> tcp_listen(const std::string& host, int port, int* bound_port);

// Connects to "host:port", retrying until `timeout` (the peer may not listen
// yet); returns within `timeout` (plus ~20 ms) whatever the network does: the
// connect is non-blocking and waited for with poll. The socket returned is
// blocking, with TCP_NODELAY set.
StatusOr<int> tcp_connect(const std::string& host_port, std::chrono::milliseconds timeout);

// Waits up to `timeout` for a connection on a listening socket;
// DEADLINE_EXCEEDED when none came, or none could be taken because the
// process is out of fds (EMFILE, ENFILE: transient, never another error).
StatusOr<int> tcp_accept(int listen_fd, std::chrono::milliseconds timeout);

}  // namespace msinfer::comm
