// Attention tensor parallelism within one attention replica (docs/RUNTIME.md,
// "Attention tensor parallelism"): rank 0's AttentionTpLeader and the serve
// loop of ranks 1..tp-1.
#include "internal/attention_tp.h"

#include <unistd.h>

#include <cstring>

#include "msinfer/core/process.h"

namespace msinfer::runtime::internal {
namespace {

// Ranks 1..tp-1 of attention replica `index`: serve rank 0's layers until
// the router says exit (or closes the command channel).
class AttentionTpRank {
 public:
  AttentionTpRank(const WorkerConfig& c, int index, int tp_rank, int in_fd, int out_fd)
      : c_(c),
        index_(index),
        tp_rank_(tp_rank),
        me_(attention_process_name(index, tp_rank, c.tp_attention)),
        channel_(in_fd, out_fd, me_) {}

  Status run(comm::Bootstrap& boot) {
    MSI_RETURN_IF_ERROR(load());
    MSI_RETURN_IF_ERROR(connect(boot));
    return serve();
  }

 private:
  Status load() {
    model::LoadOptions lo;
    lo.all_experts = false;
    lo.weights = c_.weights;
    lo.attention_tp_rank = tp_rank_;
    lo.attention_tp_size = c_.tp_attention;
    MSI_ASSIGN_OR_RETURN(w_, model::ModelWeights::load(c_.model_dir, lo));
    MSI_ASSIGN_OR_RETURN(
        KvCache kv,
        KvCache::create(attention_tp_config(*w_), c_.engine.kv_cache_bytes, c_.engine.block_size));
    kv_ = std::make_unique<KvCache>(std::move(kv));
    runner_ = std::make_unique<AttentionRunner>(*w_);
    row_bytes_ = w_->config().hidden * 4;
    stats_ = std::make_unique<WorkerStats>(c_.engine.micro_batches, w_->config().layers);
    return ok_status();
  }

  Status connect(comm::Bootstrap& boot) {
    const ModelConfig& mc = w_->config();
    const int tp = c_.tp_attention;
    MSI_ASSIGN_OR_RETURN(auto transport, internal::make_transport(c_));
    ep_ = std::make_unique<comm::M2NEndpoint>(std::move(transport),
                                              std::chrono::milliseconds(c_.timeout_ms));
    ep_->set_yield_when_idle(comm::oversubscribed(comm::local_process_count(c_.processes())));
    broadcast_ =
        std::make_unique<comm::M2NReceiver>(internal::tp_broadcast_shape(c_, mc), tp_rank_ - 1);
    partial_ = std::make_unique<comm::M2NSender>(internal::tp_partial_shape(c_, mc), tp_rank_ - 1);
    MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, broadcast_->attach(*ep_));
    MSI_RETURN_IF_ERROR(partial_->attach(*ep_));
    // The deployment's allgathers, in order: the experts' wiring (a card
    // nobody reads), the expert shards' reduce channel, then this replica's.
    MSI_RETURN_IF_ERROR(internal::wire(boot, *ep_, nullptr, region, 0, 0));
    if (internal::has_reduce_channel(c_)) {
      MSI_RETURN_IF_ERROR(internal::wire(boot, *ep_, nullptr, region, 0, 0));
    }
    MSI_RETURN_IF_ERROR(internal::wire(boot, *ep_, partial_.get(), region, index_ * tp, 1));
    const double rss_mb = read_process_memory().rss_bytes / 1048576.0;
    const double weights_mb = w_->packed_bytes() / 1048576.0;
    std::fprintf(stderr,
                 "msinfer: %s ready (pid %d): heads %d..%d; RSS %.0f MiB (weights %.1f MiB)\n",
                 me_.c_str(), ::getpid(), tp_rank_ * (mc.heads / tp),
                 (tp_rank_ + 1) * (mc.heads / tp) - 1, rss_mb, weights_mb);
    channel_.send(control::Ready::of(index_, rss_mb, weights_mb));
    return ok_status();
  }

  Status serve() {
    int64_t idle = 0, rounds = 0, idle_since_ns = internal::wall_ns();
    while (true) {
      if (idle > 64 || (++rounds & 1023) == 0) {
        MSI_ASSIGN_OR_RETURN(bool stop, internal::serve_commands(channel_, stats_.get()));
        if (stop) return ok_status();
      }
      size_t got = 0;
      MSI_RETURN_IF_ERROR(ep_->progress(&got));
      if (broadcast_->all_arrived(0)) {
        MSI_RETURN_IF_ERROR(serve_layer());
        idle_since_ns = internal::wall_ns();
        idle = 0;
        continue;
      }
      if (got > 0) {
        idle = 0;
      } else if (++idle > 2000) {
        internal::idle_pause(idle_since_ns);
      } else {
        ep_->relax(idle);
      }
    }
  }

