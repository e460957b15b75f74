#include "msinfer/model/weights.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "msinfer/core/fp8.h"
#include "msinfer/core/logging.h"

namespace msinfer::model {
namespace {

using kernels::cpu::PackedLinear;

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

bool is_qwen3(const ModelConfig& c) { return c.architecture == "Qwen3MoeForCausalLM"; }
bool is_deepseek(const ModelConfig& c) {
  return c.architecture == "DeepseekV2ForCausalLM" || c.architecture == "DeepseekV3ForCausalLM";
}
// Qwen3-MoE, DeepSeek and GLM-4.5 name experts and the router under "mlp.";
// Mixtral under "block_sparse_moe.".
bool mlp_names(const ModelConfig& c) {
  return is_qwen3(c) || is_deepseek(c) || c.architecture == "Glm4MoeForCausalLM";
}

// The format of every GEMM weight but MXFP4 experts: mxfp4 keeps only those
// 4-bit and loads the rest as bf16.
kernels::cpu::WeightFormat dense_format(kernels::cpu::WeightFormat f) {
  return f == kernels::cpu::WeightFormat::kMxfp4 ? kernels::cpu::WeightFormat::kBf16 : f;
}

// Appends the tensor's values as bf16 to out.
void append_bf16(const TensorView& t, std::vector<bf16>& out) {
  const size_t n = static_cast<size_t>(t.numel());
  const size_t at = out.size();
  out.resize(at + n);
  switch (t.dtype) {
    case DType::kBF16:
      std::memcpy(out.data() + at, t.data, n * 2);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[at + i] = float_to_bf16(f16_to_float(h));
      }
      break;
    case DType::kF32:
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, t.data + 4 * i, 4);
        out[at + i] = float_to_bf16(f);
      }
      break;
    case DType::kF8E4M3:  // the raw codes, unscaled: callers apply the block scales
      for (size_t i = 0; i < n; ++i) out[at + i] = float_to_bf16(e4m3_to_float(t.data[i]));
      break;
    case DType::kU8:  // raw bytes (MXFP4 blocks, e8m0 scales): callers refuse them first
      for (size_t i = 0; i < n; ++i) out[at + i] = float_to_bf16(static_cast<float>(t.data[i]));
      break;
  }
}

// Every weight is held as bf16 values, norms included (as an HF bf16 load does).
std::vector<float> to_float(const TensorView& t) {
  std::vector<bf16> b;
  append_bf16(t, b);
  std::vector<float> f(b.size());
  bf16_to_float_n(b.data(), f.data(), static_cast<int64_t>(b.size()));
  return f;
}

// Appends rows [r0, r1) x columns [c0, c1) of the [rows, cols] weight `t` as
// bf16. A float8_e4m3fn weight is dequantised with its block scales (see
// read_weight_bf16 in weights.h); `scale` is then its checked
// <name>_scale_inv, else null.
void append_weight_bf16(const TensorView& t, const TensorView* scale, const ModelConfig& c,
                        int64_t r0, int64_t r1, int64_t c0, int64_t c1, std::vector<bf16>& out) {
  const int64_t cols = t.shape[1];
  if (t.dtype != DType::kF8E4M3) {
    const size_t elem = dtype_size(t.dtype);
    for (int64_t r = r0; r < r1; ++r) {
      TensorView row = t;
      row.shape = {c1 - c0};
      row.data = t.data + static_cast<size_t>(r * cols + c0) * elem;
      append_bf16(row, out);
    }
    return;
  }
  const int64_t sc = scale->shape[1];
  size_t at = out.size();
  out.resize(at + static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = t.data + r * cols;
    const uint8_t* srow = scale->data + 4 * (r / c.fp8_block_rows) * sc;
    for (int64_t col = c0; col < c1; ++col) {
      float s;
      std::memcpy(&s, srow + 4 * (col / c.fp8_block_cols), 4);
      out[at++] = float_to_bf16(e4m3_to_float(row[col]) * s);
    }
  }
}

