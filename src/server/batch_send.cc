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
  // No SQPOLL thread (it would spin on a core), no flags: the submitting
  // thread runs the sends itself, as send() would.
  const int rc = io_uring_queue_init(depth, &r->ring, 0);
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
    for (size_t i = begin; i < end; ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      MSI_CHECK(sqe != nullptr);  // the ring holds depth_ and is empty here
      // MSG_DONTWAIT: a full socket fails the request with -EAGAIN at once
      // instead of io_uring waiting for room (the submit must not block).
      io_uring_prep_send(sqe, items[i].fd, items[i].data, items[i].size,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      io_uring_sqe_set_data64(sqe, i);
    }
    const unsigned want = static_cast<unsigned>(end - begin);
    // The sends complete during the submit (or fail with -EAGAIN): the wait
    // returns at once.
    int rc;
    int tries = 0;
    do {
      rc = io_uring_submit_and_wait(ring, want);
    } while ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && ++tries < 100);
    ++submits_;
    if (rc < 0) {
      // The kernel took none of them (it has not seen them: without SQPOLL
      // only a submit hands them over, and none follows). The ring is not
      // used again; these writes fail, and their connections with them.
      broken_ = std::string("io_uring_submit: ") + std::strerror(-rc);
      for (size_t i = begin; i < items.size(); ++i) (*results)[i] = -EIO;
      return;
    }
    unsigned got = 0;
    while (got < want) {
      io_uring_cqe* cqe = nullptr;
      const int w = io_uring_wait_cqe(ring, &cqe);
      if (w == -EINTR) continue;
      MSI_CHECK(w == 0) << "io_uring_wait_cqe: " << std::strerror(-w);
      (*results)[io_uring_cqe_get_data64(cqe)] = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      ++got;
    }
  }
}

}  // namespace msinfer::server
