#include "msinfer/runtime/expert_backend.h"

#include <algorithm>

namespace msinfer::runtime {

Status LocalExperts::start(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed) {
  if (static_cast<int>(out_.size()) <= micro_batch) out_.resize(micro_batch + 1);
  std::vector<float>& out = out_[micro_batch];
  out.resize(routed.rows() * hidden_);
  // Co-located, expert e's rows are at expert_offset[e] in id order (one
  // destination per expert): all experts go to the backend in one call.
  all_.resize(routed.experts);
  offsets_.resize(routed.experts + 1);
  for (int64_t e = 0; e < routed.experts; ++e) {
    all_[e] = static_cast<int>(e);
    offsets_[e] = routed.expert_offset[e];
    if (routed.expert_rows(e) > 0) routed_.add(layer, static_cast<int>(e), routed.expert_rows(e));
  }
  offsets_[routed.experts] = routed.expert_offset[routed.experts];
  return compute_->forward_group(layer, all_, offsets_, routed.send.data(), out.data());
}

Status LocalExperts::finish(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed,
                            float* results) {
  const std::vector<float>& out = out_[micro_batch];
  std::copy(out.begin(), out.begin() + routed.rows() * hidden_, results);
  return ok_status();
}

}  // namespace msinfer::runtime