// The block-scale tensor of the float8 weight `t` ([rows, cols]), checked: a
// float32 [ceil(rows/br), ceil(cols/bc)] of finite positive values.
StatusOr<const TensorView*> fp8_scale(const Checkpoint& ckpt, const ModelConfig& c,
                                      const TensorView& t, const std::string& dir) {
  if (!c.fp8_weights) {
    return invalid_argument(t.file + ": tensor '" + t.name +
                            "' is F8_E4M3 but config.json has no fp8 quantization_config");
  }
  if (t.shape.size() != 2) {
    return invalid_argument(t.file + ": F8_E4M3 tensor '" + t.name + "' has shape " +
                            t.shape_string() + "; block scaling needs a matrix");
  }
  const std::string name = fp8_scale_name(t.name);
  const TensorView* s = ckpt.find(name);
  if (s == nullptr) {
    return invalid_argument(dir + ": tensor '" + name + "' (the block scales of F8_E4M3 '" +
                            t.name + "') is missing");
  }
  const int64_t sr = (t.shape[0] + c.fp8_block_rows - 1) / c.fp8_block_rows;
  const int64_t sc = (t.shape[1] + c.fp8_block_cols - 1) / c.fp8_block_cols;
  if (s->dtype != DType::kF32) {
    return invalid_argument(s->file + ": tensor '" + name + "' has dtype " + dtype_name(s->dtype) +
                            ", expected F32");
  }
  if (s->shape != std::vector<int64_t>{sr, sc}) {
    TensorView want;
    want.shape = {sr, sc};
    return invalid_argument(s->file + ": tensor '" + name + "' has " + s->shape_string() +
                            " blocks, expected " + want.shape_string() + " for " +
                            t.shape_string() + " in " + std::to_string(c.fp8_block_rows) + "x" +
                            std::to_string(c.fp8_block_cols) + " blocks");
  }
  for (int64_t i = 0; i < sr * sc; ++i) {
    float v;
    std::memcpy(&v, s->data + 4 * i, 4);
    if (!(std::isfinite(v) && v > 0)) {
      return invalid_argument(s->file + ": tensor '" + name + "' block [" + std::to_string(i / sc) +
                              ", " + std::to_string(i % sc) + "] has scale " + std::to_string(v) +
                              "; block scales must be finite and > 0");
    }
  }
  return s;
}

class Loader {
 public:
  Loader(const Checkpoint& ckpt, const std::string& dir, const ModelConfig& config)
      : ckpt_(ckpt), dir_(dir), config_(config) {}

  // The tensor `name` with exactly `shape`, or an error naming file and tensor.
  StatusOr<const TensorView*> get(const std::string& name, std::vector<int64_t> shape) {
    used_.insert(name);
    const TensorView* t = ckpt_.find(name);
    if (t == nullptr) return invalid_argument(dir_ + ": tensor '" + name + "' is missing");
    if (t->shape != shape) {
      TensorView want;
      want.shape = shape;
      return invalid_argument(t->file + ": tensor '" + name + "' has shape " + t->shape_string() +
                              ", expected " + want.shape_string());
    }
    return t;
  }

  // Packs the row-wise concatenation of the given tensors (each [rows_i, k]).
  StatusOr<PackedLinear> pack(const std::vector<std::pair<std::string, std::vector<int64_t>>>& parts,
                              kernels::cpu::WeightFormat format) {
    // One staging buffer reused for every weight: fresh temporaries would leave
    // the heap fragmented between the packed copies (resident but free).
    staging_.clear();
    int64_t n = 0, k = parts.front().second[1];
    for (const auto& [name, shape] : parts) {
      MSI_ASSIGN_OR_RETURN(const TensorView* t, get(name, shape));
      MSI_ASSIGN_OR_RETURN(const TensorView* scale, scale_of(*t));
      append_weight_bf16(*t, scale, config_, 0, shape[0], 0, shape[1], staging_);
      ckpt_.release(*t);
      n += shape[0];
    }
    return PackedLinear::pack(staging_.data(), n, k, format);
  }

  // Packs the row-wise concatenation of one block of each tensor (each
  // [rows, cols] in full): rows [r0, r1) and columns [c0, c1) of every part.
  struct Block {
    std::string name;
    std::vector<int64_t> shape;  // the whole tensor's
    int64_t r0, r1, c0, c1;
  };
  StatusOr<PackedLinear> pack_blocks(const std::vector<Block>& parts,
                                     kernels::cpu::WeightFormat format) {
    staging_.clear();
    int64_t n = 0;
    const int64_t k = parts.front().c1 - parts.front().c0;
    for (const Block& b : parts) {
      MSI_ASSIGN_OR_RETURN(const TensorView* t, get(b.name, b.shape));
      MSI_ASSIGN_OR_RETURN(const TensorView* scale, scale_of(*t));
      append_weight_bf16(*t, scale, config_, b.r0, b.r1, b.c0, b.c1, staging_);
      ckpt_.release(*t);
      n += b.r1 - b.r0;
    }
    return PackedLinear::pack(staging_.data(), n, k, format);
  }

