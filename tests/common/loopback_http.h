// Raw HTTP/1.1 over a loopback socket, for the server tests that need what a
// client library hides: a request left open, bytes read as they come, an
// abrupt close.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace msinfer::testing {

// A connected socket to 127.0.0.1:port, or -1. rcvbuf > 0: its receive
// buffer (set before connecting, so the window it offers stays that small).
// from: the source address (another loopback address, 127.0.0.2, is another
// client to the server), or null for the kernel's choice.
inline int connect_loopback(int port, int rcvbuf = 0, const char* from = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  if (from != nullptr) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &src.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// "POST path" with a JSON body; `headers` are extra lines, each ending \r\n.
inline std::string post_request(const std::string& path, const std::string& body,
                                const std::string& headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Connects and sends `bytes`; the socket, or -1 when nobody listens.
inline int send_request(int port, const std::string& bytes) {
  const int fd = connect_loopback(port);
  if (fd >= 0) ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  return fd;
}

// True when `fd` has something to read within `wait` (e.g. a stream's first bytes).
inline bool readable_within(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) == 1;
}

// Reads what comes until the peer closes, `wait` passes, `until` appears in
// what was read, or `stop_after` bytes came. *closed: whether the peer closed.
inline std::string read_from(int fd, std::chrono::milliseconds wait, const std::string& until = "",
                             size_t stop_after = SIZE_MAX, bool* closed = nullptr) {
  std::string got;
  bool eof = false;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline && got.size() < stop_after &&
         (until.empty() || got.find(until) == std::string::npos)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      eof = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  if (closed) *closed = eof;
  return got;
}

}  // namespace msinfer::testing
