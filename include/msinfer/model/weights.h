// Model weights as the engine uses them, loaded from an HF-layout checkpoint of
// a Mixtral, Qwen3-MoE, DeepSeek-V2/V3 or GLM-4.5 model (tensor names as the
// HF checkpoints).
//
// Every GEMM weight is converted to bf16 if needed and packed for the CPU GEMM
// of the active kernel level (kernels::cpu::PackedLinear), as bf16 or, with
// LoadOptions::weights = kInt8, quantised to int8; the mapped checkpoint pages are then released,
// so resident memory is the packed copy, not both. With kMxfp4, the experts
// of an MXFP4 checkpoint (gpt-oss) stay 4-bit (PackedLinear::pack_mxfp4, the
// checkpoint's blocks and scales repacked for the level) and every other GEMM
// weight is bf16. Q, K, V are stacked into one
// GEMM and each expert's w1 (gate) and w3 (up) into another. The embedding
// stays memory-mapped (only the rows looked up become resident) unless the
// checkpoint is not bf16.
//
// LoadOptions select a part: an attention worker loads no expert weights, an
// expert worker only its experts (and nothing else).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/core/model_config.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/model/safetensors.h"

namespace msinfer::model {

struct ExpertWeights {
  kernels::cpu::PackedLinear w13;  // [2F, h]: rows 0..F-1 gate (w1), F..2F-1 up (w3)
  kernels::cpu::PackedLinear w2;   // [h, F]
  // gpt-oss: gate_up_proj_bias de-interleaved like w13 [2F] (this shard's F),
  // down_proj_bias [h] (on expert tp shard 0 only; empty on the others).
  std::vector<float> b13, b2;
};

struct LayerWeights {
  std::vector<float> input_norm;      // [h]
  std::vector<float> post_attn_norm;  // [h]
  std::vector<float> q_norm, k_norm;  // [head_dim], Qwen3 and GLM with use_qk_norm
  // GQA: [(heads + 2 kv_heads) head_dim, h] (q, k, v stacked).
  // MLA (ModelConfig::kv_lora_rank > 0): the GEMMs that read the normed input,
  // stacked: q_a_proj [q_lora, h] (or q_proj [heads (nope + rope), h] without
  // q_lora) then kv_a_proj_with_mqa [kv_lora + rope, h].
  kernels::cpu::PackedLinear qkv;
  kernels::cpu::PackedLinear o;       // [h, heads head_dim]; MLA: [h, heads v_head_dim]
  kernels::cpu::PackedLinear router;  // [E, h]; empty in a dense layer
  std::vector<ExpertWeights>
      experts;  // [E]; empty entries for experts not loaded (all in a dense layer)

  // MLA only. q_b_proj [heads (nope + rope), q_lora] (empty without q_lora).
  kernels::cpu::PackedLinear q_b;
  std::vector<float> q_a_norm;   // [q_lora] q_a_layernorm
  std::vector<float> kv_a_norm;  // [kv_lora] kv_a_layernorm
  // kv_b_proj [heads (nope + v), kv_lora] split per head: w_uk [heads][nope][kv_lora]
  // (the key half, absorbed into the query) and w_uv [heads][v][kv_lora] (the
  // value half, applied to the attention-weighted latent).
  std::vector<bf16> w_uk, w_uv;
  // The FFN every token of the layer visits, on the attention side: the dense
  // MLP of a layer below first_k_dense_replace, or the shared experts of a
  // MoE layer (one SwiGLU of width n_shared_experts x moe_intermediate_size).
  // Empty when the layer has neither, and on the attention side for a MoE
  // layer whose shared experts an expert worker holds (LoadOptions: there,
  // this is its tp shard of them, expert id `experts` to ExpertRunner).
  ExpertWeights dense_ffn;
  // DeepSeek-V3's and GLM-4.5's gate.e_score_correction_bias [E] in float32
  // (selection only); else empty.
  std::vector<float> router_bias;

