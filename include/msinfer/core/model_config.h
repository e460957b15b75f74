// ModelConfig: the one description of an MoE model, shared by the planner (its
// shape: layer counts and widths, from which it derives parameter counts,
// FLOPs and KV-cache bytes) and the engine (plus the numerics: RoPE base, norm
// epsilon, routing rule, special tokens). Built in: Mixtral-8x22B, DBRX,
// Scaled-MoE (docs/PLANNER.md section 2); or read from an HF config.json of a Mixtral,
// Qwen2-MoE, Qwen3-MoE, DBRX, DeepSeek-V2/V3, gpt-oss or GLM-4.5 model. The
// engine executes Mixtral, Qwen3-MoE, DeepSeek-V2/V3, gpt-oss and GLM-4.5 / 4.6
// (check_executable()).
//
// The planner charges shared experts and dense (non-MoE) layers to the
// attention side: every token visits them, so they are a dense GEMM with the
// attention replica's batch, exactly like the QKV and O projections
// (docs/PLANNER.md). The runtime can also run the shared experts on the
// expert workers (--shared-experts expert; docs/RUNTIME.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer {

struct ModelConfig {
  std::string name;
  std::string architecture;  // HF architectures[0], or "builtin"
  int layers = 0;            // all decoder layers
  int moe_layers = 0;        // layers with routed experts (<= layers)
  int64_t hidden = 0;        // h
  int64_t expert_ffn = 0;    // h' of one routed expert
  int experts = 0;           // E
  int top_k = 0;             // K
  int heads = 0;
  int kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;
  int64_t dense_ffn = 0;          // FFN width of the dense layers (layers - moe_layers of them)
  int64_t shared_expert_ffn = 0;  // total width of the shared experts of one MoE layer

  // Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank == 0 means plain GQA.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // DeepSeek-V2/V3 layer pattern, routing and position encoding (HF config.json
  // names in comments; GLM-4.5 has the same layer pattern and routing, fixed
  // at sigmoid / noaux_tc). Defaults describe Mixtral / Qwen-MoE: softmax over
  // all experts, plain top-K, every layer MoE, plain RoPE, bf16 weights.
  int shared_experts = 0;         // n_shared_experts (each moe_intermediate_size wide)
  int first_k_dense_replace = 0;  // layers [0, this) are dense
  int moe_layer_freq = 1;         // layer i >= first_k_dense_replace is MoE iff i % this == 0
  int nextn_predict_layers = 0;   // num_nextn_predict_layers: MTP layers stored after the
                                  // decoder layers (model.layers.<layers + j>.*); not run
  enum class ScoringFunc { kSoftmax, kSigmoid };
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;  // scoring_func
  // topk_method: greedy (top-K of all scores); group_limited_greedy (keep the
  // topk_group groups of n_group with the highest max score, then top-K);
  // noaux_tc (scores + e_score_correction_bias pick the groups, by the sum of
  // each group's two best, and the experts; the weights are the unbiased scores).
  enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
  TopkMethod topk_method = TopkMethod::kGreedy;
  int n_group = 1;                     // n_group: expert groups (divides experts)
  int topk_group = 1;                  // topk_group: groups a token may use (<= n_group)
  double routed_scaling_factor = 1.0;  // routed_scaling_factor: multiplies the routed weights
  // rope_scaling {"type": "yarn", ...}; yarn_factor == 0: none (plain RoPE).
  double yarn_factor = 0;                  // factor
  int64_t yarn_original_max_position = 0;  // original_max_position_embeddings
  double yarn_beta_fast = 32, yarn_beta_slow = 1;
  double yarn_mscale = 1, yarn_mscale_all_dim = 0;  // mscale, mscale_all_dim
  // quantization_config {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
  // [r, c]}: the GEMM weights are float8_e4m3fn with a float32 `<name>_scale_inv`
  // of ceil(rows/r) x ceil(cols/c) per weight (value = e4m3 * scale_inv per block).
  bool fp8_weights = false;
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;

  // gpt-oss (GptOssForCausalLM; HF config.json names in comments).
  // attention_bias: q/k/v/o projections have biases (GLM-4.5: q/k/v only).
  bool attention_bias = false;       // attention_bias
  bool attention_sinks = false;      // self_attn.sinks: a learned logit per head in the
                                     // softmax denominator (no value row)
  int64_t sliding_window = 0;        // sliding_window: tokens a sliding layer attends to
                                     // (its own position and the window - 1 before it)
  std::vector<bool> sliding_layers;  // layer_types[i] == "sliding_attention"; empty: none
  // swiglu_limit > 0: the experts' clamped SwiGLU of gpt-oss, gate (row 2j of
  // gate_up_proj) clamped above at the limit, up (row 2j + 1) to [-limit,
  // limit], act = gate sigmoid(swiglu_alpha gate) (up + 1); the experts and
  // the router have biases, and the top-K logits are softmaxed.
  double swiglu_limit = 0;      // swiglu_limit
  double swiglu_alpha = 1.702;  // fixed in HF's and OpenAI's code
  bool yarn_truncate = true;    // rope_scaling.truncate: floor/ceil the correction range
  // quantization_config {"quant_method": "mxfp4"}: every expert's
  // gate_up_proj / down_proj is `<name>_blocks` (U8 [E, rows, cols / 32, 16],
  // two e2m1 values a byte, low nibble first) and `<name>_scales` (U8 [E, rows,
  // cols / 32], e8m0: 2^(s - 127) per 32 values).
  bool mxfp4_experts = false;