  // Rank 0's message for one layer: its header read into b_ (positions and
  // block tables, checked against this rank's KV cache), then this rank's
  // heads' partial o_proj output sent back.
  Status serve_layer() {
    const auto unit_from = std::chrono::steady_clock::now();
    MSI_RETURN_IF_ERROR(broadcast_->verify(0, seq_));
    const uint8_t* msg = broadcast_->data(0, 0);
    int32_t layer = 0, T = 0, hdr = 0;
    MSI_RETURN_IF_ERROR(read_header(msg, broadcast_->rows(0, 0), &layer, &T, &hdr));
    MSI_RETURN_IF_ERROR(partial_->wait_sent(0));
    MSI_RETURN_IF_ERROR(runner_->attention_partial(
        layer, b_, *kv_, reinterpret_cast<const float*>(msg + hdr * row_bytes_),
        reinterpret_cast<float*>(partial_->buffer(0, 0))));
    broadcast_->release(0);
    stats_->tokens += layer == 0 ? T : 0;
    stats_->tp_reduce_bytes_sent += T * row_bytes_;
    MSI_RETURN_IF_ERROR(partial_->send(0, seq_, {T}));
    ++seq_;
    stats_->busy_s += internal::seconds_since(unit_from);
    return ok_status();
  }

  Status read_header(const uint8_t* msg, int64_t rows, int32_t* layer, int32_t* T, int32_t* hdr) {
    const ModelConfig& mc = w_->config();
    auto word = [&](int64_t i) {
      int32_t v;
      std::memcpy(&v, msg + i * 4, 4);
      return v;
    };
    if (rows < 1 || rows * row_bytes_ < 12) return malformed("no header");
    *layer = word(0);
    *T = word(1);
    *hdr = word(2);
    if (*layer < 0 || *layer >= mc.layers || *T < 1 || *hdr < 1 || *hdr + int64_t{*T} != rows) {
      return malformed("bad header");
    }
    b_.clear();
    tables_.assign(static_cast<size_t>(*T), {});
    // The layer's KV group: its tables hold KvCache::kFreed for the blocks
    // wholly before a token's window, which this rank's kernels never read.
    const int group = kv_->layer_group(*layer);
    const int64_t window = kv_->group_window(group);
    std::vector<const int32_t*>& group_tables = b_.tables_of(group);
    int64_t at = 3;
    const int64_t words = *hdr * row_bytes_ / 4;
    for (int32_t t = 0; t < *T; ++t) {
      if (at + 2 > words) return malformed("header too short");
      const int32_t pos = word(at), n = word(at + 1);
      at += 2;
      if (pos < 0 || pos >= mc.max_position_embeddings || n != pos / kv_->block_size() + 1 ||
          at + n > words) {
        return malformed("bad position or block table");
      }
      for (int32_t i = 0; i < n; ++i) {
        const int32_t blk = word(at + i);
        const bool released = blk == KvCache::kFreed && window > 0 &&
                              (int64_t{i} + 1) * kv_->block_size() <= pos - window + 1;
        if (!released && (blk < 0 || blk >= kv_->total_blocks())) {
          return malformed("block id out of range");
        }
        tables_[t].push_back(blk);
      }
      at += n;
      b_.ids.push_back(0);  // unused: rank 0 embeds
      b_.positions.push_back(pos);
      group_tables.push_back(tables_[t].data());
    }
    return ok_status();
  }

  Status malformed(const std::string& what) const {
    return internal_error(me_ + ": malformed message from " +
                          attention_process_name(index_, 0, c_.tp_attention) + ": " + what);
  }

  const WorkerConfig& c_;
  const int index_, tp_rank_;
  const std::string me_;
  control::WorkerChannel channel_;
  std::unique_ptr<model::ModelWeights> w_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<AttentionRunner> runner_;
  std::unique_ptr<comm::M2NEndpoint> ep_;
  std::unique_ptr<comm::M2NReceiver> broadcast_;
  std::unique_ptr<comm::M2NSender> partial_;
  std::unique_ptr<WorkerStats> stats_;
  int64_t row_bytes_ = 0;
  TokenBatch b_;
  std::vector<std::vector<int32_t>> tables_;
  uint32_t seq_ = 0;
};

}  // namespace