  // Attention biases (ModelConfig::attention_bias; else empty): qkv_bias is
  // this rank's fused row in float32 (bf16 values), q then k then v, in qkv's
  // row order ((heads + 2 kv_heads) head_dim / tp), added right after
  // qkv.forward; o_bias [h] (gpt-oss; GLM-4.5 has none) is added once, on
  // attention tp rank 0 (empty on the others: the partial o outputs are summed).
  std::vector<float> qkv_bias;
  std::vector<float> o_bias;
  // gpt-oss: self_attn.sinks of this rank's query heads [heads / tp]; and the
  // router Linear's own bias mlp.router.bias [E], added to the logits before
  // the top-K (unlike router_bias). Empty for other models.
  std::vector<float> sinks;
  std::vector<float> router_logit_bias;
};

struct LoadOptions {
  bool attention = true;             // embedding, attention, norms, routers, LM head
  bool all_experts = true;           // every expert ...
  std::vector<int> experts;          // ... or only these (when all_experts is false)
  // Expert tensor parallelism: this process holds shard expert_tp_rank of
  // expert_tp_size of every expert it loads. Shard r of an expert with FFN
  // width F (F divisible by the size) is rows [r F/tp, (r+1) F/tp) of w1 and w3
  // (column-parallel gate/up) and the same columns of w2 (row-parallel down),
  // so ExpertWeights::w13 is [2F/tp, h], w2 [h, F/tp] and the FFN's output is
  // this shard's partial sum: the tp partials add up to the whole expert's output.
  int expert_tp_rank = 0, expert_tp_size = 1;
  // Attention tensor parallelism (with `attention`): this process is rank
  // attention_tp_rank of an attention replica of attention_tp_size ranks.
  // Rank r holds query heads [r H/tp, (r+1) H/tp) and KV heads [r KV/tp,
  // (r+1) KV/tp) (tp must divide both): its rows of q/k/v (column-parallel,
  // LayerWeights::qkv is [(H + 2 KV) head_dim / tp, h]) and the same columns
  // of o_proj (row-parallel, LayerWeights::o is [h, H head_dim / tp]), whose
  // output is the rank's partial sum. Rank 0 also holds everything else of
  // the attention side (embedding, norms, routers, LM head); ranks > 0 hold
  // only their q/k/v/o slices (and Qwen3's q/k norms). DeepSeek's MLA: rank
  // r holds its heads' rows of q_b_proj (or q_proj), their halves of
  // kv_b_proj (w_uk, w_uv) and the same columns of o_proj, and q_a_proj,
  // kv_a_proj_with_mqa and their norms whole (every rank caches the latent).
  int attention_tp_rank = 0, attention_tp_size = 1;
  // The shared experts of MoE layers (DeepSeek, GLM-4.5), in
  // LayerWeights::dense_ffn: held by the attention side (rank 0) when
  // shared_experts_with_attention; else (--shared-experts expert) by the
  // expert process whose shared_expert_layers names the layer, as its expert
  // tp shard (expert_tp_rank of expert_tp_size: rows of gate/up, columns of
  // down, as for a routed expert). Dense layers' MLPs stay with the attention side.
  bool shared_experts_with_attention = true;
  std::vector<int> shared_expert_layers;
  // GEMM weight format. int8 quantises every GEMM weight but the routers (the
  // gate's top-K is sensitive and its weight tiny); the embedding stays bf16.
  // mxfp4 keeps an MXFP4 checkpoint's expert weights 4-bit and loads the rest
  // as bf16; INVALID_ARGUMENT for a checkpoint without MXFP4 experts, and for
  // an expert tp shard whose FFN width is not a multiple of 32.
  kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16;
};

class ModelWeights {
 public:
  // Reads config.json and the safetensors of `dir`; checks every tensor's
  // presence, dtype and shape against the config and that no tensor is left over.
  static StatusOr<std::unique_ptr<ModelWeights>> load(const std::string& dir,
                                                       const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  // The checkpoint directory the weights came from (device backends load
  // their own copies from it).
  const std::string& dir() const { return dir_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const kernels::cpu::PackedLinear& lm_head() const { return lm_head_; }
  // Embedding row of token `id` as floats (bf16 values) into out[h].
  void embed(int64_t id, float* out) const;
  bool has_expert(int layer, int expert) const;
  // Online rebalancing (docs/RUNTIME.md): an expert worker that loaded the
  // experts it gains into `added` (with the same LoadOptions but the expert
  // list; null when it gains none) takes them over, then frees every expert
  // not in `keep`. Not thread-safe: the caller runs no FFN meanwhile.
  void replace_experts(ModelWeights* added, const std::vector<int>& keep);
  // LoadOptions::attention_tp_rank / _size the weights were loaded with.
  int attention_tp_rank() const { return attention_tp_rank_; }
  int attention_tp_size() const { return attention_tp_size_; }
  // Packed GEMM weight bytes held (what the resident set should be close to).
  size_t packed_bytes() const;

 private:
  ModelConfig config_;
  std::string dir_;
  int attention_tp_rank_ = 0, attention_tp_size_ = 1;
  Checkpoint checkpoint_;
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;
  kernels::cpu::PackedLinear lm_head_;
  const TensorView* embed_view_ = nullptr;
  std::vector<bf16> embed_copy_;  // when the checkpoint's embedding is not bf16
};

// HF tensor names of the experts of one layer for the architecture.
struct ExpertTensorNames {
  std::string w1, w2, w3;
};
// The tensor `name` of `ckpt` as bf16 values (converted from f16/f32), with
// exactly `shape`; INVALID_ARGUMENT naming file and tensor otherwise (also for
// an F8_E4M3 tensor: those need read_weight_bf16).
StatusOr<std::vector<bf16>> read_bf16(const Checkpoint& ckpt, const std::string& name,
                                      const std::vector<int64_t>& shape);

// FP8 block-scaled weights (ModelConfig::fp8_weights; DeepSeek-V3 checkpoints):
// the float32 block scales of float8_e4m3fn weight `weight` are the tensor
// fp8_scale_name(weight) = weight + "_scale_inv".
std::string fp8_scale_name(const std::string& weight);
// The GEMM weight `name` of the checkpoint as bf16 values, row-major with
// exactly `shape` [rows, cols]: bf16 as stored, f16 / f32 rounded to bf16, and
// float8_e4m3fn dequantised: w[r][c] = e4m3(q[r][c]) * scale[r / br][c / bc]
// in float32, rounded to bf16 once (what DeepSeek's weight_dequant stores;
// br x bc = config.fp8_block_rows x _cols, the last row and column of blocks
// may be partial). The engine's loader packs weights through the same code.
// INVALID_ARGUMENT naming the file and tensor: a missing weight or scale
// tensor, a wrong shape, scales that are not F32 or not ceil(rows/br) x
// ceil(cols/bc) blocks, a scale that is NaN, infinite, zero or negative, or an
// F8_E4M3 weight when the config has no fp8 quantization_config. `dir` names
// the checkpoint in errors about missing tensors.
StatusOr<std::vector<bf16>> read_weight_bf16(const Checkpoint& ckpt, const ModelConfig& config,
                                             const std::string& name,
                                             const std::vector<int64_t>& shape,
                                             const std::string& dir = "checkpoint");

// MXFP4 (gpt-oss's experts, ModelConfig::mxfp4_experts): one block of 32
// values from its 16 bytes and e8m0 scale byte (the kernels' decode, gemm.h).
using kernels::cpu::mxfp4_decode_block;

ExpertTensorNames expert_tensor_names(const ModelConfig& c, int layer, int expert);
std::string router_tensor_name(const ModelConfig& c, int layer);

}  // namespace msinfer::model