  StatusOr<std::vector<float>> vec(const std::string& name, int64_t n) {
    MSI_ASSIGN_OR_RETURN(const TensorView* t, get(name, {n}));
    if (t->dtype == DType::kF8E4M3 || t->dtype == DType::kU8) {
      return invalid_argument(t->file + ": tensor '" + name + "' is " + dtype_name(t->dtype) +
                              "; expected a float type");
    }
    return to_float(*t);
  }

  // The checked block scales of a float8 weight (marked used), else null.
  StatusOr<const TensorView*> scale_of(const TensorView& t) {
    if (t.dtype == DType::kU8) {
      return invalid_argument(t.file + ": tensor '" + t.name + "' is U8; expected a float type");
    }
    if (t.dtype != DType::kF8E4M3) return static_cast<const TensorView*>(nullptr);
    MSI_ASSIGN_OR_RETURN(const TensorView* s, fp8_scale(ckpt_, config_, t, dir_));
    used_.insert(s->name);
    return s;
  }

  // A float32 vector kept in float32 (DeepSeek's e_score_correction_bias).
  StatusOr<std::vector<float>> vec_f32(const std::string& name, int64_t n) {
    MSI_ASSIGN_OR_RETURN(const TensorView* t, get(name, {n}));
    if (t->dtype != DType::kF32) return to_float(*t);
    std::vector<float> f(static_cast<size_t>(n));
    std::memcpy(f.data(), t->data, sizeof(float) * f.size());
    return f;
  }

  // A GEMM weight as bf16 values (FP8 dequantised), row-major [rows, cols].
  StatusOr<std::vector<bf16>> weight(const std::string& name, std::vector<int64_t> shape) {
    MSI_ASSIGN_OR_RETURN(const TensorView* t, get(name, shape));
    MSI_ASSIGN_OR_RETURN(const TensorView* scale, scale_of(*t));
    std::vector<bf16> out;
    append_weight_bf16(*t, scale, config_, 0, shape[0], 0, shape[1], out);
    ckpt_.release(*t);
    return out;
  }

  void skip(const std::string& name) { used_.insert(name); }
  void release(const TensorView& t) { ckpt_.release(t); }
  void release_staging() { std::vector<bf16>().swap(staging_); }
  const std::set<std::string>& used() const { return used_; }

 private:
  const Checkpoint& ckpt_;
  std::string dir_;
  const ModelConfig& config_;
  std::set<std::string> used_;
  std::vector<bf16> staging_;
};

}  // namespace

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
  const int64_t E = c.experts, F = c.expert_ffn;
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
          L.q_b, ld.pack_blocks({{a + "q_b_proj.weight", {H * qk, QL}, h0 * qk, (h0 + Hl) * qk, 0,
                                  QL}},
                                fmt));
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
        L.o, ld.pack_blocks({{a + "o_proj.weight", {h, H * vd}, 0, h, h0 * vd, (h0 + Hl) * vd}},
                            fmt));
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
  const int64_t tp = options.expert_tp_size, tp_rank = options.expert_tp_rank;
  for (int e = 0; e < E; ++e) {
    const ExpertTensorNames n = expert_tensor_names(c, i, e);
    const bool want =
        options.all_experts ||
        std::find(options.experts.begin(), options.experts.end(), e) != options.experts.end();
    if (!want) {
      for (const auto& s : {n.w1, n.w2, n.w3}) {
        ld.skip(s);
        ld.skip(fp8_scale_name(s));
      }
      continue;
    }
    const int64_t f0 = tp_rank * (F / tp), f1 = f0 + F / tp;
    MSI_ASSIGN_OR_RETURN(
        L.experts[e].w13,
        ld.pack_blocks({{n.w1, {F, h}, f0, f1, 0, h}, {n.w3, {F, h}, f0, f1, 0, h}}, fmt));
    MSI_ASSIGN_OR_RETURN(L.experts[e].w2, ld.pack_blocks({{n.w2, {h, F}, 0, h, f0, f1}}, fmt));
  }
  return ok_status();
}

bool is_gpt_oss(const ModelConfig& c) { return c.architecture == "GptOssForCausalLM"; }

