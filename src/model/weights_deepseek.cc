// DeepSeek-V2/V3 layers (MLA attention), the shared experts of every model
// that has them, and the routed experts of every model but gpt-oss.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "internal/weight_loader.h"
#include "msinfer/core/logging.h"

namespace msinfer::model::internal {

using kernels::cpu::PackedLinear;

// Whether this process holds MoE layer i's shared experts: the attention side
// (rank 0) unless they run on the expert workers; an expert process for the
// layers LoadOptions::shared_expert_layers names.
bool holds_shared_experts(const LoadOptions& o, int i, bool attention_rank0) {
  if (attention_rank0) return o.shared_experts_with_attention;
  return !o.attention && std::find(o.shared_expert_layers.begin(), o.shared_expert_layers.end(),
                                   i) != o.shared_expert_layers.end();
}

// The shared experts of MoE layer i (`ffn` = "model.layers.i.mlp.shared_experts.",
// total width `width`) into L.dense_ffn: whole on the attention side, expert
// tp shard r of tp on an expert process (rows [r W/tp, (r+1) W/tp) of gate
// and up, the same columns of down), in the format of the dense weights so
// both placements compute the same bits.
Status load_shared_experts(Loader& ld, const LoadOptions& o, const std::string& ffn, int64_t width,
                           int64_t h, kernels::cpu::WeightFormat fmt, LayerWeights& L) {
  const int64_t tp = o.attention ? 1 : o.expert_tp_size, r = o.attention ? 0 : o.expert_tp_rank;
  const int64_t f0 = r * (width / tp), f1 = f0 + width / tp;
  MSI_ASSIGN_OR_RETURN(L.dense_ffn.w13,
                       ld.pack_blocks({{ffn + "gate_proj.weight", {width, h}, f0, f1, 0, h},
                                       {ffn + "up_proj.weight", {width, h}, f0, f1, 0, h}},
                                      fmt));
  MSI_ASSIGN_OR_RETURN(L.dense_ffn.w2,
                       ld.pack_blocks({{ffn + "down_proj.weight", {h, width}, 0, h, f0, f1}}, fmt));
  return ok_status();
}

Status load_routed_experts(Loader& ld, const ModelConfig& c, int i, const LoadOptions& options,
                           kernels::cpu::WeightFormat fmt, LayerWeights& L) {
  const int64_t h = c.hidden, F = c.expert_ffn;
  const int64_t tp = options.expert_tp_size, tp_rank = options.expert_tp_rank;
  const int64_t f0 = tp_rank * (F / tp), f1 = f0 + F / tp;
  L.experts.resize(c.experts);
  for (int e = 0; e < c.experts; ++e) {
    const ExpertTensorNames n = expert_tensor_names(c, i, e);
    const bool want =
        options.all_experts ||
        std::find(options.experts.begin(), options.experts.end(), e) != options.experts.end();
    if (!want) {
      for (const auto& s : {n.w1, n.w2, n.w3}) {
        ld.skip(s);
        if (c.fp8_weights) ld.skip(fp8_scale_name(s));
      }
      continue;
    }
    MSI_ASSIGN_OR_RETURN(
        L.experts[e].w13,
        ld.pack_blocks({{n.w1, {F, h}, f0, f1, 0, h}, {n.w3, {F, h}, f0, f1, 0, h}}, fmt));
    MSI_ASSIGN_OR_RETURN(L.experts[e].w2, ld.pack_blocks({{n.w2, {h, F}, 0, h, f0, f1}}, fmt));
  }
  return ok_status();
}

// One DeepSeek-V2/V3 decoder layer: MLA attention, then a dense MLP (layers
// below first_k_dense_replace) or the router (with e_score_correction_bias when
// stored), the routed experts and the shared experts. Attention tp rank r of
// tp holds query heads [r H/tp, (r+1) H/tp): their rows of q_b_proj (or
// q_proj), their halves of kv_b_proj, the same columns of o_proj; q_a_proj,
// kv_a_proj_with_mqa and the two layernorms whole (every rank computes and
// caches the whole latent: MLA has one latent per token, read by every head).
// Ranks > 0 hold nothing else of the layer.
Status load_deepseek_layer(Loader& ld, const ModelConfig& c, int i, const LoadOptions& options,
                           LayerWeights& L) {
  const std::string p = layer_prefix(i), a = p + "self_attn.";
  const kernels::cpu::WeightFormat fmt = dense_format(options.weights);
  const int64_t h = c.hidden, H = c.heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
                vd = c.v_head_dim, R = c.kv_lora_rank, QL = c.q_lora_rank;
  const int64_t E = c.experts;
  const bool moe = c.is_moe_layer(i);
  std::vector<std::string> attention_side = {p + "input_layernorm.weight",
                                             p + "post_attention_layernorm.weight",
                                             a + "q_proj.weight",
                                             a + "q_a_proj.weight",
                                             a + "q_a_layernorm.weight",
                                             a + "q_b_proj.weight",
                                             a + "kv_a_proj_with_mqa.weight",
                                             a + "kv_a_layernorm.weight",
                                             a + "kv_b_proj.weight",
                                             a + "o_proj.weight",
                                             p + "mlp.gate.weight",
                                             p + "mlp.gate.e_score_correction_bias"};
  for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
    attention_side.push_back(p + "mlp." + m + ".weight");
    attention_side.push_back(p + "mlp.shared_experts." + m + ".weight");
  }
  const int64_t atp = options.attention_tp_size, Hl = H / atp;
  const int64_t h0 = options.attention_tp_rank * Hl;  // this rank's first head
  const bool rest = options.attention && options.attention_tp_rank == 0;
  if (!options.attention) {
    for (const auto& n : attention_side) {
      ld.skip(n);
      ld.skip(fp8_scale_name(n));
    }
  } else {
    const int64_t qk = nope + rope;
    if (QL > 0) {
      MSI_ASSIGN_OR_RETURN(L.qkv, ld.pack({{a + "q_a_proj.weight", {QL, h}},
                                           {a + "kv_a_proj_with_mqa.weight", {R + rope, h}}},
                                          fmt));
      MSI_ASSIGN_OR_RETURN(L.q_a_norm, ld.vec(a + "q_a_layernorm.weight", QL));
      MSI_ASSIGN_OR_RETURN(
          L.q_b, ld.pack_blocks(
                     {{a + "q_b_proj.weight", {H * qk, QL}, h0 * qk, (h0 + Hl) * qk, 0, QL}}, fmt));
    } else {
      MSI_ASSIGN_OR_RETURN(
          L.qkv,
          ld.pack_blocks({{a + "q_proj.weight", {H * qk, h}, h0 * qk, (h0 + Hl) * qk, 0, h},
                          {a + "kv_a_proj_with_mqa.weight", {R + rope, h}, 0, R + rope, 0, h}},
                         fmt));
    }
    MSI_ASSIGN_OR_RETURN(L.kv_a_norm, ld.vec(a + "kv_a_layernorm.weight", R));
    MSI_ASSIGN_OR_RETURN(std::vector<bf16> kv_b,
                         ld.weight(a + "kv_b_proj.weight", {H * (nope + vd), R}));
    L.w_uk.resize(static_cast<size_t>(Hl * nope * R));
    L.w_uv.resize(static_cast<size_t>(Hl * vd * R));
    for (int64_t hh = 0; hh < Hl; ++hh) {
      const bf16* head = kv_b.data() + (h0 + hh) * (nope + vd) * R;
      std::memcpy(L.w_uk.data() + hh * nope * R, head, sizeof(bf16) * nope * R);
      std::memcpy(L.w_uv.data() + hh * vd * R, head + nope * R, sizeof(bf16) * vd * R);
    }
    MSI_ASSIGN_OR_RETURN(
        L.o,
        ld.pack_blocks({{a + "o_proj.weight", {h, H * vd}, 0, h, h0 * vd, (h0 + Hl) * vd}}, fmt));
  }
  if (options.attention && !rest) {  // a rank > 0: nothing but its attention slices
    for (const auto& n : attention_side) {
      if (n.find(".self_attn.") != std::string::npos) continue;
      ld.skip(n);
      ld.skip(fp8_scale_name(n));
    }
  } else if (rest) {
    MSI_ASSIGN_OR_RETURN(L.input_norm, ld.vec(p + "input_layernorm.weight", h));
    MSI_ASSIGN_OR_RETURN(L.post_attn_norm, ld.vec(p + "post_attention_layernorm.weight", h));
    const std::string ffn = moe ? p + "mlp.shared_experts." : p + "mlp.";
    const int64_t width = moe ? c.shared_expert_ffn : c.dense_ffn;
    if (width > 0 && (!moe || holds_shared_experts(options, i, true))) {
      MSI_ASSIGN_OR_RETURN(L.dense_ffn.w13, ld.pack({{ffn + "gate_proj.weight", {width, h}},
                                                     {ffn + "up_proj.weight", {width, h}}},
                                                    fmt));
      MSI_ASSIGN_OR_RETURN(L.dense_ffn.w2, ld.pack({{ffn + "down_proj.weight", {h, width}}}, fmt));
    } else if (width > 0) {  // the shared experts, held by an expert worker
      for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
        ld.skip(ffn + m + ".weight");
        ld.skip(fp8_scale_name(ffn + m + ".weight"));
      }
    }
    if (moe) {
      MSI_ASSIGN_OR_RETURN(L.router, ld.pack({{router_tensor_name(c, i), {E, h}}},
                                             kernels::cpu::WeightFormat::kBf16));
      if (c.topk_method == ModelConfig::TopkMethod::kNoauxTc) {
        MSI_ASSIGN_OR_RETURN(L.router_bias, ld.vec_f32(p + "mlp.gate.e_score_correction_bias", E));
      }
    }
  }
  L.experts.resize(E);
  if (!moe) return ok_status();
  if (c.shared_expert_ffn > 0 && holds_shared_experts(options, i, false)) {
    MSI_RETURN_IF_ERROR(load_shared_experts(ld, options, p + "mlp.shared_experts.",
                                            c.shared_expert_ffn, h, fmt, L));
  }
  return load_routed_experts(ld, c, i, options, fmt, L);
}

}  // namespace msinfer::model::internal
