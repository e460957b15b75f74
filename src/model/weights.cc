#include "msinfer/model/weights.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "internal/weight_loader.h"
#include "msinfer/core/logging.h"

namespace msinfer::model {

using namespace internal;  // the loader's parts (internal/weight_loader.h)
using kernels::cpu::PackedLinear;

StatusOr<std::vector<bf16>> read_bf16(const Checkpoint& ckpt, const std::string& name,
                                      const std::vector<int64_t>& shape) {
  const ModelConfig plain;
  Loader ld(ckpt, "checkpoint", plain);
  MSI_ASSIGN_OR_RETURN(const TensorView* t, ld.get(name, shape));
  if (t->dtype == DType::kF8E4M3) {
    return invalid_argument(t->file + ": tensor '" + name +
                            "' is F8_E4M3: read it with read_weight_bf16 and the model's config");
  }
  std::vector<bf16> out;
  append_bf16(*t, out);
  ckpt.release(*t);
  return out;
}

std::string fp8_scale_name(const std::string& weight) { return weight + "_scale_inv"; }

StatusOr<std::vector<bf16>> read_weight_bf16(const Checkpoint& ckpt, const ModelConfig& config,
                                             const std::string& name,
                                             const std::vector<int64_t>& shape,
                                             const std::string& dir) {
  if (shape.size() != 2) {
    return invalid_argument("read_weight_bf16: '" + name + "' needs a 2-d shape");
  }
  Loader ld(ckpt, dir, config);
  MSI_ASSIGN_OR_RETURN(const TensorView* t, ld.get(name, shape));
  MSI_ASSIGN_OR_RETURN(const TensorView* scale, ld.scale_of(*t));
  std::vector<bf16> out;
  append_weight_bf16(*t, scale, config, 0, shape[0], 0, shape[1], out);
  return out;
}

ExpertTensorNames expert_tensor_names(const ModelConfig& c, int layer, int expert) {
  const std::string p = layer_prefix(layer);
  const std::string e = std::to_string(expert);
  if (mlp_names(c)) {
    return {p + "mlp.experts." + e + ".gate_proj.weight", p + "mlp.experts." + e + ".down_proj.weight",
            p + "mlp.experts." + e + ".up_proj.weight"};
  }
  return {p + "block_sparse_moe.experts." + e + ".w1.weight",
          p + "block_sparse_moe.experts." + e + ".w2.weight",
          p + "block_sparse_moe.experts." + e + ".w3.weight"};
}

std::string router_tensor_name(const ModelConfig& c, int layer) {
  return layer_prefix(layer) + (mlp_names(c) ? "mlp.gate.weight" : "block_sparse_moe.gate.weight");
}

namespace {

// LoadOptions against the model, before anything is read.
Status check_load_options(const ModelConfig& c, const std::string& dir,
                          const LoadOptions& options) {
  MSI_RETURN_IF_ERROR(c.check_executable());
  if (options.weights == kernels::cpu::WeightFormat::kMxfp4 && !c.mxfp4_experts) {
    return invalid_argument(dir +
                            ": --weights mxfp4 keeps a checkpoint's MXFP4 expert weights 4-bit, "
                            "and this one has none (config.json has no quantization_config "
                            "{\"quant_method\": \"mxfp4\"}); use bf16, int8 or w8a8");
  }
  for (int e : options.experts) {
    if (e < 0 || e >= c.experts) {
      return invalid_argument("expert " + std::to_string(e) + " out of range 0.." +
                              std::to_string(c.experts - 1));
    }
  }
  const int64_t tp = options.expert_tp_size, tp_rank = options.expert_tp_rank;
  if (tp < 1 || tp_rank < 0 || tp_rank >= tp) {
    return invalid_argument("expert tensor-parallel rank " + std::to_string(tp_rank) + " of " +
                            std::to_string(tp) + " is out of range");
  }
  if (c.expert_ffn % tp != 0) {
    return invalid_argument(dir + ": the experts' FFN width " + std::to_string(c.expert_ffn) +
                            " is not divisible by tp_expert " + std::to_string(tp));
  }
  const int64_t atp = options.attention_tp_size, atp_rank = options.attention_tp_rank;
  if (atp < 1 || atp_rank < 0 || atp_rank >= atp) {
    return invalid_argument("attention tensor-parallel rank " + std::to_string(atp_rank) + " of " +
                            std::to_string(atp) + " is out of range");
  }
  if (Status s = c.check_attention_tp(static_cast<int>(atp)); !s.ok()) {
    return invalid_argument(dir + ": " + s.message());
  }
  return ok_status();
}

// One GQA decoder layer (Mixtral, Qwen3-MoE, GLM-4.5). GLM-4.5 has
// DeepSeek's layer pattern: a dense layer's MLP or a MoE layer's shared
// experts run on the attention side (rank 0). Attention tp rank r holds its
// heads' rows of q, k and v (the KV heads its query heads read: a share, or
// one replicated head) and the same columns of o; ranks > 0 nothing else.
Status load_gqa_layer(Loader& ld, const ModelConfig& c, int i, const LoadOptions& options,
                      LayerWeights& L) {
  const std::string p = layer_prefix(i);
  const kernels::cpu::WeightFormat fmt = dense_format(options.weights);
  const int64_t h = c.hidden, hd = c.head_dim, E = c.experts;
  const int64_t atp = options.attention_tp_size, atp_rank = options.attention_tp_rank;
  const bool attention_rest = options.attention && atp_rank == 0;
  const bool moe = c.is_moe_layer(i);
  const std::string ffn = moe ? p + "mlp.shared_experts." : p + "mlp.";
  const int64_t ffn_width = moe ? c.shared_expert_ffn : c.dense_ffn;
  const std::vector<std::string> attn_names = {
      p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
      p + "self_attn.o_proj.weight", p + "self_attn.q_proj.bias",   p + "self_attn.k_proj.bias",
      p + "self_attn.v_proj.bias",   p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"};
  const std::vector<std::string> rest_names = {
      p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
      router_tensor_name(c, i),     p + "mlp.gate.e_score_correction_bias",
      ffn + "gate_proj.weight",     ffn + "up_proj.weight",
      ffn + "down_proj.weight"};
  if (!options.attention) {
    for (const auto& n : attn_names) ld.skip(n);
    for (const auto& n : rest_names) ld.skip(n);
  } else {
    if (attention_rest) {
      MSI_ASSIGN_OR_RETURN(L.input_norm, ld.vec(p + "input_layernorm.weight", h));
      MSI_ASSIGN_OR_RETURN(L.post_attn_norm, ld.vec(p + "post_attention_layernorm.weight", h));
      if (moe) {
        MSI_ASSIGN_OR_RETURN(L.router, ld.pack({{router_tensor_name(c, i), {E, h}}},
                                               kernels::cpu::WeightFormat::kBf16));
        if (c.topk_method == ModelConfig::TopkMethod::kNoauxTc) {
          MSI_ASSIGN_OR_RETURN(L.router_bias,
                               ld.vec_f32(p + "mlp.gate.e_score_correction_bias", E));
        }
      }
      if (ffn_width > 0 && (!moe || holds_shared_experts(options, i, true))) {
        MSI_ASSIGN_OR_RETURN(L.dense_ffn.w13, ld.pack({{ffn + "gate_proj.weight", {ffn_width, h}},
                                                       {ffn + "up_proj.weight", {ffn_width, h}}},
                                                      fmt));
        MSI_ASSIGN_OR_RETURN(L.dense_ffn.w2,
                             ld.pack({{ffn + "down_proj.weight", {h, ffn_width}}}, fmt));
      } else if (ffn_width > 0) {  // the shared experts, held by an expert worker
        for (const char* m : {"gate_proj", "up_proj", "down_proj"}) ld.skip(ffn + m + ".weight");
      }
    } else {
      for (const auto& n : rest_names) ld.skip(n);
    }
    MSI_RETURN_IF_ERROR(load_gqa_projections(ld, c, p + "self_attn.", static_cast<int>(atp_rank),
                                             static_cast<int>(atp), fmt, L));
    if (c.qk_norm) {
      MSI_ASSIGN_OR_RETURN(L.q_norm, ld.vec(p + "self_attn.q_norm.weight", hd));
      MSI_ASSIGN_OR_RETURN(L.k_norm, ld.vec(p + "self_attn.k_norm.weight", hd));
    }
  }
  L.experts.resize(E);
  if (!moe) return ok_status();
  if (ffn_width > 0 && holds_shared_experts(options, i, false)) {
    MSI_RETURN_IF_ERROR(load_shared_experts(ld, options, ffn, ffn_width, h, fmt, L));
  }
  return load_routed_experts(ld, c, i, options, fmt, L);
}

// DeepSeek-V3's multi-token-prediction modules follow the decoder layers; the
// engine does not run them: their tensors are marked used, with one log line.
void skip_nextn_predict_layers(Loader& ld, const Checkpoint& ckpt, const ModelConfig& c,
                               const std::string& dir) {
  if (c.nextn_predict_layers <= 0) return;
  int64_t skipped = 0;
  for (const auto& [name, t] : ckpt.tensors()) {
    const std::string rest = name.rfind("model.layers.", 0) == 0 ? name.substr(13) : "";
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0) continue;
    const std::string idx = rest.substr(0, dot);
    if (idx.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoll(idx) >= c.layers) {
      ld.skip(name);
      ++skipped;
    }
  }
  MSI_LOG(INFO) << dir << ": skipped " << skipped << " tensors of " << c.nextn_predict_layers
                << " multi-token-prediction layer(s) (model.layers." << c.layers
                << ".. ; not run by the engine)";
}

}  // namespace

StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::load(const std::string& dir,
                                                           const LoadOptions& options) {
  auto w = std::unique_ptr<ModelWeights>(new ModelWeights());
  MSI_ASSIGN_OR_RETURN(w->config_, load_model_config(dir));
  w->dir_ = dir;
  const ModelConfig& c = w->config_;
  MSI_RETURN_IF_ERROR(check_load_options(c, dir, options));
  MSI_ASSIGN_OR_RETURN(w->checkpoint_, Checkpoint::open(dir));
  w->attention_tp_rank_ = options.attention_tp_rank;
  w->attention_tp_size_ = options.attention_tp_size;
  Loader ld(w->checkpoint_, dir, w->config_);
  const int64_t h = c.hidden, V = c.vocab;
  // Ranks > 0 of an attention replica hold only their heads' slices.
  if (options.attention && options.attention_tp_rank == 0) {
    MSI_ASSIGN_OR_RETURN(w->embed_view_, ld.get("model.embed_tokens.weight", {V, h}));
    if (w->embed_view_->dtype == DType::kF8E4M3 || w->embed_view_->dtype == DType::kU8) {
      return invalid_argument(w->embed_view_->file + ": tensor 'model.embed_tokens.weight' is " +
                              dtype_name(w->embed_view_->dtype) + "; expected a float type");
    }
    if (w->embed_view_->dtype != DType::kBF16) append_bf16(*w->embed_view_, w->embed_copy_);
    MSI_ASSIGN_OR_RETURN(w->final_norm_, ld.vec("model.norm.weight", h));
    const char* head = c.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    MSI_ASSIGN_OR_RETURN(w->lm_head_, ld.pack({{head, {V, h}}}, dense_format(options.weights)));
  } else {
    for (const char* n : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}) {
      ld.skip(n);
    }
  }
  w->layers_.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    LayerWeights& L = w->layers_[i];
    if (c.kv_lora_rank > 0) {
      MSI_RETURN_IF_ERROR(load_deepseek_layer(ld, c, i, options, L));
    } else if (is_gpt_oss(c)) {
      MSI_RETURN_IF_ERROR(load_gpt_oss_layer(ld, w->checkpoint_, dir, c, i, options, L));
    } else {
      MSI_RETURN_IF_ERROR(load_gqa_layer(ld, c, i, options, L));
    }
  }
  skip_nextn_predict_layers(ld, w->checkpoint_, c, dir);
  // Return the staging memory and any other free heap pages to the system, so
  // the resident set is the packed weights.
  ld.release_staging();
  ::malloc_trim(0);
  // Anything in the checkpoint that is not part of this architecture is an error.
  for (const auto& [name, t] : w->checkpoint_.tensors()) {
    if (!ld.used().count(name)) {
      if (c.tied_embeddings && name == "lm_head.weight") continue;
      return invalid_argument(t.file + ": unexpected tensor '" + name + "' for " + c.architecture +
                              " with this config");
    }
  }
  return w;
}

