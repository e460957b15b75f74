// Sends many buffers, each on its own socket, in one system call (io_uring).
//
// A streaming server writes one small chunk to every stream at every engine
// step. With send() that is a system call per stream and step, and a system
// call is dear where the kernel runs under a hypervisor (~1.1 us for a null
// call on the development VM, docs/BENCHMARKS.md): a round's sends submitted
// together as io_uring SEND requests cost the writer 1.6 us a write there,
// against 3.8 us with send().
//
// A send the socket cannot take at once fails with -EAGAIN (MSG_DONTWAIT:
// io_uring does not wait for room), so submitting never blocks on a slow
// reader; the caller finishes such a write its usual way.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace msinfer::server {

class BatchSend {
 public:
  struct Item {
    int fd = -1;
    const char* data = nullptr;
    size_t size = 0;
  };

  // A ring for up to `depth` sends per system call; null, with the reason in
  // *why, where the kernel refuses io_uring (too old, disabled by
  // kernel.io_uring_disabled, filtered by a container's seccomp profile).
  static std::unique_ptr<BatchSend> create(unsigned depth, std::string* why);
  ~BatchSend();
  BatchSend(const BatchSend&) = delete;
  BatchSend& operator=(const BatchSend&) = delete;

  // Sends items[i].data on items[i].fd (MSG_NOSIGNAL) for every i, ceil(n /
  // depth) system calls in all; (*results)[i]: the bytes sent (possibly
  // fewer than size), or -errno (-EAGAIN: the socket's buffer is full).
  void send_all(std::span<const Item> items, std::vector<long>* results);

  // System calls made by send_all so far.
  int64_t submits() const { return submits_; }
  // Non-empty after a submit the kernel refused (its writes failed with
  // -EIO): the reason. Do not use it again.
  const std::string& broken() const { return broken_; }

 private:
  struct Ring;
  explicit BatchSend(std::unique_ptr<Ring> ring, unsigned depth);
  std::unique_ptr<Ring> ring_;
  unsigned depth_;
  int64_t submits_ = 0;
  std::string broken_;
};

}  // namespace msinfer::server
