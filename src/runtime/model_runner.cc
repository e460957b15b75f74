#include "msinfer/runtime/model_runner.h"

#include <cmath>
#include <cstring>

#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/kernels/cpu/grouped_topk.h"
#include "msinfer/kernels/cpu/mla_attention.h"
#include "msinfer/kernels/cpu/ops.h"
#include "msinfer/kernels/cpu/window_attention.h"
#include "msinfer/kernels/cpu/yarn_rope.h"

namespace msinfer::runtime {

namespace k = kernels::cpu;

namespace {

// The MoE side of DeepSeek-V2/V3 and GLM-4.5: dense first layers, shared
// experts, grouped_topk routing (vs. fused_gate's softmax top-K).
bool deepseek_moe(const ModelConfig& c) {
  return c.kv_lora_rank > 0 || c.architecture == "Glm4MoeForCausalLM";
}

// RoPE on the first rd of the hd dims of each head of x[T, heads, hd] (GLM's
// partial rotary; HF's rotate_half over those rd dims, base theta over rd):
// gathered into scratch [T, heads, rd], rotated by ops.h's rope, put back.
void rope_partial(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t hd,
                  int64_t rd, double theta, std::vector<float>& scratch) {
  scratch.resize(T * heads * rd);
  for (int64_t r = 0; r < T * heads; ++r) {
    std::memcpy(scratch.data() + r * rd, x + r * hd, sizeof(float) * rd);
  }
  k::rope(scratch.data(), positions, T, heads, rd, theta);
  for (int64_t r = 0; r < T * heads; ++r) {
    std::memcpy(x + r * hd, scratch.data() + r * rd, sizeof(float) * rd);
  }
}

}  // namespace

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
  if (c.kv_lora_rank > 0) return mla_partial(l, b, kv, h, o);
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
  if (!L.qkv_bias.empty()) {  // attention_bias: one row of q, k, v biases
    for (int64_t t = 0; t < T; ++t) {
      k::add_inplace(qkv_.data() + t * (qn + 2 * kn), L.qkv_bias.data(), qn + 2 * kn);
    }
  }
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
  if (c.yarn_factor > 0) {  // gpt-oss: YaRN in the rotate_half layout
    if (inv_freq_.empty()) {
      inv_freq_ = k::yarn_inv_freq(hd, c.rope_theta, c.yarn_factor, c.yarn_original_max_position,
                                   c.yarn_beta_fast, c.yarn_beta_slow, c.yarn_truncate);
    }
    const float mscale = static_cast<float>(c.yarn_rope_mscale());
    k::rope_rotate_half(q_.data(), b.positions.data(), T, H, hd, inv_freq_.data(), mscale);
    k::rope_rotate_half(k_.data(), b.positions.data(), T, KV, hd, inv_freq_.data(), mscale);
  } else if (const int64_t rd = c.rotary_dim(); rd < hd) {  // partial rotary (GLM-4.5)
    rope_partial(q_.data(), b.positions.data(), T, H, hd, rd, c.rope_theta, rope_);
    rope_partial(k_.data(), b.positions.data(), T, KV, hd, rd, c.rope_theta, rope_);
  } else {
    k::rope(q_.data(), b.positions.data(), T, H, hd, c.rope_theta);
    k::rope(k_.data(), b.positions.data(), T, KV, hd, c.rope_theta);
  }
  const k::PagedKvLayer layer = kv.layer(l);
  // Layer l's group's tables: a sliding group's entries before a token's
  // window are released (KvCache::kFreed), and the window kernel reads none.
  const int g = kv.layer_group(l);
  const int32_t* const* tables = b.tables(g);
  k::write_kv(layer, k_.data(), v_.data(), T, b.positions.data(), tables);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t window = c.attention_window(l);
  MSI_CHECK(kv.group_window(g) == 0 || kv.group_window(g) == window)
      << "layer " << l << " attends to " << window << " positions, its KV group keeps "
      << kv.group_window(g);
  if (window > 0 || !L.sinks.empty()) {
    k::paged_attention_window(q_.data(), T, H, layer, b.positions.data(), tables, scale, window,
                              L.sinks.empty() ? nullptr : L.sinks.data(), attn_.data());
  } else {
    k::paged_attention(q_.data(), T, H, layer, b.positions.data(), tables, scale, attn_.data());
  }
  L.o.forward(attn_.data(), T, o);
  if (!L.o_bias.empty()) {
    for (int64_t t = 0; t < T; ++t) k::add_inplace(o + t * c.hidden, L.o_bias.data(), c.hidden);
  }
  return ok_status();
}

