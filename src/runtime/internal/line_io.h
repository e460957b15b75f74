// Newline-framed JSON messages between the router and its workers, over pipes
// (one host) or TCP sockets (under mpirun/srun). Private to runtime/.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

namespace msinfer::runtime::internal {

// Writes s and a newline; false if the pipe is closed. A signal that
// interrupts the write (EINTR) is not a closed pipe: the write goes on.
inline bool write_line(int fd, const std::string& s) {
  const std::string l = s + "\n";
  size_t off = 0;
  while (off < l.size()) {
    const ssize_t n = ::write(fd, l.data() + off, l.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Next complete line from fd, keeping partial input in *buf across calls (a
// timeout must not lose the start of a line). timeout_ms < 0 waits forever.
// False on timeout or end of file (then *eof, if given, is set); a signal
// (EINTR) is neither.
inline bool read_line(int fd, std::string* buf, std::string* line, int timeout_ms,
                      bool* eof = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool polled = false;  // timeout 0 still looks once
  while (true) {
    const size_t nl = buf->find('\n');
    if (nl != std::string::npos) {
      *line = buf->substr(0, nl);
      buf->erase(0, nl + 1);
      return true;
    }
    int wait = -1;
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0 && polled) return false;
      wait = static_cast<int>(left <= 0 ? 0 : left < 100 ? left : 100);
    }
    polled = true;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, wait) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      if (eof != nullptr) *eof = true;
      return false;
    }
    buf->append(chunk, static_cast<size_t>(n));
  }
}

// Binary blobs (M2N peer cards) inside JSON lines: lowercase hex.
inline std::string to_hex(const std::string& b) {
  static const char* digits = "0123456789abcdef";
  std::string h;
  h.reserve(b.size() * 2);
  for (unsigned char c : b) {
    h.push_back(digits[c >> 4]);
    h.push_back(digits[c & 15]);
  }
  return h;
}

// False for an odd length or a character that is not a hex digit.
inline bool from_hex(const std::string& h, std::string* b) {
  auto nibble = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (h.size() % 2 != 0) return false;
  b->clear();
  for (size_t i = 0; i < h.size(); i += 2) {
    const int hi = nibble(h[i]), lo = nibble(h[i + 1]);
    if (hi < 0 || lo < 0) return false;
    b->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

}  // namespace msinfer::runtime::internal
