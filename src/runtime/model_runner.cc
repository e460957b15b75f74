#include "msinfer/runtime/model_runner.h"

#include <cmath>
#include <cstring>

#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/kernels/cpu/ops.h"

namespace msinfer::runtime {

namespace k = kernels::cpu;

Status AttentionRunner::embed(const TokenBatch& b, float* x) {
  const int64_t h = w_.config().hidden;
  for (int64_t t = 0; t < b.size(); ++t) w_.embed(b.ids[t], x + t * h);
  return ok_status();
}

ModelConfig attention_tp_config(const model::ModelWeights& w) {
  ModelConfig c = w.config();
  c.kv_heads = c.kv_heads_per_attention_rank(w.attention_tp_size());
  c.heads /= w.attention_tp_size();
  return c;
}

Status AttentionRunner::attention_partial(int l, const TokenBatch& b, KvCache& kv, const float* h,
                                          float* o) {
  const ModelConfig& c = w_.config();
  const model::LayerWeights& L = w_.layers()[l];
  // This rank's heads, as attention_tp_config gives them (without copying the
  // config on every layer of every step).
  const int tp = w_.attention_tp_size();
  const int64_t T = b.size(), hd = c.head_dim, H = c.heads / tp,
                KV = c.kv_heads_per_attention_rank(tp);
  const int64_t qn = H * hd, kn = KV * hd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  qkv_.resize(T * (qn + 2 * kn));
  q_.resize(T * qn);
  k_.resize(T * kn);
  v_.resize(T * kn);
  attn_.resize(T * qn);

  L.qkv.forward(h, T, qkv_.data());
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv_.data() + t * (qn + 2 * kn);
    std::memcpy(q_.data() + t * qn, row, sizeof(float) * qn);
    std::memcpy(k_.data() + t * kn, row + qn, sizeof(float) * kn);
    std::memcpy(v_.data() + t * kn, row + qn + kn, sizeof(float) * kn);
  }
  if (c.qk_norm) {
    k::rms_norm(q_.data(), L.q_norm.data(), T * H, hd, eps, q_.data());
    k::rms_norm(k_.data(), L.k_norm.data(), T * KV, hd, eps, k_.data());
  }
  k::rope(q_.data(), b.positions.data(), T, H, hd, c.rope_theta);
  k::rope(k_.data(), b.positions.data(), T, KV, hd, c.rope_theta);
  const k::PagedKvLayer layer = kv.layer(l);
  k::write_kv(layer, k_.data(), v_.data(), T, b.positions.data(), b.block_tables.data());
  k::paged_attention(q_.data(), T, H, layer, b.positions.data(), b.block_tables.data(),
                     1.0f / std::sqrt(static_cast<float>(hd)), attn_.data());
  L.o.forward(attn_.data(), T, o);
  return ok_status();
}

Status AttentionRunner::attention_and_gate(int l, const TokenBatch& b, KvCache& kv, float* x,
                                           k::RoutedBatch* routed, const int32_t* expert_dest,
                                           int64_t destinations) {
  const ModelConfig& c = w_.config();
  const model::LayerWeights& L = w_.layers()[l];
  const int64_t T = b.size(), h = c.hidden;
  const float eps = static_cast<float>(c.rms_norm_eps);
  h_.resize(T * h);
  o_.resize(T * h);
  router_.resize(T * c.experts);

  k::rms_norm(x, L.input_norm.data(), T, h, eps, h_.data());
  // Attention tp: the other ranks work on their heads while this one does.
  const bool peers = peers_ != nullptr && T > 0;
  if (peers) MSI_RETURN_IF_ERROR(peers_->start(l, b, h_.data()));
  MSI_RETURN_IF_ERROR(attention_partial(l, b, kv, h_.data(), o_.data()));
  if (peers) MSI_RETURN_IF_ERROR(peers_->add_partials(l, T, o_.data()));
  k::add_inplace(x, o_.data(), T * h);

  k::rms_norm(x, L.post_attn_norm.data(), T, h, eps, h_.data());
  L.router.forward(h_.data(), T, router_.data());
  k::fused_gate(router_.data(), T, c.experts, c.top_k, c.norm_topk_prob, expert_dest,
                destinations, h_.data(), h, routed);
  return ok_status();
}

void AttentionCompute::combine(const k::RoutedBatch& routed, const float* results,
                               float* x) const {
  k::moe_combine(routed, results, x);
}

Status AttentionRunner::logits(const std::vector<const float*>& rows, float* out) {
  const ModelConfig& c = w_.config();
  const int64_t h = c.hidden, n = static_cast<int64_t>(rows.size());
  sel_.resize(n * h);
  for (int64_t i = 0; i < n; ++i) {
    k::rms_norm(rows[i], w_.final_norm().data(), 1, h, static_cast<float>(c.rms_norm_eps),
                sel_.data() + i * h);
  }
  w_.lm_head().forward(sel_.data(), n, out);
  return ok_status();
}

void ExpertRunner::forward(int l, int e, const float* rows, int64_t n, float* out) const {
  const model::ExpertWeights& ew = w_.layers()[l].experts[e];
  MSI_CHECK(!ew.w13.empty()) << "expert " << e << " of layer " << l << " is not loaded here";
  k::expert_ffn(ew.w13, ew.w2, rows, n, out);
}

Status ExpertRunner::forward_group(int l, const std::vector<int>& experts,
                                   const std::vector<int64_t>& offset, const float* rows,
                                   float* out) {
  const int64_t h = w_.config().hidden;
  for (size_t i = 0; i < experts.size(); ++i) {
    const int64_t n = offset[i + 1] - offset[i];
    if (n > 0) forward(l, experts[i], rows + offset[i] * h, n, out + offset[i] * h);
  }
  return ok_status();
}

}  // namespace msinfer::runtime
