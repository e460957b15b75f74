#include "msinfer/comm/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace msinfer::comm {
namespace {

StatusOr<sockaddr_in> parse_ipv4(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return invalid_argument("expected an IPv4 address, got '" + host + "'");
  }
  return a;
}

}  // namespace

StatusOr<int> tcp_listen(const std::string& host, int port, int* bound_port) {
  MSI_ASSIGN_OR_RETURN(sockaddr_in a, parse_ipv4(host, port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return internal_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 256) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status(StatusCode::kUnavailable,
                  "cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (bound_port != nullptr) *bound_port = ntohs(a.sin_port);
  return fd;
}

namespace {

// One non-blocking connect() to `a`, waiting for it with poll() no later
// than `deadline`. The fd on success; -1 with *why set otherwise. (A blocking
// connect() gives up only after the kernel's SYN retries, ~127 s, whatever
// the caller's timeout: e.g. against a listener whose accept queue is full.)
int connect_once(const sockaddr_in& a, std::chrono::steady_clock::time_point deadline,
                 std::string* why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  int err = rc == 0 ? 0 : errno;
  if (err == EINPROGRESS || err == EINTR) {
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) {
        err = ETIMEDOUT;
        break;
      }
      pollfd p{fd, POLLOUT, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (n < 0 && errno != EINTR) {
        err = errno;
        break;
      }
      if (n <= 0) continue;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      break;
    }
  }
  if (err != 0) {
    *why = std::strerror(err);
    ::close(fd);
    return -1;
  }
  // Blocking again, as callers expect; TCP_NODELAY for small control messages.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

StatusOr<int> tcp_connect(const std::string& host_port, std::chrono::milliseconds timeout) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return invalid_argument("expected host:port, got '" + host_port + "'");
  const int port = std::atoi(host_port.c_str() + colon + 1);
  MSI_ASSIGN_OR_RETURN(sockaddr_in a, parse_ipv4(host_port.substr(0, colon), port));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::string why;
    const int fd = connect_once(a, deadline, &why);
    if (fd >= 0) return fd;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(StatusCode::kUnavailable, "cannot reach " + host_port + " within " +
                                                  std::to_string(timeout.count()) + " ms: " + why);
    }
    // Refused (nobody listens yet): try again shortly, within the deadline.
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    ::usleep(static_cast<useconds_t>(std::max<int64_t>(0, std::min<int64_t>(left, 20000))));
  }
}

StatusOr<int> tcp_accept(int listen_fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return Status(StatusCode::kDeadlineExceeded, "no connection within the timeout");
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left < 200 ? left : 200)) <= 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // No fd to spare now (the caller may be about to close some): the
        // connection waits in the backlog; look again shortly, within the timeout.
        ::usleep(static_cast<useconds_t>(std::min<int64_t>(left, 50) * 1000));
        continue;
      }
      return internal_error(std::string("accept: ") + std::strerror(errno));
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
}

}  // namespace msinfer::comm
