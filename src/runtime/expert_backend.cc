#include "msinfer/runtime/expert_backend.h"

#include <algorithm>

namespace msinfer::runtime {

Status LocalExperts::start(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed) {
  if (static_cast<int>(out_.size()) <= micro_batch) out_.resize(micro_batch + 1);
  std::vector<float>& out = out_[micro_batch];
  out.resize(routed.rows() * hidden_);
  for (int64_t e = 0; e < routed.experts; ++e) {
    const int64_t off = routed.expert_offset[e], n = routed.expert_rows(e);
    if (n > 0) {
      routed_.add(layer, static_cast<int>(e), n);
      runner_.forward(layer, static_cast<int>(e), routed.send.data() + off * hidden_, n,
                      out.data() + off * hidden_);
    }
  }
  return ok_status();
}

Status LocalExperts::finish(int micro_batch, int layer, const kernels::cpu::RoutedBatch& routed,
                            float* results) {
  const std::vector<float>& out = out_[micro_batch];
  std::copy(out.begin(), out.begin() + routed.rows() * hidden_, results);
  return ok_status();
}

}  // namespace msinfer::runtime