void ModelWeights::embed(int64_t id, float* out) const {
  const int64_t h = config_.hidden;
  const bf16* row = embed_copy_.empty() ? reinterpret_cast<const bf16*>(embed_view_->data) + id * h
                                        : embed_copy_.data() + id * h;
  bf16_to_float_n(row, out, h);
}

bool ModelWeights::has_expert(int layer, int expert) const {
  return !layers_[layer].experts[expert].w13.empty();
}

void ModelWeights::replace_experts(ModelWeights* added, const std::vector<int>& keep) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto& mine = layers_[l].experts;
    for (size_t e = 0; e < mine.size(); ++e) {
      if (added != nullptr && l < added->layers_.size() && e < added->layers_[l].experts.size() &&
          !added->layers_[l].experts[e].w13.empty()) {
        mine[e] = std::move(added->layers_[l].experts[e]);
      }
      if (std::find(keep.begin(), keep.end(), static_cast<int>(e)) == keep.end()) mine[e] = {};
    }
  }
}

size_t ModelWeights::packed_bytes() const {
  size_t b = lm_head_.bytes();
  for (const auto& L : layers_) {
    b += L.qkv.bytes() + L.o.bytes() + L.router.bytes() + L.q_b.bytes() + L.dense_ffn.w13.bytes() +
         L.dense_ffn.w2.bytes() + 2 * (L.w_uk.size() + L.w_uv.size());
    for (const auto& e : L.experts) b += e.w13.bytes() + e.w2.bytes();
  }
  return b;
}

}  // namespace msinfer::model