Status AttentionRunner::mla_partial(int l, const TokenBatch& b, KvCache& kv, const float* h,
                                    float* o) {
  const ModelConfig& c = w_.config();
  const model::LayerWeights& L = w_.layers()[l];
  // This rank's heads (all of them at attention tp 1); the latent is whole.
  const int64_t T = b.size(), H = c.heads / w_.attention_tp_size(), nope = c.qk_nope_head_dim,
                rope = c.qk_rope_head_dim,
                vd = c.v_head_dim, R = c.kv_lora_rank, QL = c.q_lora_rank;
  const int64_t qk = nope + rope;
  const int64_t first = QL > 0 ? QL : H * qk;  // columns of qkv before the kv_a part
  const int64_t cols = first + R + rope;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (inv_freq_.empty()) {
    inv_freq_ = k::yarn_inv_freq(rope, c.rope_theta, c.yarn_factor, c.yarn_original_max_position,
                                 c.yarn_beta_fast, c.yarn_beta_slow);
  }
  const float rope_mscale = static_cast<float>(c.yarn_rope_mscale());
  qkv_.resize(T * cols);
  q_.resize(T * H * qk);
  latent_.resize(T * (R + rope));
  k_.resize(T * nope * H);
  q_pe_.resize(T * H * rope);
  q_lat_.resize(T * H * R);
  out_lat_.resize(T * H * R);
  attn_.resize(T * H * vd);

  L.qkv.forward(h, T, qkv_.data());
  if (QL > 0) {
    qa_.resize(T * QL);
    for (int64_t t = 0; t < T; ++t) {
      k::rms_norm(qkv_.data() + t * cols, L.q_a_norm.data(), 1, QL, eps, qa_.data() + t * QL);
    }
    L.q_b.forward(qa_.data(), T, q_.data());
  } else {
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(q_.data() + t * H * qk, qkv_.data() + t * cols, sizeof(float) * H * qk);
    }
  }
  // The cache row: normed latent, then the roped shared key.
  for (int64_t t = 0; t < T; ++t) {
    const float* kv_a = qkv_.data() + t * cols + first;
    float* row = latent_.data() + t * (R + rope);
    k::rms_norm(kv_a, L.kv_a_norm.data(), 1, R, eps, row);
    std::memcpy(row + R, kv_a + R, sizeof(float) * rope);
    k::rope_interleaved(row + R, b.positions.data() + t, 1, 1, rope, inv_freq_.data(), rope_mscale);
  }
  const k::PagedKvLayer layer = kv.layer(l);
  k::mla_write_latent(layer, latent_.data(), T, b.positions.data(), b.block_tables.data());
  // Split q per head into its non-positional and roped parts.
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* qh = q_.data() + (t * H + hh) * qk;
      std::memcpy(k_.data() + (t * H + hh) * nope, qh, sizeof(float) * nope);
      std::memcpy(q_pe_.data() + (t * H + hh) * rope, qh + nope, sizeof(float) * rope);
    }
  }
  k::rope_interleaved(q_pe_.data(), b.positions.data(), T, H, rope, inv_freq_.data(), rope_mscale);
  k::mla_absorb_query(k_.data(), T, H, nope, R, L.w_uk.data(), q_lat_.data());
  const double scale = std::pow(static_cast<double>(qk), -0.5) * c.yarn_attention_mscale() *
                       c.yarn_attention_mscale();
  k::mla_attention(q_lat_.data(), q_pe_.data(), T, H, R, rope, layer, b.positions.data(),
                   b.block_tables.data(), static_cast<float>(scale), out_lat_.data());
  k::mla_value_up(out_lat_.data(), T, H, R, vd, L.w_uv.data(), attn_.data());
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
  if (peers) MSI_RETURN_IF_ERROR(peers_->start(l, b, b.tables(kv.layer_group(l)), h_.data()));
  MSI_RETURN_IF_ERROR(attention_partial(l, b, kv, h_.data(), o_.data()));
  if (peers) MSI_RETURN_IF_ERROR(peers_->add_partials(l, T, o_.data()));
  k::add_inplace(x, o_.data(), T * h);

  k::rms_norm(x, L.post_attn_norm.data(), T, h, eps, h_.data());
  if (deepseek_moe(c)) {             // DeepSeek, GLM-4.5
    if (!L.dense_ffn.w13.empty()) {  // the dense MLP or the shared experts, on every token
      ffn_.resize(T * h);
      k::expert_ffn(L.dense_ffn.w13, L.dense_ffn.w2, h_.data(), T, ffn_.data());
    }
    if (L.router.empty()) {  // a dense layer: nothing routed
      routed->topk_expert.clear();
      routed->topk_weight.clear();
      k::route_rows(T, c.experts, 0, expert_dest, destinations, h_.data(), h, routed);
    } else {
      L.router.forward(h_.data(), T, router_.data());
      k::GroupedTopK g;
      g.experts = c.experts;
      g.top_k = c.top_k;
      if (c.topk_method != ModelConfig::TopkMethod::kGreedy) {
        g.n_group = c.n_group;
        g.topk_group = c.topk_group;
      }
      g.sigmoid = c.scoring_func == ModelConfig::ScoringFunc::kSigmoid;
      g.bias = L.router_bias.empty() ? nullptr : L.router_bias.data();
      g.group_by_top2 = c.topk_method == ModelConfig::TopkMethod::kNoauxTc;
      g.normalize = c.norm_topk_prob;
      g.scale = static_cast<float>(c.routed_scaling_factor);
      routed->topk_expert.resize(T * c.top_k);
      routed->topk_weight.resize(T * c.top_k);
      k::grouped_topk(router_.data(), T, g, routed->topk_expert.data(), routed->topk_weight.data());
      if (c.shared_expert_ffn > 0 && L.dense_ffn.w13.empty()) {
        // The shared experts run on an expert worker (--shared-experts
        // expert): expert id E, chosen by every token with weight 1 (the
        // reference adds them unscaled) in slot 0, so combine adds them to x
        // before the routed experts, the order of the lines below.
        const int64_t K = c.top_k, K1 = K + 1;
        routed->topk_expert.resize(T * K1);
        routed->topk_weight.resize(T * K1);
        for (int64_t t = T - 1; t >= 0; --t) {  // spread [T, K] to [T, K + 1] in place
          for (int64_t j = K - 1; j >= 0; --j) {
            routed->topk_expert[t * K1 + 1 + j] = routed->topk_expert[t * K + j];
            routed->topk_weight[t * K1 + 1 + j] = routed->topk_weight[t * K + j];
          }
          routed->topk_expert[t * K1] = static_cast<int32_t>(c.experts);
          routed->topk_weight[t * K1] = 1.0f;
        }
        k::route_rows(T, c.experts + 1, K1, expert_dest, destinations, h_.data(), h, routed);
      } else {
        k::route_rows(T, c.experts, c.top_k, expert_dest, destinations, h_.data(), h, routed);
      }
    }
    // After the send rows are copied: the routed results are added by combine.
    if (!L.dense_ffn.w13.empty()) k::add_inplace(x, ffn_.data(), T * h);
    return ok_status();
  }
  L.router.forward(h_.data(), T, router_.data());
  if (!L.router_logit_bias.empty()) {  // gpt-oss: softmax over the top-K biased logits
    for (int64_t t = 0; t < T; ++t) {
      k::add_inplace(router_.data() + t * c.experts, L.router_logit_bias.data(), c.experts);
    }
    routed->topk_expert.resize(T * c.top_k);
    routed->topk_weight.resize(T * c.top_k);
    k::topk_softmax(router_.data(), T, c.experts, c.top_k, routed->topk_expert.data(),
                    routed->topk_weight.data());
    k::route_rows(T, c.experts, c.top_k, expert_dest, destinations, h_.data(), h, routed);
    return ok_status();
  }
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
  if (e == w_.config().experts) {  // the shared experts (--shared-experts expert)
    const model::ExpertWeights& sw = w_.layers()[l].dense_ffn;
    MSI_CHECK(!sw.w13.empty()) << "the shared experts of layer " << l << " are not loaded here";
    k::expert_ffn(sw.w13, sw.w2, rows, n, out);
    return;
  }
  const model::ExpertWeights& ew = w_.layers()[l].experts[e];
  MSI_CHECK(!ew.w13.empty()) << "expert " << e << " of layer " << l << " is not loaded here";
  const ModelConfig& c = w_.config();
  if (c.swiglu_limit > 0) {  // gpt-oss
    k::expert_ffn_clamped(ew.w13, ew.b13.data(), ew.w2, ew.b2.empty() ? nullptr : ew.b2.data(),
                          {static_cast<float>(c.swiglu_alpha), static_cast<float>(c.swiglu_limit)},
                          rows, n, out);
    return;
  }
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