// The float values of a float tensor that may be stacked ([E, n]: all of it).
StatusOr<std::vector<float>> float_tensor(Loader& ld, const std::string& name,
                                          std::vector<int64_t> shape) {
  MSI_ASSIGN_OR_RETURN(const TensorView* t, ld.get(name, std::move(shape)));
  if (t->dtype == DType::kF8E4M3 || t->dtype == DType::kU8) {
    return invalid_argument(t->file + ": tensor '" + name + "' is " + dtype_name(t->dtype) +
                            "; expected a float type");
  }
  return to_float(*t);
}

// One gpt-oss MXFP4 expert tensor (`base` = "...mlp.experts.gate_up_proj" or
// "...down_proj", [E, rows, cols] in value terms), checked: `base`_blocks U8
// [E, rows, cols / 32, 16] and `base`_scales U8 [E, rows, cols / 32].
struct Mxfp4Tensor {
  const TensorView* blocks = nullptr;
  const TensorView* scales = nullptr;
  int64_t rows = 0, cols = 0;
  // Row r of expert e as bf16 (exact: an e2m1 value times a power of two).
  void row(int64_t e, int64_t r, bf16* out) const {
    const int64_t g = cols / 32;
    const uint8_t* b = blocks->data + (e * rows + r) * g * 16;
    const uint8_t* sc = scales->data + (e * rows + r) * g;
    for (int64_t j = 0; j < g; ++j) mxfp4_decode_block(b + j * 16, sc[j], out + j * 32);
  }
  // Row r of expert e as stored: cols / 32 blocks of 16 bytes, and their scales.
  const uint8_t* row_blocks(int64_t e, int64_t r) const {
    return blocks->data + (e * rows + r) * (cols / 32) * 16;
  }
  const uint8_t* row_scales(int64_t e, int64_t r) const {
    return scales->data + (e * rows + r) * (cols / 32);
  }
};

StatusOr<Mxfp4Tensor> mxfp4_tensor(Loader& ld, const Checkpoint& ckpt, const std::string& dir,
                                   const std::string& base, int64_t E, int64_t rows, int64_t cols) {
  const std::string bn = base + "_blocks", sn = base + "_scales";
  if (ckpt.find(sn) == nullptr) {
    ld.skip(sn);
    return invalid_argument(dir + ": tensor '" + sn + "' (the e8m0 scales of MXFP4 '" + bn +
                            "') is missing");
  }
  Mxfp4Tensor m;
  m.rows = rows;
  m.cols = cols;
  MSI_ASSIGN_OR_RETURN(m.blocks, ld.get(bn, {E, rows, cols / 32, 16}));
  MSI_ASSIGN_OR_RETURN(m.scales, ld.get(sn, {E, rows, cols / 32}));
  for (const TensorView* t : {m.blocks, m.scales}) {
    if (t->dtype != DType::kU8) {
      return invalid_argument(t->file + ": tensor '" + t->name + "' has dtype " +
                              dtype_name(t->dtype) + ", expected U8 (MXFP4)");
    }
  }
  const int64_t n = m.scales->numel();
  for (int64_t i = 0; i < n; ++i) {
    if (m.scales->data[i] == 0xFF) {  // e8m0's NaN
      const int64_t g = cols / 32;
      return invalid_argument(m.scales->file + ": tensor '" + sn + "' [" +
                              std::to_string(i / g / rows) + ", " + std::to_string(i / g % rows) +
                              ", " + std::to_string(i % g) + "] is 255, the e8m0 NaN");
    }
  }
  return m;
}

