// What both sides of a disaggregated deployment share: the names of worker
// processes and the bootstrap of a replacement that joins through the
// router's pipes. The workers themselves: expert_worker.cc,
// attention_worker.cc (with remote_experts.cc, attention_tp.cc); the router:
// router.cc over worker_set.cc, recovery.cc and rebalancer.cc.
#include "msinfer/runtime/disaggregated.h"

#include <unistd.h>

#include <cerrno>

#include "internal/line_io.h"
#include "msinfer/runtime/control.h"

namespace msinfer::runtime {
namespace {

class RouterPipeBootstrap : public comm::Bootstrap {
 public:
  RouterPipeBootstrap(int in_fd, int out_fd, int rank, int size)
      : in_(in_fd), out_(out_fd), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  StatusOr<std::vector<std::string>> allgather(const std::string& blob) override {
    if (!internal::write_line(out_, control::encode(control::JoinAllgather{blob}))) {
      return unavailable("joining: the router's pipe is closed");
    }
    // Byte by byte: no command after the answer is taken from the pipe.
    std::string line;
    char c = 0;
    while (true) {
      const ssize_t n = ::read(in_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return unavailable("joining: the router closed its pipe");
      if (c == '\n') break;
      line.push_back(c);
      if (line.size() > (64u << 20))
        return invalid_argument("joining: the router's answer is too long");
    }
    MSI_ASSIGN_OR_RETURN(control::Command cmd, control::decode_command(line, "router (joining)"));
    auto* blobs = std::get_if<control::JoinBlobs>(&cmd);
    if (blobs == nullptr || blobs->blobs.size() != static_cast<size_t>(size_)) {
      return invalid_argument("joining: expected " + std::to_string(size_) +
                              " blobs from the router, got " + line.substr(0, 200));
    }
    return std::move(blobs->blobs);
  }

 private:
  int in_, out_, rank_, size_;
};

}  // namespace

std::unique_ptr<comm::Bootstrap> router_pipe_bootstrap(int in_fd, int out_fd, int rank, int size) {
  return std::make_unique<RouterPipeBootstrap>(in_fd, out_fd, rank, size);
}

std::string expert_process_name(int worker, int tp_rank, int tp) {
  std::string n = "expert worker " + std::to_string(worker);
  if (tp > 1) n += " tp rank " + std::to_string(tp_rank);
  return n;
}

std::string attention_process_name(int worker, int tp_rank, int tp) {
  std::string n = "attention worker " + std::to_string(worker);
  if (tp > 1) n += " tp rank " + std::to_string(tp_rank);
  return n;
}

}  // namespace msinfer::runtime
