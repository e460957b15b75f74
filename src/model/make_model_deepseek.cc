#include "internal/make_model_deepseek.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "internal/generated_checkpoint.h"
#include "msinfer/core/bf16.h"
#include "msinfer/core/fp8.h"
#include "msinfer/model/safetensors.h"
#include "msinfer/model/tokenizer.h"

namespace msinfer::model::internal {
namespace {

namespace fs = std::filesystem;

// One tensor to generate: `std` > 0 a normal N(0, std^2); < 0 a norm weight
// 1 + N(0, 0.1^2). `fp8`: stored as e4m3 with a block-scale tensor.
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  double std;
  bool fp8 = false;
  bool f32 = false;  // stored as float32 (e_score_correction_bias)
};

// The tensors of a DeepSeek-V2/V3 checkpoint (MLA attention), or of GLM-4.5
// (Glm4MoeForCausalLM: GQA attention with q/k/v biases and q/k norms when the
// config asks, no lm_head with tie_word_embeddings). Both have DeepSeek-V3's
// MoE side (dense first layers, a router with e_score_correction_bias for
// noaux_tc, routed and shared experts) and MTP layers as DeepSeek-V3 stores
// them.
std::vector<Spec> deepseek_specs(const Json& c, bool fp8) {
  const bool glm = c["architectures"][0] == "Glm4MoeForCausalLM";
  const int64_t h = c["hidden_size"], V = c["vocab_size"];
  const int64_t L = c["num_hidden_layers"], mtp = c.value("num_nextn_predict_layers", int64_t{0});
  const int64_t E = c["n_routed_experts"], F = c["moe_intermediate_size"];
  const int64_t S = c["n_shared_experts"], I = c["intermediate_size"];
  const int64_t first_dense = c["first_k_dense_replace"];
  const bool router_bias = glm || c.value("topk_method", "") == "noaux_tc";
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(L));
  auto fan = [](int64_t in) { return 1.0 / std::sqrt(static_cast<double>(in)); };
  std::vector<Spec> s;
  auto gqa_attention = [&](const std::string& a) {
    const int64_t H = c["num_attention_heads"], KV = c["num_key_value_heads"];
    const int64_t hd = c["head_dim"];
    s.push_back({a + "q_proj.weight", {H * hd, h}, fan(h), fp8});
    s.push_back({a + "k_proj.weight", {KV * hd, h}, fan(h), fp8});
    s.push_back({a + "v_proj.weight", {KV * hd, h}, fan(h), fp8});
    if (c.value("attention_bias", false)) {
      s.push_back({a + "q_proj.bias", {H * hd}, 0.3});
      s.push_back({a + "k_proj.bias", {KV * hd}, 0.3});
      s.push_back({a + "v_proj.bias", {KV * hd}, 0.3});
    }
    if (c.value("use_qk_norm", false)) {
      s.push_back({a + "q_norm.weight", {hd}, -1});
      s.push_back({a + "k_norm.weight", {hd}, -1});
    }
    s.push_back({a + "o_proj.weight", {h, H * hd}, out_scale * fan(H * hd), fp8});
  };
  auto mla_attention = [&](const std::string& a) {
    const int64_t H = c["num_attention_heads"];
    const int64_t q_lora = c["q_lora_rank"].is_null() ? 0 : c["q_lora_rank"].get<int64_t>();
    const int64_t kv_lora = c["kv_lora_rank"], nope = c["qk_nope_head_dim"];
    const int64_t rope = c["qk_rope_head_dim"], vd = c["v_head_dim"];
    if (q_lora > 0) {
      s.push_back({a + "q_a_proj.weight", {q_lora, h}, fan(h), fp8});
      s.push_back({a + "q_a_layernorm.weight", {q_lora}, -1});
      s.push_back({a + "q_b_proj.weight", {H * (nope + rope), q_lora}, fan(q_lora), fp8});
    } else {
      s.push_back({a + "q_proj.weight", {H * (nope + rope), h}, fan(h), fp8});
    }
    s.push_back({a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, h}, fan(h), fp8});
    s.push_back({a + "kv_a_layernorm.weight", {kv_lora}, -1});
    s.push_back({a + "kv_b_proj.weight", {H * (nope + vd), kv_lora}, fan(kv_lora), fp8});
    s.push_back({a + "o_proj.weight", {h, H * vd}, out_scale * fan(H * vd), fp8});
  };
  // Tied: the embedding is the LM head too, drawn at its scale so logits stay ~N(0, 1).
  const bool tied = c.value("tie_word_embeddings", false);
  s.push_back({"model.embed_tokens.weight", {V, h}, tied ? fan(h) : 1.0});
  auto mlp = [&](const std::string& p, int64_t width) {
    s.push_back({p + "gate_proj.weight", {width, h}, fan(h), fp8});
    s.push_back({p + "up_proj.weight", {width, h}, fan(h), fp8});
    s.push_back({p + "down_proj.weight", {h, width}, out_scale * fan(width), fp8});
  };
  for (int64_t i = 0; i < L + mtp; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (i >= L) {  // a multi-token-prediction module
      s.push_back({p + "embed_tokens.weight", {V, h}, 1.0});
      s.push_back({p + "enorm.weight", {h}, -1});
      s.push_back({p + "hnorm.weight", {h}, -1});
      s.push_back({p + "eh_proj.weight", {h, 2 * h}, fan(2 * h)});
      s.push_back({p + "shared_head.norm.weight", {h}, -1});
      s.push_back({p + "shared_head.head.weight", {V, h}, fan(h)});
    }
    s.push_back({p + "input_layernorm.weight", {h}, -1});
    if (glm) {
      gqa_attention(p + "self_attn.");
    } else {
      mla_attention(p + "self_attn.");
    }
    s.push_back({p + "post_attention_layernorm.weight", {h}, -1});
    if (i < first_dense) {
      mlp(p + "mlp.", I);
      continue;
    }
    s.push_back({p + "mlp.gate.weight", {E, h}, fan(h)});
    if (router_bias) s.push_back({p + "mlp.gate.e_score_correction_bias", {E}, 0.1, false, true});
    for (int64_t e = 0; e < E; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", F);
    if (S > 0) mlp(p + "mlp.shared_experts.", S * F);
  }
  s.push_back({"model.norm.weight", {h}, -1});
  if (!tied) s.push_back({"lm_head.weight", {V, h}, fan(h)});
  return s;
}