  // Numerics the engine needs (defaults are the HF defaults of Mixtral).
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-5;
  bool norm_topk_prob = true;   // renormalise the top-K softmax weights (Mixtral: always)
  bool qk_norm = false;         // RMSNorm on q and k per head before RoPE (Qwen3; GLM use_qk_norm)
  // partial_rotary_factor (GLM-4.5: 0.5): RoPE (HF rotate_half, base rope_theta
  // over rotary_dim() dims) on the first rotary_dim() dims of each head only.
  double partial_rotary_factor = 1.0;
  int64_t max_position_embeddings = 32768;
  int64_t bos_token_id = -1;    // -1: none
  std::vector<int64_t> eos_token_ids;

  // Whether decoder layer `i` (0-based) has routed experts; the others have a
  // dense FFN of width dense_ffn.
  bool is_moe_layer(int i) const;
  // The sliding window of layer `i` in tokens, 0 for full attention.
  int64_t attention_window(int i) const;
  // YaRN temperature, as HF's DeepSeek modelling code: with
  // g(m) = 0.1 m ln(factor) + 1 (1 when factor <= 1 or no YaRN), the softmax
  // scale of MLA is (qk_nope + qk_rope)^-0.5 * g(mscale_all_dim)^2
  // (g = 1 when mscale_all_dim is 0), and cos/sin are multiplied by
  // g(mscale) / g(mscale_all_dim). DeepSeek's reference model scales the
  // softmax by g(mscale)^2 and leaves cos/sin alone: the same when mscale ==
  // mscale_all_dim, as in every published config.
  double yarn_attention_mscale() const;
  double yarn_rope_mscale() const;
  // Dims of each q/k head that RoPE rotates: int(head_dim * partial_rotary_factor),
  // truncated as HF's Python int() does (even: validate() checks it).
  int64_t rotary_dim() const;

  // Query heads per KV head (g in docs/PLANNER.md 3b).
  double gqa_group() const;
  // Attention projection parameters of one layer (QKV or MLA, O), without the router.
  double attention_params_per_layer() const;
  // Weights an attention worker holds: attention, norms, routers, embeddings,
  // LM head, shared experts and dense-layer FFNs (P_a in docs/PLANNER.md 3b).
  double attention_side_params() const;
  // Weights of one routed expert across all MoE layers.
  double expert_params() const;
  double total_params() const;
  // bf16 KV-cache bytes per token per layer (4*h/g for GQA with head_dim = h/heads).
  double kv_bytes_per_token_per_layer() const;

  // Attention tensor parallelism over `tp` ranks (GQA). The query heads split
  // evenly; the KV heads either split evenly too (tp divides them) or, when tp
  // is a multiple of them, each rank holds the one KV head its query heads
  // read, replicated on tp / kv_heads ranks (as vLLM does). Otherwise an error
  // naming the counts.
  Status check_attention_tp(int tp) const;
  // KV heads each of `tp` ranks holds: kv_heads / tp rounded up (1 when
  // replicated).
  int kv_heads_per_attention_rank(int tp) const;
  // The first of them on rank r (its first query head's KV head).
  int first_kv_head_of_attention_rank(int r, int tp) const;
  // kv_bytes_per_token_per_layer() on each of `tp` attention ranks: a GQA
  // rank's share of the KV heads (replicated heads counted on every rank); an
  // MLA latent whole on every rank (every head reads all of it: tensor
  // parallelism replicates it, as vLLM and SGLang do).
  double kv_bytes_per_token_per_layer_per_attention_rank(int tp) const;
  // FLOPs of one token in one MoE layer on the attention side, excluding the
  // attention-score FLOPs that grow with context (see attention_score_flops).
  double attention_side_flops_per_token_per_moe_layer() const;
  // Attention-score FLOPs (QK^T and PV) per token per layer at context `seq_len`.
  double attention_score_flops(double seq_len) const;
  // The tokens a layer attends to at context `context`, averaged over the
  // layers: `context` on full-attention layers, min(context, window) on
  // sliding ones (gpt-oss). What a decode step reads per layer, and what a
  // request's KV holds per layer once a sliding layer keeps only its window.
  double attended_tokens(double context) const;
  // FLOPs of one token through one routed expert in one layer (three GEMMs).
  double expert_flops_per_token() const { return 6.0 * hidden * expert_ffn; }

  Json to_json() const;
  // Reads what to_json() wrote (plan files carry the model this way).
  static StatusOr<ModelConfig> from_json(const JsonFields& f);
  // Checks the fields are consistent; names the model and field.
  Status validate() const;
  // OK when the engine can run this model: Mixtral or Qwen3-MoE (every layer
  // MoE, no shared expert, plain GQA attention), or DeepSeek-V2/V3 with latent
  // attention (dense first layers, shared experts, grouped routing) or GLM-4.5
  // (the same MoE side with GQA attention: partial rotary, q/k/v biases,
  // optional q/k norm) on the CPU, co-located or disaggregated (the dense
  // layers run on the attention side, the shared experts on either;
  // docs/RUNTIME.md, "DeepSeek").
  Status check_executable() const;
};

// Names of the built-in models, e.g. "mixtral-8x22b".
std::vector<std::string> builtin_model_names();
// A built-in model by name (case-insensitive).
StatusOr<ModelConfig> builtin_model(const std::string& name);
// Parses an HF config.json document; `source` names it in errors.
StatusOr<ModelConfig> parse_hf_config(const Json& config, const std::string& source);
// `name_or_path` is a built-in name, a config.json path, or a model directory
// containing config.json.
StatusOr<ModelConfig> load_model_config(const std::string& name_or_path);

}  // namespace msinfer
