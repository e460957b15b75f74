// The checkpoint loader's shared parts, private to src/model: tensor
// names, bf16/FP8 conversion, the Loader that checks and packs tensors, and
// the per-architecture layer loaders that weights.cc calls
// (weights_deepseek.cc: DeepSeek-V2/V3 and GLM-4.5's MoE side; weights_gpt_oss.cc).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/core/model_config.h"
#include "msinfer/core/status.h"
#include "msinfer/model/weights.h"

namespace msinfer::model::internal {

inline std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

inline bool is_qwen3(const ModelConfig& c) { return c.architecture == "Qwen3MoeForCausalLM"; }
inline bool is_deepseek(const ModelConfig& c) {
  return c.architecture == "DeepseekV2ForCausalLM" || c.architecture == "DeepseekV3ForCausalLM";
}
// Qwen3-MoE, DeepSeek and GLM-4.5 name experts and the router under "mlp.";
// Mixtral under "block_sparse_moe.".
inline bool mlp_names(const ModelConfig& c) {
  return is_qwen3(c) || is_deepseek(c) || c.architecture == "Glm4MoeForCausalLM";
}

// The format of every GEMM weight but MXFP4 experts: mxfp4 keeps only those
// 4-bit and loads the rest as bf16.
inline kernels::cpu::WeightFormat dense_format(kernels::cpu::WeightFormat f) {
  return f == kernels::cpu::WeightFormat::kMxfp4 ? kernels::cpu::WeightFormat::kBf16 : f;
}

// Appends the tensor's values as bf16 to out.
void append_bf16(const TensorView& t, std::vector<bf16>& out);

// Every weight is held as bf16 values, norms included (as an HF bf16 load does).
std::vector<float> to_float(const TensorView& t);

// Appends rows [r0, r1) x columns [c0, c1) of the 2-d weight `t` as bf16 (see
// weight_loader.cc); `scale` is a float8 weight's checked <name>_scale_inv,
// else null.
void append_weight_bf16(const TensorView& t, const TensorView* scale, const ModelConfig& c,
                        int64_t r0, int64_t r1, int64_t c0, int64_t c1, std::vector<bf16>& out);

// The block-scale tensor of the float8 weight `t` ([rows, cols]), checked: a
// float32 [ceil(rows/br), ceil(cols/bc)] of finite positive values.
StatusOr<const TensorView*> fp8_scale(const Checkpoint& ckpt, const ModelConfig& c,
                                      const TensorView& t, const std::string& dir);

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
  StatusOr<kernels::cpu::PackedLinear> pack(
      const std::vector<std::pair<std::string, std::vector<int64_t>>>& parts,
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
    return kernels::cpu::PackedLinear::pack(staging_.data(), n, k, format);
  }

  // Packs the row-wise concatenation of one block of each tensor (each
  // [rows, cols] in full): rows [r0, r1) and columns [c0, c1) of every part.
  struct Block {
    std::string name;
    std::vector<int64_t> shape;  // the whole tensor's
    int64_t r0, r1, c0, c1;
  };
  StatusOr<kernels::cpu::PackedLinear> pack_blocks(const std::vector<Block>& parts,
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
    return kernels::cpu::PackedLinear::pack(staging_.data(), n, k, format);
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

// Whether this process holds MoE layer i's shared experts: the attention side
// (rank 0) unless they run on the expert workers; an expert process for the
// layers LoadOptions::shared_expert_layers names.
bool holds_shared_experts(const LoadOptions& o, int i, bool attention_rank0);

// The shared experts of MoE layer i (`ffn` = "model.layers.i.mlp.shared_experts.",
// total width `width`) into L.dense_ffn: whole on the attention side, expert
// tp shard r of tp on an expert process (rows [r W/tp, (r+1) W/tp) of gate
// and up, the same columns of down), in the format of the dense weights so
// both placements compute the same bits.
Status load_shared_experts(Loader& ld, const LoadOptions& o, const std::string& ffn, int64_t width,
                           int64_t h, kernels::cpu::WeightFormat fmt, LayerWeights& L);

// The GQA projections of one attention tp rank (`a` = "model.layers.i.self_attn."):
// its heads' rows of q, k and v (the KV heads its query heads read: a
// share, or one replicated head) into L.qkv, the same columns of o into L.o
// (everything at tp 1), and with c.attention_bias the same rows of the q,
// k and v biases, in qkv's row order, into L.qkv_bias. o_proj's bias
// (gpt-oss) is the caller's.
Status load_gqa_projections(Loader& ld, const ModelConfig& c, const std::string& a, int atp_rank,
                            int atp, kernels::cpu::WeightFormat fmt, LayerWeights& L);

// MoE layer i's routed experts that LoadOptions names into L.experts (sized
// to the expert count): whole at expert tp 1, else shard r of tp (rows
// [r F/tp, (r+1) F/tp) of w1 and w3, the same columns of w2). The others'
// tensors (and FP8 scales) are marked used, not read.
Status load_routed_experts(Loader& ld, const ModelConfig& c, int i, const LoadOptions& options,
                           kernels::cpu::WeightFormat fmt, LayerWeights& L);

// One DeepSeek-V2/V3 decoder layer: MLA attention, then a dense MLP (layers
// below first_k_dense_replace) or the router (with e_score_correction_bias when
// stored), the routed experts and the shared experts. Attention tp rank r of
// tp holds query heads [r H/tp, (r+1) H/tp): their rows of q_b_proj (or
// q_proj), their halves of kv_b_proj, the same columns of o_proj; q_a_proj,
// kv_a_proj_with_mqa and the two layernorms whole (every rank computes and
// caches the whole latent: MLA has one latent per token, read by every head).
// Ranks > 0 hold nothing else of the layer.
Status load_deepseek_layer(Loader& ld, const ModelConfig& c, int i, const LoadOptions& options,
                           LayerWeights& L);

bool is_gpt_oss(const ModelConfig& c);

// One gpt-oss decoder layer: GQA with biases on q/k/v/o and a sink per head,
// the router Linear with its bias, and the experts stored stacked
// (mlp.experts.gate_up_proj_* / down_proj_*, MXFP4, with biases). HF's
// gate_up_proj interleaves its output rows (2j: gate j, 2j + 1: up j); w13
// takes the gate rows first, then the up rows, as for every other model, and
// b13 the same order. Attention tp and expert tp slice as in the GQA loader.
Status load_gpt_oss_layer(Loader& ld, const Checkpoint& ckpt, const std::string& dir,
                          const ModelConfig& c, int i, const LoadOptions& options, LayerWeights& L);

}  // namespace msinfer::model::internal