// `v` as float8 e4m3 with a float32 weight_scale_inv per br x bc block:
// scale_inv = amax / 448 of the block, value = e4m3(w / scale_inv).
void fp8_block_tensors(const Spec& sp, const std::vector<float>& v, int64_t br, int64_t bc,
                       std::vector<GeneratedTensor>& outs) {
  const int64_t rows = sp.shape[0], cols = sp.shape[1];
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  GeneratedTensor q{sp.name, DType::kF8E4M3, sp.shape, std::vector<uint8_t>(v.size())};
  std::vector<float> scale(static_cast<size_t>(sr * sc));
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 0;
      for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
        for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) {
          amax = std::max(amax, std::fabs(v[r * cols + c]));
        }
      }
      const float si = amax > 0 ? amax / 448.0f : 1.0f;
      scale[bi * sc + bj] = si;
      for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
        for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) {
          q.data[r * cols + c] = float_to_e4m3(v[r * cols + c] / si);
        }
      }
    }
  }
  outs.push_back(std::move(q));
  outs.push_back(encode_tensor(sp.name + "_scale_inv", {sr, sc}, scale, DType::kF32));
}

}  // namespace

std::vector<std::string> deepseek_presets() {
  return {"tiny-deepseek-v3", "tiny-deepseek-v2-lite", "tiny-glm4-moe", "small-deepseek"};
}

bool is_deepseek_preset(const std::string& preset) {
  const auto p = deepseek_presets();
  return std::find(p.begin(), p.end(), preset) != p.end();
}