// One gpt-oss decoder layer: GQA with biases on q/k/v/o and a sink per head,
// the router Linear with its bias, and the experts stored stacked
// (mlp.experts.gate_up_proj_* / down_proj_*, MXFP4, with biases). HF's
// gate_up_proj interleaves its output rows (2j: gate j, 2j + 1: up j); w13
// takes the gate rows first, then the up rows, as for every other model, and
// b13 the same order. Attention tp and expert tp slice as in the GQA loader.
Status load_gpt_oss_layer(Loader& ld, const Checkpoint& ckpt, const std::string& dir,
                          const ModelConfig& c, int i, const LoadOptions& options,
                          LayerWeights& L) {
  const std::string p = layer_prefix(i), a = p + "self_attn.", x = p + "mlp.experts.";
  const kernels::cpu::WeightFormat fmt = dense_format(options.weights);
  const int64_t h = c.hidden, hd = c.head_dim, H = c.heads, KV = c.kv_heads, F = c.expert_ffn;
  const int64_t E = c.experts;
  const int atp = options.attention_tp_size, atp_rank = options.attention_tp_rank;
  const bool rest = options.attention && atp_rank == 0;
  std::vector<std::string> rest_names = {p + "input_layernorm.weight",
                                         p + "post_attention_layernorm.weight",
                                         p + "mlp.router.weight", p + "mlp.router.bias"};
  std::vector<std::string> attn_names = {a + "sinks"};
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    attn_names.push_back(a + m + ".weight");
    attn_names.push_back(a + m + ".bias");
  }
  if (!options.attention) {
    for (const auto& n : attn_names) ld.skip(n);
  } else {
    const int64_t q0 = atp_rank * (H / atp) * hd, q1 = q0 + (H / atp) * hd;
    const int64_t k0 = c.first_kv_head_of_attention_rank(atp_rank, atp) * hd;
    const int64_t k1 = k0 + c.kv_heads_per_attention_rank(atp) * hd;
    MSI_ASSIGN_OR_RETURN(L.qkv, ld.pack_blocks({{a + "q_proj.weight", {H * hd, h}, q0, q1, 0, h},
                                                {a + "k_proj.weight", {KV * hd, h}, k0, k1, 0, h},
                                                {a + "v_proj.weight", {KV * hd, h}, k0, k1, 0, h}},
                                               fmt));
    MSI_ASSIGN_OR_RETURN(L.o,
                         ld.pack_blocks({{a + "o_proj.weight", {h, H * hd}, 0, h, q0, q1}}, fmt));
    if (c.attention_bias) {
      MSI_ASSIGN_OR_RETURN(std::vector<float> qb, ld.vec(a + "q_proj.bias", H * hd));
      MSI_ASSIGN_OR_RETURN(std::vector<float> kb, ld.vec(a + "k_proj.bias", KV * hd));
      MSI_ASSIGN_OR_RETURN(std::vector<float> vb, ld.vec(a + "v_proj.bias", KV * hd));
      L.qkv_bias.assign(qb.begin() + q0, qb.begin() + q1);
      L.qkv_bias.insert(L.qkv_bias.end(), kb.begin() + k0, kb.begin() + k1);
      L.qkv_bias.insert(L.qkv_bias.end(), vb.begin() + k0, vb.begin() + k1);
      MSI_ASSIGN_OR_RETURN(std::vector<float> ob, ld.vec(a + "o_proj.bias", h));
      if (rest) L.o_bias = std::move(ob);
    }
    MSI_ASSIGN_OR_RETURN(std::vector<float> sinks, ld.vec(a + "sinks", H));
    L.sinks.assign(sinks.begin() + q0 / hd, sinks.begin() + q1 / hd);
  }
  if (rest) {
    MSI_ASSIGN_OR_RETURN(L.input_norm, ld.vec(p + "input_layernorm.weight", h));
    MSI_ASSIGN_OR_RETURN(L.post_attn_norm, ld.vec(p + "post_attention_layernorm.weight", h));
    MSI_ASSIGN_OR_RETURN(
        L.router, ld.pack({{p + "mlp.router.weight", {E, h}}}, kernels::cpu::WeightFormat::kBf16));
    MSI_ASSIGN_OR_RETURN(L.router_logit_bias, ld.vec(p + "mlp.router.bias", E));
  } else {
    for (const auto& n : rest_names) ld.skip(n);
  }
  L.experts.resize(E);
  std::vector<int> wanted;
  for (int e = 0; e < E; ++e) {
    if (options.all_experts ||
        std::find(options.experts.begin(), options.experts.end(), e) != options.experts.end()) {
      wanted.push_back(e);
    }
  }
  const std::vector<std::string> expert_names = {
      x + "gate_up_proj_blocks", x + "gate_up_proj_scales", x + "gate_up_proj_bias",
      x + "down_proj_blocks",    x + "down_proj_scales",    x + "down_proj_bias"};
  if (wanted.empty()) {
    for (const auto& n : expert_names) ld.skip(n);
    return ok_status();
  }
  if (!c.mxfp4_experts) {
    return invalid_argument(dir +
                            ": gpt-oss experts are read as MXFP4 only (config.json "
                            "quantization_config {\"quant_method\": \"mxfp4\"})");
  }
  MSI_ASSIGN_OR_RETURN(Mxfp4Tensor gu,
                       mxfp4_tensor(ld, ckpt, dir, x + "gate_up_proj", E, 2 * F, h));
  MSI_ASSIGN_OR_RETURN(Mxfp4Tensor dn, mxfp4_tensor(ld, ckpt, dir, x + "down_proj", E, h, F));
  MSI_ASSIGN_OR_RETURN(std::vector<float> gu_bias,
                       float_tensor(ld, x + "gate_up_proj_bias", {E, 2 * F}));
  MSI_ASSIGN_OR_RETURN(std::vector<float> dn_bias, float_tensor(ld, x + "down_proj_bias", {E, h}));
  const int64_t tp = options.expert_tp_size, tp_rank = options.expert_tp_rank;
  const int64_t f0 = tp_rank * (F / tp), f1 = f0 + F / tp, fs = f1 - f0;
  if (options.weights == kernels::cpu::WeightFormat::kMxfp4) {
    // Kept 4-bit: the same rows (and w2's columns) as below, copied block by
    // block; a shard's columns of w2 must be whole blocks.
    if (fs % 32 != 0) {
      return invalid_argument(dir + ": --weights mxfp4 with tp_expert " + std::to_string(tp) +
                              ": the shard's FFN width " + std::to_string(fs) +
                              " is not a multiple of 32 (MXFP4's block)");
    }
    const int64_t gh = h / 32, gs = fs / 32, b0 = f0 / 32;
    std::vector<uint8_t> b13(static_cast<size_t>(2 * fs * gh * 16)),
        s13(static_cast<size_t>(2 * fs * gh));
    std::vector<uint8_t> b2(static_cast<size_t>(h * gs * 16)), s2(static_cast<size_t>(h * gs));
    for (int e : wanted) {
      ExpertWeights& ew = L.experts[e];
      ew.b13.resize(2 * fs);
      for (int64_t j = f0; j < f1; ++j) {
        for (int64_t half = 0; half < 2; ++half) {  // gate row j - f0, up row fs + j - f0
          const int64_t dst = half * fs + j - f0;
          std::memcpy(b13.data() + dst * gh * 16, gu.row_blocks(e, 2 * j + half), gh * 16);
          std::memcpy(s13.data() + dst * gh, gu.row_scales(e, 2 * j + half), gh);
          ew.b13[dst] = gu_bias[e * 2 * F + 2 * j + half];
        }
      }
      for (int64_t r = 0; r < h; ++r) {
        std::memcpy(b2.data() + r * gs * 16, dn.row_blocks(e, r) + b0 * 16, gs * 16);
        std::memcpy(s2.data() + r * gs, dn.row_scales(e, r) + b0, gs);
      }
      MSI_ASSIGN_OR_RETURN(ew.w13, PackedLinear::pack_mxfp4(b13.data(), s13.data(), 2 * fs, h));
      MSI_ASSIGN_OR_RETURN(ew.w2, PackedLinear::pack_mxfp4(b2.data(), s2.data(), h, fs));
      if (tp_rank == 0) ew.b2.assign(dn_bias.begin() + e * h, dn_bias.begin() + (e + 1) * h);
    }
  } else {
    std::vector<bf16> w13(static_cast<size_t>(2 * fs * h)), row(static_cast<size_t>(F));
    std::vector<bf16> w2(static_cast<size_t>(h * fs));
    for (int e : wanted) {
      ExpertWeights& ew = L.experts[e];
      ew.b13.resize(2 * fs);
      for (int64_t j = f0; j < f1; ++j) {
        gu.row(e, 2 * j, w13.data() + (j - f0) * h);
        gu.row(e, 2 * j + 1, w13.data() + (fs + j - f0) * h);
        ew.b13[j - f0] = gu_bias[e * 2 * F + 2 * j];
        ew.b13[fs + j - f0] = gu_bias[e * 2 * F + 2 * j + 1];
      }
      for (int64_t r = 0; r < h; ++r) {
        dn.row(e, r, row.data());
        std::memcpy(w2.data() + r * fs, row.data() + f0, sizeof(bf16) * fs);
      }
      MSI_ASSIGN_OR_RETURN(ew.w13, PackedLinear::pack(w13.data(), 2 * fs, h, fmt));
      MSI_ASSIGN_OR_RETURN(ew.w2, PackedLinear::pack(w2.data(), h, fs, fmt));
      if (tp_rank == 0) ew.b2.assign(dn_bias.begin() + e * h, dn_bias.begin() + (e + 1) * h);
    }
  }
  for (const Mxfp4Tensor* m : {&gu, &dn}) {
    ld.release(*m->blocks);
    ld.release(*m->scales);
  }
  return ok_status();
}

}  // namespace

StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::load(const std::string& dir,
                                                           const LoadOptions& options) {
  auto w = std::unique_ptr<ModelWeights>(new ModelWeights());
  MSI_ASSIGN_OR_RETURN(w->config_, load_model_config(dir));
  w->dir_ = dir;
  const ModelConfig& c = w->config_;
  MSI_RETURN_IF_ERROR(c.check_executable());
  if (options.weights == kernels::cpu::WeightFormat::kMxfp4 && !c.mxfp4_experts) {
    return invalid_argument(dir +
                            ": --weights mxfp4 keeps a checkpoint's MXFP4 expert weights 4-bit, "
                            "and this one has none (config.json has no quantization_config "
                            "{\"quant_method\": \"mxfp4\"}); use bf16, int8 or w8a8");
  }
  MSI_ASSIGN_OR_RETURN(w->checkpoint_, Checkpoint::open(dir));
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
  w->attention_tp_rank_ = static_cast<int>(atp_rank);
  w->attention_tp_size_ = static_cast<int>(atp);
  // Ranks > 0 of an attention replica hold only their q/k/v/o slices.
  const bool attention_rest = options.attention && atp_rank == 0;
  Loader ld(w->checkpoint_, dir, w->config_);
  const kernels::cpu::WeightFormat fmt = dense_format(options.weights);
  const int64_t h = c.hidden, hd = c.head_dim, H = c.heads, KV = c.kv_heads, F = c.expert_ffn;
  const int64_t E = c.experts, V = c.vocab;

  if (attention_rest) {
    MSI_ASSIGN_OR_RETURN(w->embed_view_, ld.get("model.embed_tokens.weight", {V, h}));
    if (w->embed_view_->dtype == DType::kF8E4M3 || w->embed_view_->dtype == DType::kU8) {
      return invalid_argument(w->embed_view_->file + ": tensor 'model.embed_tokens.weight' is " +
                              dtype_name(w->embed_view_->dtype) + "; expected a float type");
    }
    if (w->embed_view_->dtype != DType::kBF16) append_bf16(*w->embed_view_, w->embed_copy_);
    MSI_ASSIGN_OR_RETURN(w->final_norm_, ld.vec("model.norm.weight", h));
    if (c.tied_embeddings) {
      MSI_ASSIGN_OR_RETURN(w->lm_head_, ld.pack({{"model.embed_tokens.weight", {V, h}}}, fmt));
    } else {
      MSI_ASSIGN_OR_RETURN(w->lm_head_, ld.pack({{"lm_head.weight", {V, h}}}, fmt));
    }
  } else {
    for (const char* n : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}) {
      ld.skip(n);
    }
  }
  const bool mla = c.kv_lora_rank > 0;
  w->layers_.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    LayerWeights& L = w->layers_[i];
    const std::string p = layer_prefix(i);
    if (mla) {
      MSI_RETURN_IF_ERROR(load_deepseek_layer(ld, c, i, options, L));
      continue;
    }
    if (is_gpt_oss(c)) {
      MSI_RETURN_IF_ERROR(load_gpt_oss_layer(ld, w->checkpoint_, dir, c, i, options, L));
      continue;
    }
    // GLM-4.5 has DeepSeek's layer pattern: a dense layer's MLP or a MoE
    // layer's shared experts run on the attention side (rank 0).
    const bool moe = c.is_moe_layer(i);
    const std::string ffn = moe ? p + "mlp.shared_experts." : p + "mlp.";
    const int64_t ffn_width = moe ? c.shared_expert_ffn : c.dense_ffn;
    const std::vector<std::string> attn_names = {
        p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
        p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight",
        p + "self_attn.q_proj.bias",   p + "self_attn.k_proj.bias",
        p + "self_attn.v_proj.bias",   p + "self_attn.q_norm.weight",
        p + "self_attn.k_norm.weight"};
    const std::vector<std::string> rest_names = {
        p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
        router_tensor_name(c, i),     p + "mlp.gate.e_score_correction_bias",
        ffn + "gate_proj.weight",     ffn + "up_proj.weight",
        ffn + "down_proj.weight"};
    if (options.attention) {
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
      // Rank atp_rank: its heads' rows of q, k and v (the KV heads its query
      // heads read: a share, or one replicated head), the same columns of o
      // (all of them at tp 1).
      const int64_t q0 = atp_rank * (H / atp) * hd, q1 = q0 + (H / atp) * hd;
      const int64_t k0 =
          c.first_kv_head_of_attention_rank(static_cast<int>(atp_rank), static_cast<int>(atp)) * hd;
      const int64_t k1 = k0 + c.kv_heads_per_attention_rank(static_cast<int>(atp)) * hd;
      if (atp == 1) {
        MSI_ASSIGN_OR_RETURN(L.qkv, ld.pack({{p + "self_attn.q_proj.weight", {H * hd, h}},
                                             {p + "self_attn.k_proj.weight", {KV * hd, h}},
                                             {p + "self_attn.v_proj.weight", {KV * hd, h}}},
                                            fmt));
        MSI_ASSIGN_OR_RETURN(L.o, ld.pack({{p + "self_attn.o_proj.weight", {h, H * hd}}}, fmt));
      } else {
        MSI_ASSIGN_OR_RETURN(
            L.qkv, ld.pack_blocks({{p + "self_attn.q_proj.weight", {H * hd, h}, q0, q1, 0, h},
                                   {p + "self_attn.k_proj.weight", {KV * hd, h}, k0, k1, 0, h},
                                   {p + "self_attn.v_proj.weight", {KV * hd, h}, k0, k1, 0, h}},
                                  fmt));
        MSI_ASSIGN_OR_RETURN(
            L.o, ld.pack_blocks({{p + "self_attn.o_proj.weight", {h, H * hd}, 0, h, q0, q1}}, fmt));
      }
      if (c.attention_bias) {  // the same rows of the biases, in qkv's row order
        MSI_ASSIGN_OR_RETURN(std::vector<float> qb, ld.vec(p + "self_attn.q_proj.bias", H * hd));
        MSI_ASSIGN_OR_RETURN(std::vector<float> kb, ld.vec(p + "self_attn.k_proj.bias", KV * hd));
        MSI_ASSIGN_OR_RETURN(std::vector<float> vb, ld.vec(p + "self_attn.v_proj.bias", KV * hd));
        L.qkv_bias.assign(qb.begin() + q0, qb.begin() + q1);
        L.qkv_bias.insert(L.qkv_bias.end(), kb.begin() + k0, kb.begin() + k1);
        L.qkv_bias.insert(L.qkv_bias.end(), vb.begin() + k0, vb.begin() + k1);
      }
      if (c.qk_norm) {
        MSI_ASSIGN_OR_RETURN(L.q_norm, ld.vec(p + "self_attn.q_norm.weight", hd));
        MSI_ASSIGN_OR_RETURN(L.k_norm, ld.vec(p + "self_attn.k_norm.weight", hd));
      }
    } else {
      for (const auto& n : attn_names) ld.skip(n);
      for (const auto& n : rest_names) ld.skip(n);
    }
    L.experts.resize(E);
    if (moe && ffn_width > 0 && holds_shared_experts(options, i, false)) {
      MSI_RETURN_IF_ERROR(load_shared_experts(ld, options, ffn, ffn_width, h, fmt, L));
    }
    for (int e = 0; moe && e < E; ++e) {
      const ExpertTensorNames n = expert_tensor_names(c, i, e);
      const bool want =
          options.all_experts ||
          std::find(options.experts.begin(), options.experts.end(), e) != options.experts.end();
      if (!want) {
        for (const auto& s : {n.w1, n.w2, n.w3}) ld.skip(s);
        continue;
      }
      if (tp == 1) {
        MSI_ASSIGN_OR_RETURN(L.experts[e].w13, ld.pack({{n.w1, {F, h}}, {n.w3, {F, h}}}, fmt));
        MSI_ASSIGN_OR_RETURN(L.experts[e].w2, ld.pack({{n.w2, {h, F}}}, fmt));
      } else {
        // Shard tp_rank: its rows of w1 and w3, the same columns of w2.
        const int64_t f0 = tp_rank * (F / tp), f1 = f0 + F / tp;
        MSI_ASSIGN_OR_RETURN(
            L.experts[e].w13,
            ld.pack_blocks({{n.w1, {F, h}, f0, f1, 0, h}, {n.w3, {F, h}, f0, f1, 0, h}}, fmt));
        MSI_ASSIGN_OR_RETURN(L.experts[e].w2, ld.pack_blocks({{n.w2, {h, F}, 0, h, f0, f1}}, fmt));
      }
    }
  }
  // DeepSeek-V3's multi-token-prediction modules follow the decoder layers;
  // the engine does not run them.
  if (c.nextn_predict_layers > 0) {
    const std::string first = layer_prefix(c.layers);
    int64_t skipped = 0;
    for (const auto& [name, t] : w->checkpoint_.tensors()) {
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
