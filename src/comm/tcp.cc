#include "msinfer/comm/tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

StatusOr<int> tcp_connect(const std::string& host_port, std::chrono::milliseconds timeout) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return invalid_argument("expected host:port, got '" + host_port + "'");
  const int port = std::atoi(host_port.c_str() + colon + 1);
  MSI_ASSIGN_OR_RETURN(sockaddr_in a, parse_ipv4(host_port.substr(0, colon), port));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return internal_error(std::string("socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    const std::string why = std::strerror(errno);
    ::close(fd);
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(StatusCode::kUnavailable, "cannot reach " + host_port + ": " + why);
    }
    ::usleep(20000);
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
      return internal_error(std::string("accept: ") + std::strerror(errno));
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
}

}  // namespace msinfer::comm
