#include "internal/make_model_gpt_oss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "internal/generated_checkpoint.h"
#include "internal/make_model_deepseek.h"
#include "msinfer/core/bf16.h"
#include "msinfer/core/model_config.h"
#include "msinfer/model/safetensors.h"
#include "msinfer/model/tokenizer.h"

namespace msinfer::model::internal {
namespace {

namespace fs = std::filesystem;

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t e2m1_code(float x) {
  const float a = std::fabs(x);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(a - kE2m1[i]), db = std::fabs(a - kE2m1[best]);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) && best != 0 ? 8 : 0));
}

// One tensor to generate: std > 0 a normal N(0, std^2); < 0 a norm weight 1 +
// N(0, 0.1^2). mxfp4: [E, rows, cols] written as `name`_blocks / _scales.
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  double std;
  bool mxfp4 = false;
};

std::vector<Spec> gpt_oss_specs(const Json& c) {
  const int64_t h = c["hidden_size"], V = c["vocab_size"], L = c["num_hidden_layers"];
  const int64_t H = c["num_attention_heads"], KV = c["num_key_value_heads"], hd = c["head_dim"];
  const int64_t E = c["num_local_experts"], F = c["intermediate_size"];
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(L));
  auto fan = [](int64_t in) { return 1.0 / std::sqrt(static_cast<double>(in)); };
  std::vector<Spec> s;
  s.push_back({"model.embed_tokens.weight", {V, h}, 1.0});
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".", a = p + "self_attn.";
    s.push_back({p + "input_layernorm.weight", {h}, -1});
    s.push_back({a + "q_proj.weight", {H * hd, h}, fan(h)});
    s.push_back({a + "q_proj.bias", {H * hd}, 0.1});
    s.push_back({a + "k_proj.weight", {KV * hd, h}, fan(h)});
    s.push_back({a + "k_proj.bias", {KV * hd}, 0.1});
    s.push_back({a + "v_proj.weight", {KV * hd, h}, fan(h)});
    s.push_back({a + "v_proj.bias", {KV * hd}, 0.1});
    s.push_back({a + "o_proj.weight", {h, H * hd}, out_scale * fan(H * hd)});
    s.push_back({a + "o_proj.bias", {h}, 0.05});
    s.push_back({a + "sinks", {H}, 1.0});
    s.push_back({p + "post_attention_layernorm.weight", {h}, -1});
    s.push_back({p + "mlp.router.weight", {E, h}, fan(h)});
    s.push_back({p + "mlp.router.bias", {E}, 0.3});
    s.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * F, h}, fan(h), true});
    s.push_back({p + "mlp.experts.gate_up_proj_bias", {E, 2 * F}, 0.1});
    s.push_back({p + "mlp.experts.down_proj", {E, h, F}, out_scale * fan(F), true});
    s.push_back({p + "mlp.experts.down_proj_bias", {E, h}, 0.05});
  }
  s.push_back({"model.norm.weight", {h}, -1});
  s.push_back({"lm_head.weight", {V, h}, fan(h)});
  return s;
}

}  // namespace