namespace {

// The fields every MLA preset shares (DeepSeek-V3's layout at tiny size):
// the presets below are this with their own fields over it.
Json mla_preset_base(int64_t vocab) {
  return Json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"hidden_size", 192},
              {"intermediate_size", 320},
              {"moe_intermediate_size", 80},
              {"num_hidden_layers", 2},
              {"num_nextn_predict_layers", 1},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"n_routed_experts", 16},
              {"n_shared_experts", 1},
              {"num_experts_per_tok", 4},
              {"n_group", 4},
              {"topk_group", 2},
              {"topk_method", "noaux_tc"},
              {"scoring_func", "sigmoid"},
              {"norm_topk_prob", true},
              {"routed_scaling_factor", 2.5},
              {"first_k_dense_replace", 1},
              {"moe_layer_freq", 1},
              {"q_lora_rank", 96},
              {"kv_lora_rank", 64},
              {"qk_nope_head_dim", 32},
              {"qk_rope_head_dim", 16},
              {"v_head_dim", 32},
              {"max_position_embeddings", 512},
              {"rope_theta", 10000},
              {"rope_scaling",
               {{"type", "yarn"},
                {"factor", 4},
                {"original_max_position_embeddings", 128},
                {"beta_fast", 32},
                {"beta_slow", 1},
                {"mscale", 1.0},
                {"mscale_all_dim", 1.0}}},
              {"rms_norm_eps", 1e-6},
              {"vocab_size", vocab},
              {"tie_word_embeddings", false},
              {"bos_token_id", Json()},
              {"eos_token_id", vocab - 3},  // <|endoftext|>
              {"torch_dtype", "bfloat16"}};
}

// `base` with `fields` over it (objects merged field by field).
Json with_fields(Json base, const Json& fields) {
  base.update(fields, /*merge_objects=*/true);
  return base;
}

}  // namespace

Json deepseek_preset_config(const std::string& preset, int64_t vocab) {
  if (preset == "tiny-glm4-moe") {
    return Json{{"architectures", {"Glm4MoeForCausalLM"}},
                {"model_type", "glm4_moe"},
                {"hidden_size", 80},
                {"intermediate_size", 144},
                {"moe_intermediate_size", 48},
                {"num_hidden_layers", 3},
                {"num_nextn_predict_layers", 1},
                {"num_attention_heads", 6},
                {"num_key_value_heads", 2},
                {"head_dim", 32},
                {"partial_rotary_factor", 0.5},
                {"attention_bias", true},
                {"use_qk_norm", true},
                {"n_routed_experts", 12},
                {"n_shared_experts", 1},
                {"num_experts_per_tok", 3},
                {"n_group", 3},
                {"topk_group", 2},
                {"norm_topk_prob", true},
                {"routed_scaling_factor", 2.5},
                {"first_k_dense_replace", 1},
                {"hidden_act", "silu"},
                {"max_position_embeddings", 2048},
                {"rope_theta", 1000000.0},
                {"rope_scaling", Json()},
                {"rms_norm_eps", 1e-5},
                {"vocab_size", vocab},
                {"tie_word_embeddings", false},
                {"pad_token_id", vocab - 3},
                {"eos_token_id", vocab - 3},  // <|endoftext|>
                {"torch_dtype", "bfloat16"}};
  }
  if (preset == "small-deepseek") {
    return with_fields(mla_preset_base(vocab),
                       {{"hidden_size", 1024},
                        {"intermediate_size", 2816},
                        {"moe_intermediate_size", 512},
                        {"num_hidden_layers", 6},
                        {"num_nextn_predict_layers", 0},
                        {"num_attention_heads", 8},
                        {"num_key_value_heads", 8},
                        {"q_lora_rank", 384},
                        {"kv_lora_rank", 256},
                        {"qk_nope_head_dim", 64},
                        {"qk_rope_head_dim", 32},
                        {"v_head_dim", 64},
                        {"max_position_embeddings", 16384},
                        {"rope_scaling", {{"original_max_position_embeddings", 4096}}},
                        {"bos_token_id", 0},    // <｜begin▁of▁sentence｜>
                        {"eos_token_id", 1}});  // <｜end▁of▁sentence｜>
  }
  if (preset == "tiny-deepseek-v3") {
    return with_fields(mla_preset_base(vocab), {{"quantization_config",
                                                 {{"activation_scheme", "dynamic"},
                                                  {"fmt", "e4m3"},
                                                  {"quant_method", "fp8"},
                                                  {"weight_block_size", {128, 128}}}}});
  }
  // tiny-deepseek-v2-lite: no q_lora (a plain q_proj), softmax greedy routing.
  Json c = with_fields(mla_preset_base(vocab),
                       {{"architectures", {"DeepseekV2ForCausalLM"}},
                        {"model_type", "deepseek_v2"},
                        {"hidden_size", 64},
                        {"intermediate_size", 160},
                        {"moe_intermediate_size", 48},
                        {"num_hidden_layers", 3},
                        {"n_routed_experts", 8},
                        {"n_shared_experts", 2},
                        {"num_experts_per_tok", 2},
                        {"n_group", 1},
                        {"topk_group", 1},
                        {"topk_method", "greedy"},
                        {"scoring_func", "softmax"},
                        {"norm_topk_prob", false},
                        {"routed_scaling_factor", 1.0},
                        {"q_lora_rank", Json()},
                        {"kv_lora_rank", 32},
                        {"qk_nope_head_dim", 16},
                        {"qk_rope_head_dim", 8},
                        {"v_head_dim", 16},
                        {"rope_scaling", {{"mscale", 0.707}, {"mscale_all_dim", 0.707}}}});
  c.erase("num_nextn_predict_layers");  // V2-Lite's config has none
  return c;
}

