#include "msinfer/server/batch_send.h"

#include <liburing.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "msinfer/core/logging.h"

namespace msinfer::server {

struct BatchSend::Ring {
  io_uring ring{};
};

std::unique_ptr<BatchSend> BatchSend::create(unsigned depth, std::string* why) {
  auto r = std::make_unique<Ring>();
  // No SQPOLL thread (it would spin on a core): the submitting thread runs
  // the sends itself, as send() would. SUBMIT_ALL (Linux 5.18): a request
  // that fails early does not stop the ones after it from being submitted;
  // older kernels stop there, which send_all handles too.
  int rc = io_uring_queue_init(depth, &r->ring, IORING_SETUP_SUBMIT_ALL);
  if (rc == -EINVAL) rc = io_uring_queue_init(depth, &r->ring, 0);
  if (rc < 0) {
    if (why != nullptr) *why = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    return nullptr;
  }
  return std::unique_ptr<BatchSend>(new BatchSend(std::move(r), depth));
}

BatchSend::BatchSend(std::unique_ptr<Ring> ring, unsigned depth)
    : ring_(std::move(ring)), depth_(depth) {}

BatchSend::~BatchSend() { io_uring_queue_exit(&ring_->ring); }

void BatchSend::send_all(std::span<const Item> items, std::vector<long>* results) {
  results->assign(items.size(), 0);
  io_uring* ring = &ring_->ring;
  for (size_t begin = 0; begin < items.size(); begin += depth_) {
    const size_t end = std::min(items.size(), begin + depth_);
    unsigned want = 0;
    for (size_t i = begin; i < end; ++i) {
      if (items[i].fd < 0) {
        (*results)[i] = -EBADF;  // no request for it
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      MSI_CHECK(sqe != nullptr);  // the ring holds depth_ and is empty here
      // MSG_DONTWAIT: a full socket fails the request with -EAGAIN at once
      // instead of io_uring waiting for room (the submit must not block).
      io_uring_prep_send(sqe, items[i].fd, items[i].data, items[i].size,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      io_uring_sqe_set_data64(sqe, i);
      ++want;
    }
    if (want == 0) continue;
    // One system call: the sends complete during the submit (or fail with
    // -EAGAIN), so the wait for their completions returns at once. Where the
    // kernel stops submitting early it returns without waiting; the rest go
    // in further submits.
    unsigned submitted = 0;
    int rc = io_uring_submit_and_wait(ring, want);
    ++submits_;
    for (int tries = 0; submitted < want; ++tries) {
      if (rc > 0) {
        submitted += static_cast<unsigned>(rc);
        tries = 0;
      }
      if (submitted >= want) break;
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) break;
      if (tries >= 100) break;
      rc = io_uring_submit(ring);
      ++submits_;
    }
    if (submitted < want) {
      // The kernel will not take the rest (they wait in the ring, which is
      // not used again: without SQPOLL only a submit hands them over).
      // Those writes fail, and their connections with them.
      broken_ = std::string("io_uring_submit: ") + (rc < 0 ? std::strerror(-rc) : "no progress");
      unsigned skip = submitted;
      for (size_t i = begin; i < items.size(); ++i) {
        if (i >= end) {
          (*results)[i] = -EIO;
        } else if (items[i].fd >= 0 && skip > 0) {
          --skip;  // submitted: its completion below
        } else if (items[i].fd >= 0) {
          (*results)[i] = -EIO;
        }
      }
    }
    for (unsigned got = 0; got < submitted;) {
      io_uring_cqe* cqe = nullptr;
      const int w = io_uring_wait_cqe(ring, &cqe);
      if (w == -EINTR) continue;
      MSI_CHECK(w == 0) << "io_uring_wait_cqe: " << std::strerror(-w);
      (*results)[io_uring_cqe_get_data64(cqe)] = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      ++got;
    }
    if (!broken_.empty()) return;
  }
}

}  // namespace msinfer::server