AttentionTpLeader::AttentionTpLeader(const WorkerConfig& c, const ModelConfig& mc, int index,
                                     WorkerStats* stats, comm::M2NEndpoint& ep)
    : c_(c),
      index_(index),
      hidden_(mc.hidden),
      stats_(stats),
      ep_(ep),
      broadcast_(tp_broadcast_shape(c, mc), 0),
      partials_(tp_partial_shape(c, mc), 0) {}

Status AttentionTpLeader::attach(comm::Bootstrap& boot) {
  MSI_RETURN_IF_ERROR(broadcast_.attach(ep_));
  MSI_ASSIGN_OR_RETURN(comm::RemoteRegion region, partials_.attach(ep_));
  return internal::wire(boot, ep_, &broadcast_, region, index_ * c_.tp_attention + 1,
                        c_.tp_attention - 1);
}

Status AttentionTpLeader::start(int l, const TokenBatch& b, const int32_t* const* tables,
                                const float* h) {
  const int64_t T = b.size(), row_bytes = hidden_ * 4;
  MSI_RETURN_IF_ERROR(broadcast_.wait_sent(0));
  words_.assign({l, static_cast<int32_t>(T), 0});
  for (int64_t t = 0; t < T; ++t) {
    const int32_t pos = b.positions[t];
    const int32_t n = static_cast<int32_t>(pos / c_.engine.block_size + 1);
    words_.push_back(pos);
    words_.push_back(n);
    words_.insert(words_.end(), tables[t], tables[t] + n);
  }
  const int64_t hdr = (static_cast<int64_t>(words_.size()) * 4 + row_bytes - 1) / row_bytes;
  words_[2] = static_cast<int32_t>(hdr);
  if (hdr + T > broadcast_.shape().max_rows) {
    return resource_exhausted(attention_process_name(index_, 0, c_.tp_attention) + ": " +
                              std::to_string(hdr + T) + " rows exceed one tp message");
  }
  uint8_t* buf = broadcast_.buffer(0, 0);
  std::memset(buf, 0, static_cast<size_t>(hdr * row_bytes));
  std::memcpy(buf, words_.data(), words_.size() * 4);
  std::memcpy(buf + hdr * row_bytes, h, static_cast<size_t>(T * row_bytes));
  for (int r = 1; r + 1 < c_.tp_attention; ++r) {
    std::memcpy(broadcast_.buffer(0, r), buf, static_cast<size_t>((hdr + T) * row_bytes));
  }
  stats_->tp_reduce_bytes_sent += (hdr + T) * row_bytes * (c_.tp_attention - 1);
  return broadcast_.send(0, seq_, std::vector<int64_t>(c_.tp_attention - 1, hdr + T));
}

Status AttentionTpLeader::add_partials(int l, int64_t T, float* o) {
  Status s = partials_.wait(0, seq_);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    std::string m;
    for (int r : partials_.missing(0)) {
      m += (m.empty() ? "" : ", ") + attention_process_name(index_, r + 1, c_.tp_attention);
    }
    return Status(StatusCode::kUnavailable, attention_process_name(index_, 0, c_.tp_attention) +
                                                ": no partial attention output from " + m +
                                                " for layer " + std::to_string(l) + " within " +
                                                std::to_string(c_.timeout_ms) + " ms");
  }
  MSI_RETURN_IF_ERROR(s);
  for (int r = 0; r + 1 < c_.tp_attention; ++r) {
    if (partials_.rows(0, r) != T) {
      return internal_error(attention_process_name(index_, r + 1, c_.tp_attention) + " sent " +
                            std::to_string(partials_.rows(0, r)) + " rows, expected " +
                            std::to_string(T));
    }
    const auto* p = reinterpret_cast<const float*>(partials_.data(0, r));
    for (int64_t i = 0; i < T * hidden_; ++i) o[i] += p[i];
  }
  partials_.release(0);
  ++seq_;
  return ok_status();
}

Status run_attention_tp_rank(const WorkerConfig& c, int index, int tp_rank, comm::Bootstrap& boot,
                             int in_fd, int out_fd) {
  AttentionTpRank rank(c, index, tp_rank, in_fd, out_fd);
  return rank.run(boot);
}

}  // namespace msinfer::runtime::internal