Status make_deepseek_model(const MakeModelOptions& o, const Json& tok_json,
                           const Json& tokenizer_config) {
  const Json tok_config =
      !tokenizer_config.is_null() ? tokenizer_config : chatml_tokenizer_config();
  auto tok = Tokenizer::from_json(tok_json, &tok_config, "tokenizer.json");
  if (!tok.ok()) return tok.status();
  Json config = deepseek_preset_config(o.preset, tok->vocab_size());
  if (!o.config_overrides.is_null()) {
    if (!o.config_overrides.is_object()) return invalid_argument("config overrides must be an object");
    config.merge_patch(o.config_overrides);
  }
  if (o.shards < 1 || o.shards > 64) return invalid_argument("--shards must be in 1..64");
  if (o.router_skew_zipf != 0) {
    return invalid_argument("--router-skew is not supported for " + o.preset);
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return not_found("--out " + o.out_dir + ": cannot create (" + ec.message() + ")");

  const bool fp8 = config.contains("quantization_config");
  const int64_t br = fp8 ? config["quantization_config"]["weight_block_size"][0].get<int64_t>() : 0;
  const int64_t bc = fp8 ? config["quantization_config"]["weight_block_size"][1].get<int64_t>() : 0;
  const std::vector<Spec> specs = deepseek_specs(config, fp8);

  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  MSI_RETURN_IF_ERROR(write_generated_weights(
      o.out_dir, specs.size(), o.shards, [&](size_t i, std::vector<GeneratedTensor>& outs) {
        const Spec& sp = specs[i];
        const int64_t n = numel(sp.shape);
        const std::vector<float> v = draw_values(n, sp.std, rng, normal);
        if (sp.f32) {
          outs.push_back(encode_tensor(sp.name, sp.shape, v, DType::kF32));
        } else if (sp.fp8) {
          fp8_block_tensors(sp, v, br, bc, outs);
        } else {
          outs.push_back(encode_tensor(sp.name, sp.shape, v, o.dtype));
        }
      }));
  return write_model_files(o.out_dir, config, tok_json, tok_config,
                           Json{{"eos_token_id", config["eos_token_id"]}});
}

}  // namespace msinfer::model::internal
