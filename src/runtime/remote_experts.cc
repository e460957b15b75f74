#include "internal/remote_experts.h"

#include <cstring>

#include "msinfer/runtime/balance.h"

namespace msinfer::runtime::internal {

void RemoteExperts::set_placement(const Placement& p) {
  placement_ = p;
  local_.clear();
  for (int w = 0; w < c_.expert_workers; ++w) local_.push_back(p.experts_on(w));
  expert_rows_.assign(p.replicas.size(), 0);
}

Status RemoteExperts::attach(comm::Bootstrap& boot) {
  MSI_RETURN_IF_ERROR(dispatch_.attach(ep_));
  MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, combine_.attach(ep_));
  combine_region_ = region;
  MSI_RETURN_IF_ERROR(
      wire(boot, ep_, &dispatch_, region, c_.attention_processes(), c_.expert_processes()));
  if (has_reduce_channel(c_)) {  // take part in the shards' wiring
    MSI_RETURN_IF_ERROR(wire(boot, ep_, nullptr, region, 0, 0));
  }
  return ok_status();
}

Status RemoteExperts::drop_expert_worker(int w, bool mid_step, bool keep_placement) {
  if (w < 0 || w >= c_.expert_workers || c_.tp_expert != 1) {
    return invalid_argument("attention worker " + std::to_string(index_) +
                            ": cannot drop expert worker " + std::to_string(w));
  }
  if (!keep_placement) {
    MSI_ASSIGN_OR_RETURN(Placement p, placement_.emptied(w));
    set_placement(p);
  }
  combine_.drop_sender(w);
  dispatch_.drop_receiver(w);
  discard_ = discard_ || mid_step;
  return ok_status();
}

Status RemoteExperts::set_units(const std::vector<int64_t>& served) {
  if (!steps_done_.empty() || served.size() != static_cast<size_t>(c_.engine.micro_batches)) {
    return invalid_argument("attention worker " + std::to_string(index_) + ": units: expected " +
                            std::to_string(c_.engine.micro_batches) +
                            " counts before the first unit");
  }
  for (int k = 0; k < c_.engine.micro_batches; ++k) steps_done_[k] = served[static_cast<size_t>(k)];
  return ok_status();
}

Status RemoteExperts::add_expert_worker(int w, const comm::PeerCard& card,
                                        const std::vector<std::pair<int, double>>& shares) {
  if (w < 0 || w >= c_.expert_workers || !dispatch_.dropped(w)) {
    return invalid_argument("attention worker " + std::to_string(index_) + ": expert worker " +
                            std::to_string(w) + " was not dropped");
  }
  MSI_ASSIGN_OR_RETURN(Placement p, placement_.with_worker(w, shares));
  MSI_ASSIGN_OR_RETURN(int handle, ep_.transport().connect(card.address));
  dispatch_.set_receiver(w, handle, card.region);
  dispatch_.restore_receiver(w);
  combine_.restore_sender(w);
  set_placement(p);
  return ok_status();
}

