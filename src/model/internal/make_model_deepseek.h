// make-model presets of the DeepSeek-V2/V3 family and of GLM-4.5, which has
// DeepSeek-V3's MoE side (kept apart from make_model.cc, which calls in here
// for these preset names).
//
// tiny-deepseek-v3: DeepseekV3ForCausalLM, hidden 192 (one full and one
// partial 128-block), 2 decoder layers (layer 0 dense, first_k_dense_replace
// 1) plus one MTP layer (num_nextn_predict_layers 1, model.layers.2.* with
// enorm / hnorm / eh_proj / shared_head / embed_tokens as DeepSeek-V3 ships
// it), MLA with q_lora_rank 96, kv_lora_rank 64, qk_nope 32, qk_rope 16, v 32,
// 4 heads; 16 routed experts of width 80 in 4 groups, top-4 of the best 2
// groups by sigmoid + e_score_correction_bias (noaux_tc), routed_scaling_factor
// 2.5, one shared expert; YaRN factor 4 over 128 original positions. Every
// GEMM weight of the decoder layers is float8_e4m3fn with a float32
// weight_scale_inv per 128x128 block (amax / 448 of the block); embedding,
// norms, router, bias, eh_proj and LM head are bf16 (the bias float32).
//
// tiny-deepseek-v2-lite: DeepseekV2ForCausalLM, hidden 64, 3 layers (layer 0
// dense), MLA without q_lora (plain q_proj), kv_lora_rank 32, qk_nope 16,
// qk_rope 8, v 16; 8 routed experts of width 48, softmax greedy top-2 without
// renormalisation, two shared experts; YaRN with mscale 0.707; bf16.
//
// tiny-glm4-moe: Glm4MoeForCausalLM (GLM-4.5's layout), hidden 80, 3 layers
// (layer 0 dense, width 144) plus one MTP layer, GQA with 6 query and 2 KV
// heads of head_dim 32, RoPE on the first half of each head
// (partial_rotary_factor 0.5, theta 1e6), q/k/v biases, q/k norms; 12 routed
// experts of width 48 in 3 groups, top-3 of the best 2 groups by sigmoid +
// e_score_correction_bias (noaux_tc), routed_scaling_factor 2.5, one shared
// expert; bf16.
//
// small-deepseek: DeepseekV3ForCausalLM for benchmarks, ~0.42 B parameters
// (0.26 B of them embedding and LM head over DeepSeek-V3's 129,280-token
// vocabulary): hidden 1024, 6 layers (layer 0 dense, width 2816), MLA with
// 8 heads, q_lora_rank 384, kv_lora_rank 256, qk_nope 64, qk_rope 32, v 64;
// 16 routed experts of width 512 in 4 groups, top-4 of the best 2 groups by
// sigmoid + e_score_correction_bias (noaux_tc), routed_scaling_factor 2.5, one
// shared expert of width 512; YaRN factor 4 over 4096 original positions;
// bf16 (no fp8, no MTP layer). DeepSeek-V3's tokenizer and chat template
// (.cache/tokenizers/deepseek_v3, or --tokenizer).
//
// The tiny presets use the tiny byte-level tokenizer of tiny-qwen3moe.
#pragma once

#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/model/make_model.h"

namespace msinfer::model::internal {

// The ChatML chat template (Qwen's) that the tiny presets without a real
// tokenizer write: one definition for make_model.cc and the DeepSeek presets.
inline constexpr const char* kChatMlTemplate =
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

// The tokenizer_config.json of a preset whose tokenizer is trained here
// (byte-level, Qwen's conventions): ChatML, no BOS, <|endoftext|> ends.
inline Json chatml_tokenizer_config() {
  return Json{{"add_bos_token", false},
              {"eos_token", "<|endoftext|>"},
              {"tokenizer_class", "Qwen2Tokenizer"},
              {"chat_template", kChatMlTemplate}};
}

std::vector<std::string> deepseek_presets();
bool is_deepseek_preset(const std::string& preset);
// The config.json of a DeepSeek preset (vocab from its tokenizer).
Json deepseek_preset_config(const std::string& preset, int64_t vocab);
// Writes the preset's directory; `tokenizer` is the tokenizer.json to ship,
// `tokenizer_config` its tokenizer_config.json (null: the tiny presets'
// byte-level one, ChatML template).
Status make_deepseek_model(const MakeModelOptions& options, const Json& tokenizer,
                           const Json& tokenizer_config = Json());

}  // namespace msinfer::model::internal
