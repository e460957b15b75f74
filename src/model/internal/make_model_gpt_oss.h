// make-model presets of OpenAI's gpt-oss (GptOssForCausalLM), kept apart from
// make_model.cc, which calls in here for these preset names.
//
// tiny-gpt-oss: hidden 96, 4 layers (sliding_attention, full_attention, ...:
// layer_types as the published configs, a 16-token window), 4 query heads
// and 2 KV heads of head_dim 64 (wider than hidden, as the real models),
// biases on q/k/v/o, a sink logit per head; 8 experts of width 64, top-4,
// router with bias, experts with biases, swiglu_limit 7; YaRN factor 32 over
// 4096 original positions (truncate false), max_position_embeddings 131072.
// small-gpt-oss: hidden 1024, 8 layers, 16/4 heads, 16 experts of 1024,
// window 128. The experts' gate_up_proj / down_proj are written as the
// published checkpoints hold them: MXFP4 (`*_blocks` U8 [E, rows, cols / 32,
// 16], two e2m1 values a byte, low nibble first; `*_scales` U8 [E, rows,
// cols / 32], e8m0), gate_up_proj's rows interleaved (2j gate, 2j + 1 up),
// with `quantization_config` {"quant_method": "mxfp4"}; everything else bf16
// (or --dtype). Both use tiny-qwen3moe's byte-level tokenizer.
#pragma once

#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/model/make_model.h"

namespace msinfer::model::internal {

std::vector<std::string> gpt_oss_presets();
bool is_gpt_oss_preset(const std::string& preset);
Json gpt_oss_preset_config(const std::string& preset, int64_t vocab);
// tokenizer_config: null for the trained tokenizer (ChatML template added);
// else the one that came with `tokenizer` (o200k: harmony, <|return|> the EOS).
Status make_gpt_oss_model(const MakeModelOptions& options, const Json& tokenizer,
                          const Json& tokenizer_config = Json());

// MXFP4 of one block of 32 values: the e8m0 exponent byte (2^(byte - 127)
// is the smallest power of two with amax / scale <= 6; 127 for an all-zero
// block) and the 16 bytes of nearest e2m1 codes (ties to the even code),
// value 2i in the low nibble of byte i.
uint8_t mxfp4_quantize_block(const float* v, uint8_t* bytes16);

}  // namespace msinfer::model::internal