Status RemoteExperts::start(int k, int l, const kernels::cpu::RoutedBatch& r) {
  // Since the previous call returned: micro-batch k's attention for layer l.
  stats_->t_a.add(k, l, seconds_since(last_return_));
  stats_->gemm_flops += layer_flops_ * static_cast<double>(r.tokens);
  if (l == 0) stats_->tokens += r.tokens;
  const int64_t sent_ns = wall_ns();
  const int W = c_.expert_workers, tp = c_.tp_expert;
  const int64_t row_bytes = hidden_ * 4;
  // Split each replicated expert's rows over its replicas by predicted
  // worker load (split_rows), then lay out each destination's message.
  for (int e = 0; e < static_cast<int>(expert_rows_.size()); ++e)
    expert_rows_[e] = r.expert_rows(e);
  const std::vector<std::vector<int64_t>> take = split_rows(placement_, expert_rows_);
  auto& plan = plans_[k];
  plan.assign(W, {});
  // Expert worker w's message goes to each of its tp shards (receiver
  // w * tp + r): every shard needs every row (column-parallel gate/up).
  std::vector<int64_t> rows(static_cast<size_t>(W) * tp, 0);
  for (int w = 0; w < W; ++w) {
    uint8_t* buf = dispatch_.buffer(k, w * tp);
    const size_t n_counts = local_[w].size() + (shared_ ? 1 : 0);
    const int64_t hdr = header_rows(static_cast<int64_t>(n_counts), row_bytes);
    std::vector<int32_t> counts(n_counts, 0);
    int64_t at = hdr;
    for (size_t i = 0; i < local_[w].size(); ++i) {
      const int e = local_[w][i];
      const int64_t off = r.expert_offset[e];
      // This replica's [b, end) of the expert's rows.
      int64_t b = 0, end = 0;
      for (size_t j = 0; j < placement_.replicas[e].size(); ++j) {
        end = b + take[e][j];
        if (placement_.replicas[e][j].first == w) break;
        b = end;
      }
      counts[i] = static_cast<int32_t>(end - b);
      if (at + (end - b) > dispatch_.shape().max_rows) {
        return resource_exhausted("micro-batch too large for one M2N message (" +
                                  std::to_string(at + end - b) + " rows)");
      }
      if (end > b) {  // none: r.send may be empty, its data() null (memcpy's UB)
        std::memcpy(buf + at * row_bytes, r.send.data() + (off + b) * hidden_,
                    static_cast<size_t>((end - b) * row_bytes));
      }
      plan[w].push_back({off + b, end - b, at - hdr});
      at += end - b;
    }
    // The shared experts (expert experts_ of r: every token of a MoE layer,
    // none in a dense one) go whole to the worker that holds this layer's.
    if (shared_ && r.experts > experts_ && w == shared_expert_worker(l, W)) {
      const int64_t off = r.expert_offset[experts_], n = r.expert_rows(experts_);
      counts.back() = static_cast<int32_t>(n);
      if (at + n > dispatch_.shape().max_rows) {
        return resource_exhausted("micro-batch too large for one M2N message (" +
                                  std::to_string(at + n) + " rows)");
      }
      if (n > 0) {
        std::memcpy(buf + at * row_bytes, r.send.data() + off * hidden_,
                    static_cast<size_t>(n * row_bytes));
      }
      plan[w].push_back({off, n, at - hdr});
      at += n;
    }
    std::memset(buf, 0, static_cast<size_t>(hdr * row_bytes));
    if (!counts.empty()) std::memcpy(buf, counts.data(), counts.size() * 4);
    std::memcpy(buf + hdr * row_bytes - 8, &sent_ns, 8);
    for (int r = 0; r < tp; ++r) {
      if (r > 0)
        std::memcpy(dispatch_.buffer(k, w * tp + r), buf, static_cast<size_t>(at * row_bytes));
      rows[static_cast<size_t>(w) * tp + r] = at;
    }
  }
  const auto waited_from = std::chrono::steady_clock::now();
  MSI_RETURN_IF_ERROR(dispatch_.wait_sent(k));  // slot k's previous send (flow control)
  stats_->wait_s += seconds_since(waited_from);
  for (int64_t n : rows) stats_->m2n_bytes_sent += n * row_bytes;
  Status s = dispatch_.send(k, seq(k, l), rows);
  last_return_ = std::chrono::steady_clock::now();
  return s;
}

Status RemoteExperts::finish(int k, int l, const kernels::cpu::RoutedBatch& r, float* results) {
  const auto waited_from = std::chrono::steady_clock::now();
  Status s = combine_.wait(k, seq(k, l), between_polls_);
  stats_->wait_s += seconds_since(waited_from);
  if (!s.ok()) {
    if (s.code() == StatusCode::kDeadlineExceeded) {
      std::string m;
      for (int sender : combine_.missing(k)) {
        m += (m.empty() ? "" : ", ") + answering_name(sender);
      }
      return Status(StatusCode::kUnavailable,
                    "attention worker " + std::to_string(index_) + ": no answer from " + m +
                        " for layer " + std::to_string(l) + ", micro-batch " + std::to_string(k) +
                        " within " + std::to_string(c_.timeout_ms) + " ms");
    }
    return s;
  }
  // With attention-sum every shard of worker w answered with its partial
  // output: they are added here in shard order (the allreduce mode's shard 0
  // adds in the same order, so both modes give the same bits).
  const int shards = c_.tp_expert_reduce == ExpertReduce::kAttentionSum ? c_.tp_expert : 1;
  for (int w = 0; w < c_.expert_workers; ++w) {
    for (int r = 0; r < shards; ++r) {
      const auto* data = reinterpret_cast<const float*>(combine_.data(k, w * shards + r));
      for (const auto& piece : plans_[k][w]) {
        if (piece.rows == 0) continue;  // (results may be null then)
        float* dst = results + piece.send_row * hidden_;
        const float* src = data + piece.reply_row * hidden_;
        if (r == 0) {
          std::memcpy(dst, src, static_cast<size_t>(piece.rows * hidden_) * 4);
        } else {
          for (int64_t i = 0; i < piece.rows * hidden_; ++i) dst[i] += src[i];
        }
      }
    }
  }
  combine_.release(k);
  ++steps_done_[k];
  (void)r;
  last_return_ = std::chrono::steady_clock::now();
  return ok_status();
}

std::string RemoteExperts::answering_name(int s) const {
  if (c_.tp_expert > 1 && c_.tp_expert_reduce == ExpertReduce::kAttentionSum) {
    return expert_process_name(s / c_.tp_expert, s % c_.tp_expert, c_.tp_expert);
  }
  return "expert worker " + std::to_string(s);
}

}  // namespace msinfer::runtime::internal