uint8_t mxfp4_quantize_block(const float* v, uint8_t* bytes16) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
  int e = 0;
  if (amax > 0) e = std::clamp(static_cast<int>(std::ceil(std::log2(amax / 6.0f))), -127, 127);
  for (int i = 0; i < 16; ++i) {
    const uint8_t lo = e2m1_code(std::ldexp(v[2 * i], -e));
    const uint8_t hi = e2m1_code(std::ldexp(v[2 * i + 1], -e));
    bytes16[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return static_cast<uint8_t>(e + 127);
}

std::vector<std::string> gpt_oss_presets() { return {"tiny-gpt-oss", "small-gpt-oss"}; }

bool is_gpt_oss_preset(const std::string& preset) {
  const auto p = gpt_oss_presets();
  return std::find(p.begin(), p.end(), preset) != p.end();
}

Json gpt_oss_preset_config(const std::string& preset, int64_t vocab) {
  const bool tiny = preset == "tiny-gpt-oss";
  const int layers = tiny ? 4 : 8;
  Json types = Json::array();
  for (int i = 0; i < layers; ++i)
    types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return Json{{"architectures", {"GptOssForCausalLM"}},
              {"model_type", "gpt_oss"},
              {"hidden_size", tiny ? 96 : 1024},
              {"intermediate_size", tiny ? 64 : 1024},
              {"num_hidden_layers", layers},
              {"layer_types", types},
              {"sliding_window", tiny ? 16 : 128},
              {"num_attention_heads", tiny ? 4 : 16},
              {"num_key_value_heads", tiny ? 2 : 4},
              {"head_dim", 64},
              {"attention_bias", true},
              {"num_local_experts", tiny ? 8 : 16},
              {"num_experts_per_tok", 4},
              {"experts_per_token", 4},
              {"swiglu_limit", 7.0},
              {"rope_theta", 150000},
              {"rope_scaling",
               {{"rope_type", "yarn"},
                {"factor", 32.0},
                {"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"original_max_position_embeddings", 4096},
                {"truncate", false}}},
              {"initial_context_length", 4096},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-5},
              {"quantization_config",
               {{"quant_method", "mxfp4"},
                {"modules_to_not_convert",
                 {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                  "lm_head"}}}},
              {"vocab_size", vocab},
              {"tie_word_embeddings", false},
              {"bos_token_id", Json()},
              {"eos_token_id", vocab - 3},  // <|endoftext|>
              {"torch_dtype", "bfloat16"}};
}

Status make_gpt_oss_model(const MakeModelOptions& o, const Json& tok_json,
                          const Json& given_tok_config) {
  const Json tok_config =
      given_tok_config.is_object() ? given_tok_config : chatml_tokenizer_config();
  auto tok = Tokenizer::from_json(tok_json, &tok_config, "tokenizer.json");
  if (!tok.ok()) return tok.status();
  Json config = gpt_oss_preset_config(o.preset, tok->vocab_size());
  // The published models' ends: <|return|> in config.json, and <|return|>,
  // <|endoftext|>, <|call|> in generation_config.json.
  Json gen_eos = config["eos_token_id"];
  if (auto ret = tok->token_id("<|return|>")) {
    config["eos_token_id"] = *ret;
    gen_eos = Json::array();
    for (const char* t : {"<|return|>", "<|endoftext|>", "<|call|>"}) {
      if (auto id = tok->token_id(t)) gen_eos.push_back(*id);
    }
  }
  if (!o.config_overrides.is_null()) {
    if (!o.config_overrides.is_object())
      return invalid_argument("config overrides must be an object");
    config.merge_patch(o.config_overrides);
    if (!o.config_overrides.contains("layer_types")) {  // follow a changed layer count
      Json types = Json::array();
      for (int i = 0; i < config["num_hidden_layers"].get<int>(); ++i) {
        types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
      }
      config["layer_types"] = types;
    }
  }
  // The loader's own checks first (a bad override is reported as the loader would).
  {
    auto parsed = parse_hf_config(config, "config.json");
    if (!parsed.ok()) return parsed.status();
  }
  if (o.shards < 1 || o.shards > 64) return invalid_argument("--shards must be in 1..64");
  if (o.router_skew_zipf != 0) {
    return invalid_argument("--router-skew is not supported for " + o.preset);
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return not_found("--out " + o.out_dir + ": cannot create (" + ec.message() + ")");

  const std::vector<Spec> specs = gpt_oss_specs(config);
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  MSI_RETURN_IF_ERROR(write_generated_weights(
      o.out_dir, specs.size(), o.shards, [&](size_t i, std::vector<GeneratedTensor>& outs) {
        const Spec& sp = specs[i];
        const int64_t n = numel(sp.shape);
        const std::vector<float> v = draw_values(n, sp.std, rng, normal);
        if (!sp.mxfp4) {
          outs.push_back(encode_tensor(sp.name, sp.shape, v, o.dtype));
          return;
        }
        const int64_t E = sp.shape[0], rows = sp.shape[1], g = sp.shape[2] / 32;
        GeneratedTensor blocks{sp.name + "_blocks",
                               DType::kU8,
                               {E, rows, g, 16},
                               std::vector<uint8_t>(static_cast<size_t>(n / 2))};
        GeneratedTensor scales{sp.name + "_scales",
                               DType::kU8,
                               {E, rows, g},
                               std::vector<uint8_t>(static_cast<size_t>(n / 32))};
        for (int64_t b = 0; b < n / 32; ++b) {
          scales.data[b] = mxfp4_quantize_block(v.data() + b * 32, blocks.data.data() + b * 16);
        }
        outs.push_back(std::move(blocks));
        outs.push_back(std::move(scales));
      }));
  return write_model_files(o.out_dir, config, tok_json, tok_config,
                           Json{{"eos_token_id", gen_eos}});
}

}  // namespace msinfer::model::internal
