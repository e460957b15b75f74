// Reading a Hugging Face config.json into a ModelConfig: Mixtral,
// Qwen3-MoE, DeepSeek-V2/V3, gpt-oss and GLM-4.5, every error naming the field.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "internal/hf_config_fields.h"
#include "msinfer/core/model_config.h"

namespace msinfer {
namespace hf_config {

// The architectures config.json may name.
const char* kSupported =
    "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DbrxForCausalLM, "
    "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM, Glm4MoeForCausalLM";

// Number of layers among `layers` that carry routed experts under Qwen-MoE's
// decoder_sparse_step / mlp_only_layers rules.
StatusOr<int> qwen_moe_layers(const JsonFields& f, int layers) {
  MSI_ASSIGN_OR_RETURN(int64_t step, f.integer_or("decoder_sparse_step", 1));
  if (step < 1) return f.field_error("decoder_sparse_step", "must be >= 1");
  std::vector<int64_t> mlp_only;
  if (f.has("mlp_only_layers")) {
    const Json& a = f.json().at("mlp_only_layers");
    if (!a.is_array()) return f.field_error("mlp_only_layers", "must be a list of layer indices");
    for (const auto& v : a) {
      if (!v.is_number_integer()) {
        return f.field_error("mlp_only_layers", "must be a list of layer indices");
      }
      mlp_only.push_back(v.get<int64_t>());
    }
  }
  int n = 0;
  for (int i = 0; i < layers; ++i) {
    bool only = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    if (!only && (i + 1) % step == 0) ++n;
  }
  return n;
}

StatusOr<int> get_int(const JsonFields& f, const std::string& key, int64_t min_value) {
  MSI_ASSIGN_OR_RETURN(int64_t v, f.integer_at_least(key, min_value));
  if (v > (1LL << 30)) return f.field_error(key, "is implausibly large");
  return static_cast<int>(v);
}

Status parse_eos(const JsonFields& f, ModelConfig& m) {
  if (!f.has("eos_token_id")) return ok_status();
  const Json& v = f.json().at("eos_token_id");
  if (v.is_number_integer()) {
    m.eos_token_ids = {v.get<int64_t>()};
  } else if (v.is_array()) {
    m.eos_token_ids.clear();  // parse_glm4_moe reads the numerics twice
    for (const auto& x : v) {
      if (!x.is_number_integer()) return f.field_error("eos_token_id", "must be integers");
      m.eos_token_ids.push_back(x.get<int64_t>());
    }
  } else {
    return f.field_error("eos_token_id", "must be an integer or a list of integers");
  }
  return ok_status();
}

Status parse_numerics(const JsonFields& f, ModelConfig& m) {
  MSI_ASSIGN_OR_RETURN(m.rope_theta, f.number_or("rope_theta", m.rope_theta));
  MSI_ASSIGN_OR_RETURN(m.rms_norm_eps, f.number_or("rms_norm_eps", m.rms_norm_eps));
  MSI_ASSIGN_OR_RETURN(m.max_position_embeddings,
                       f.integer_or("max_position_embeddings", m.max_position_embeddings));
  MSI_ASSIGN_OR_RETURN(m.bos_token_id, f.integer_or("bos_token_id", -1));
  if (!(m.rope_theta > 0)) return f.field_error("rope_theta", "must be > 0");
  if (!(m.rms_norm_eps > 0)) return f.field_error("rms_norm_eps", "must be > 0");
  return parse_eos(f, m);
}

// rope_scaling of type yarn (DeepSeek's and gpt-oss's checkpoints): the type
// under `type_key` or else `other_key` (the two name it differently), the
// factor, the original context and the beta range. The model's own extras
// (DeepSeek's mscale, gpt-oss's truncate) are its caller's.
Status parse_yarn(const JsonFields& rs, const char* type_key, const char* other_key,
                  const char* model, ModelConfig& m) {
  std::string type;
  if (rs.has(type_key)) {
    MSI_ASSIGN_OR_RETURN(type, rs.string(type_key));
  } else {
    MSI_ASSIGN_OR_RETURN(type, rs.string_or(other_key, ""));
  }
  if (type != "yarn") {
    return rs.field_error(type_key, "'" + type + "' is not supported (" + model + ": yarn)");
  }
  MSI_ASSIGN_OR_RETURN(m.yarn_factor, rs.positive("factor"));
  if (m.yarn_factor > 1e6) return rs.field_error("factor", "must be <= 1e6");
  MSI_ASSIGN_OR_RETURN(m.yarn_original_max_position,
                       rs.integer_at_least("original_max_position_embeddings", 1));
  MSI_ASSIGN_OR_RETURN(m.yarn_beta_fast, rs.number_or("beta_fast", 32));
  MSI_ASSIGN_OR_RETURN(m.yarn_beta_slow, rs.number_or("beta_slow", 1));
  if (!(m.yarn_beta_fast > 0 && m.yarn_beta_slow > 0 && m.yarn_beta_fast >= m.yarn_beta_slow &&
        m.yarn_beta_fast < 1e6)) {
    return rs.field_error("beta_fast", "and beta_slow must satisfy 0 < beta_slow <= beta_fast");
  }
  return ok_status();
}

Status parse_common_gqa(const JsonFields& f, ModelConfig& m) {
  MSI_ASSIGN_OR_RETURN(m.layers, get_int(f, "num_hidden_layers"));
  MSI_ASSIGN_OR_RETURN(m.hidden, f.integer_at_least("hidden_size", 1));
  MSI_ASSIGN_OR_RETURN(m.heads, get_int(f, "num_attention_heads"));
  MSI_ASSIGN_OR_RETURN(int64_t kvh, f.integer_or("num_key_value_heads", m.heads));
  if (kvh < 0 || kvh > (1LL << 30)) return f.field_error("num_key_value_heads", "is out of range");
  m.kv_heads = static_cast<int>(kvh);
  MSI_ASSIGN_OR_RETURN(m.head_dim, f.integer_or("head_dim", m.hidden / m.heads));
  MSI_ASSIGN_OR_RETURN(m.vocab, f.integer_at_least("vocab_size", 1));
  MSI_ASSIGN_OR_RETURN(m.tied_embeddings, f.boolean_or("tie_word_embeddings", false));
  MSI_ASSIGN_OR_RETURN(m.top_k, get_int(f, "num_experts_per_tok"));
  return parse_numerics(f, m);
}

// The DeepSeek-V2/V3 fields beyond the shapes: layer pattern, routing, YaRN,
// FP8 quantisation. Every error names the field.
Status parse_deepseek(const JsonFields& f, ModelConfig& m) {
  m.rope_theta = 10000;  // DeepseekV2Config / DeepseekV3Config defaults
  m.rms_norm_eps = 1e-6;
  MSI_RETURN_IF_ERROR(parse_numerics(f, m));
  MSI_ASSIGN_OR_RETURN(int64_t shared, f.integer_or("n_shared_experts", 0));
  if (shared < 0 || shared > 1024) return f.field_error("n_shared_experts", "must be in 0..1024");
  m.shared_experts = static_cast<int>(shared);
  m.shared_expert_ffn = shared * m.expert_ffn;
  MSI_ASSIGN_OR_RETURN(int64_t first_dense, f.integer_or("first_k_dense_replace", 0));
  MSI_ASSIGN_OR_RETURN(int64_t freq, f.integer_or("moe_layer_freq", 1));
  if (freq < 1 || freq > m.layers) return f.field_error("moe_layer_freq", "must be in 1..layers");
  if (first_dense < 0 || first_dense > m.layers) {
    return f.field_error("first_k_dense_replace", "must be in 0..num_hidden_layers");
  }
  m.first_k_dense_replace = static_cast<int>(first_dense);
  m.moe_layer_freq = static_cast<int>(freq);
  m.moe_layers = 0;
  for (int i = 0; i < m.layers; ++i) {
    if (m.is_moe_layer(i)) ++m.moe_layers;
  }
  if (m.moe_layers < m.layers && m.dense_ffn < 1) {
    return f.field_error(
        "intermediate_size",
        "is needed (>= 1) for the " + std::to_string(m.layers - m.moe_layers) + " dense layers");
  }
  MSI_ASSIGN_OR_RETURN(int64_t nextn, f.integer_or("num_nextn_predict_layers", 0));
  if (nextn < 0 || nextn > 64) return f.field_error("num_nextn_predict_layers", "must be in 0..64");
  m.nextn_predict_layers = static_cast<int>(nextn);

  // GLM-4.5 routes as DeepSeek-V3 (parse_glm4_moe fixes sigmoid / noaux_tc).
  const bool v3 =
      m.architecture == "DeepseekV3ForCausalLM" || m.architecture == "Glm4MoeForCausalLM";
  // HF defaults: DeepseekV2Config norm_topk_prob false, DeepseekV3Config and Glm4MoeConfig true.
  MSI_ASSIGN_OR_RETURN(m.norm_topk_prob, f.boolean_or("norm_topk_prob", v3));
  MSI_ASSIGN_OR_RETURN(m.routed_scaling_factor, f.number_or("routed_scaling_factor", 1.0));
  if (!(m.routed_scaling_factor > 0 && m.routed_scaling_factor < 1e6)) {
    return f.field_error("routed_scaling_factor", "must be in (0, 1e6)");
  }
  MSI_ASSIGN_OR_RETURN(std::string scoring,
                       f.string_or("scoring_func", v3 ? "sigmoid" : "softmax"));
  if (scoring == "softmax") {
    m.scoring_func = ModelConfig::ScoringFunc::kSoftmax;
  } else if (scoring == "sigmoid") {
    m.scoring_func = ModelConfig::ScoringFunc::kSigmoid;
  } else {
    return f.field_error("scoring_func", "'" + scoring + "' is not one of softmax, sigmoid");
  }
  MSI_ASSIGN_OR_RETURN(std::string topk, f.string_or("topk_method", v3 ? "noaux_tc" : "greedy"));
  if (topk == "greedy") {
    m.topk_method = ModelConfig::TopkMethod::kGreedy;
  } else if (topk == "group_limited_greedy") {
    m.topk_method = ModelConfig::TopkMethod::kGroupLimitedGreedy;
  } else if (topk == "noaux_tc") {
    m.topk_method = ModelConfig::TopkMethod::kNoauxTc;
  } else {
    return f.field_error("topk_method",
                         "'" + topk + "' is not one of greedy, group_limited_greedy, noaux_tc");
  }
  MSI_ASSIGN_OR_RETURN(int64_t n_group, f.integer_or("n_group", 1));
  MSI_ASSIGN_OR_RETURN(int64_t topk_group, f.integer_or("topk_group", 1));
  if (n_group < 1 || n_group > m.experts)
    return f.field_error("n_group", "must be in 1..n_routed_experts");
  if (m.experts % n_group != 0) {
    return f.field_error("n_group", std::to_string(n_group) +
                                        " does not divide n_routed_experts (" +
                                        std::to_string(m.experts) + ")");
  }
  if (topk_group < 1 || topk_group > n_group) {
    return f.field_error("topk_group", std::to_string(topk_group) + " must be in 1..n_group (" +
                                           std::to_string(n_group) + ")");
  }
  m.n_group = static_cast<int>(n_group);
  m.topk_group = static_cast<int>(topk_group);
  if (m.topk_method != ModelConfig::TopkMethod::kGreedy) {
    const int64_t per_group = m.experts / n_group;
    if (m.top_k > topk_group * per_group) {
      return f.field_error("num_experts_per_tok",
                           std::to_string(m.top_k) + " exceeds the experts of topk_group groups (" +
                               std::to_string(topk_group * per_group) + ")");
    }
    if (m.topk_method == ModelConfig::TopkMethod::kNoauxTc && per_group < 2) {
      return f.field_error("n_group",
                           "noaux_tc scores a group by its two best experts: needs >= 2 "
                           "experts per group");
    }
  }

  if (f.has("rope_scaling")) {
    MSI_ASSIGN_OR_RETURN(JsonFields rs, f.object("rope_scaling"));
    MSI_RETURN_IF_ERROR(parse_yarn(rs, "type", "rope_type", "DeepSeek models", m));
    MSI_ASSIGN_OR_RETURN(m.yarn_mscale, rs.number_or("mscale", 1));
    MSI_ASSIGN_OR_RETURN(m.yarn_mscale_all_dim, rs.number_or("mscale_all_dim", 0));
    for (auto [key, v] :
         {std::pair{"mscale", m.yarn_mscale}, {"mscale_all_dim", m.yarn_mscale_all_dim}}) {
      if (!(v >= 0 && v < 1e3)) return rs.field_error(key, "must be in [0, 1e3)");
    }
  }

  if (f.has("quantization_config")) {
    MSI_ASSIGN_OR_RETURN(JsonFields q, f.object("quantization_config"));
    MSI_ASSIGN_OR_RETURN(std::string method, q.string("quant_method"));
    if (method != "fp8") {
      return q.field_error("quant_method", "'" + method + "' is not supported (fp8)");
    }
    MSI_ASSIGN_OR_RETURN(std::string fmt, q.string_or("fmt", "e4m3"));
    if (fmt != "e4m3") return q.field_error("fmt", "'" + fmt + "' is not supported (e4m3)");
    const Json* bs = q.has("weight_block_size") ? &q.json().at("weight_block_size") : nullptr;
    if (bs == nullptr || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
        !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() < 1 ||
        (*bs)[1].get<int64_t>() < 1 || (*bs)[0].get<int64_t>() > 65536 ||
        (*bs)[1].get<int64_t>() > 65536) {
      return q.field_error("weight_block_size",
                           "must be two block sizes [rows, cols] in 1..65536 (e.g. [128, 128])");
    }
    m.fp8_weights = true;
    m.fp8_block_rows = (*bs)[0].get<int64_t>();
    m.fp8_block_cols = (*bs)[1].get<int64_t>();
  }
  return ok_status();
}

// gpt-oss: attention biases and sinks, alternating sliding-window and full
// layers, YaRN, clamped SwiGLU experts with biases, MXFP4 expert weights.
// Defaults are HF's GptOssConfig's. Every error names the field.
Status parse_gpt_oss(const JsonFields& f, ModelConfig& m) {
  m.rope_theta = 150000;
  MSI_RETURN_IF_ERROR(parse_common_gqa(f, m));
  MSI_ASSIGN_OR_RETURN(m.experts, get_int(f, "num_local_experts"));
  MSI_ASSIGN_OR_RETURN(m.expert_ffn, f.integer_at_least("intermediate_size", 1));
  m.moe_layers = m.layers;
  m.norm_topk_prob = true;  // softmax over the top-K logits
  m.attention_sinks = true;
  MSI_ASSIGN_OR_RETURN(m.attention_bias, f.boolean_or("attention_bias", true));
  MSI_ASSIGN_OR_RETURN(m.swiglu_limit, f.number_or("swiglu_limit", 7.0));
  if (!(m.swiglu_limit > 0 && m.swiglu_limit < 1e6)) {
    return f.field_error("swiglu_limit", "must be in (0, 1e6)");
  }
  MSI_ASSIGN_OR_RETURN(m.sliding_window, f.integer_or("sliding_window", 128));
  if (m.sliding_window < 1) return f.field_error("sliding_window", "must be >= 1");
  if (m.sliding_window > m.max_position_embeddings) {
    return f.field_error("sliding_window", std::to_string(m.sliding_window) +
                                               " is larger than the context (" +
                                               "max_position_embeddings " +
                                               std::to_string(m.max_position_embeddings) + ")");
  }
  m.sliding_layers.assign(m.layers, false);
  if (f.has("layer_types")) {
    const Json& a = f.json().at("layer_types");
    if (!a.is_array() || static_cast<int64_t>(a.size()) != m.layers) {
      return f.field_error("layer_types", "must be a list of num_hidden_layers (" +
                                              std::to_string(m.layers) + ") layer types");
    }
    for (int i = 0; i < m.layers; ++i) {
      const std::string t = a[i].is_string() ? a[i].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention") {
        return f.field_error("layer_types", "entry " + std::to_string(i) +
                                                " is not sliding_attention or full_attention");
      }
      m.sliding_layers[i] = t == "sliding_attention";
    }
  } else {  // GptOssConfig: layers 0, 2, 4, ... slide
    for (int i = 0; i < m.layers; ++i) m.sliding_layers[i] = i % 2 == 0;
  }
  if (f.has("rope_scaling") && !f.json().at("rope_scaling").is_null()) {
    MSI_ASSIGN_OR_RETURN(JsonFields rs, f.object("rope_scaling"));
    MSI_RETURN_IF_ERROR(parse_yarn(rs, "rope_type", "type", "gpt-oss", m));
    MSI_ASSIGN_OR_RETURN(m.yarn_truncate, rs.boolean_or("truncate", true));
  }
  if (f.has("quantization_config") && !f.json().at("quantization_config").is_null()) {
    MSI_ASSIGN_OR_RETURN(JsonFields q, f.object("quantization_config"));
    MSI_ASSIGN_OR_RETURN(std::string method, q.string("quant_method"));
    if (method != "mxfp4") {
      return q.field_error("quant_method", "'" + method + "' is not supported (gpt-oss: mxfp4)");
    }
    m.mxfp4_experts = true;
    for (auto [key, v] :
         {std::pair{"hidden_size", m.hidden}, {"intermediate_size", m.expert_ffn}}) {
      if (v % 32 != 0) {
        return f.field_error(
            key, std::to_string(v) + " is not a multiple of 32 (MXFP4 blocks of 32 values)");
      }
    }
  }
  return ok_status();
}

// Glm4MoeForCausalLM (GLM-4.5, 4.5-Air, 4.6): GQA attention (head_dim,
// partial_rotary_factor, use_qk_norm, attention_bias) over DeepSeek-V3's MoE
// side (dense first layers, shared experts, sigmoid scores with
// e_score_correction_bias, group-limited noaux_tc, routed_scaling_factor),
// read by parse_deepseek from a copy of the config with Glm4MoeConfig's
// defaults filled in. Errors name the field in `f`'s file.
Status parse_glm4_moe(const JsonFields& f, ModelConfig& m) {
  MSI_RETURN_IF_ERROR(parse_common_gqa(f, m));
  MSI_ASSIGN_OR_RETURN(m.experts, get_int(f, "n_routed_experts"));
  MSI_ASSIGN_OR_RETURN(m.expert_ffn, f.integer_at_least("moe_intermediate_size", 1));
  MSI_ASSIGN_OR_RETURN(m.dense_ffn, f.integer_or("intermediate_size", 0));
  if (m.dense_ffn < 0) return f.field_error("intermediate_size", "must be >= 0");
  MSI_ASSIGN_OR_RETURN(m.qk_norm, f.boolean_or("use_qk_norm", false));
  MSI_ASSIGN_OR_RETURN(m.attention_bias, f.boolean_or("attention_bias", false));
  const Json& j = f.json();
  Json g = j;
  // Newer transformers write rope_theta and partial_rotary_factor into
  // rope_parameters; the published configs have them at the top level.
  if (j.contains("rope_parameters") && !j.at("rope_parameters").is_null()) {
    MSI_ASSIGN_OR_RETURN(JsonFields rp, f.object("rope_parameters"));
    MSI_ASSIGN_OR_RETURN(std::string type, rp.string_or("rope_type", "default"));
    if (type != "default") {
      return rp.field_error("rope_type", "'" + type + "' is not supported (GLM-4.5: default)");
    }
    for (const char* k : {"rope_theta", "partial_rotary_factor"}) {
      if (rp.has(k) && !g.contains(k)) g[k] = rp.json().at(k);
    }
  }
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    return f.field_error("rope_scaling",
                         "is not supported for Glm4MoeForCausalLM (the published configs: null)");
  }
  g.erase("rope_scaling");
  MSI_ASSIGN_OR_RETURN(m.partial_rotary_factor,
                       JsonFields(g, f.where()).number_or("partial_rotary_factor", 0.5));
  if (!(m.partial_rotary_factor > 0 && m.partial_rotary_factor <= 1)) {
    return f.field_error("partial_rotary_factor", "must be in (0, 1]");
  }
  const int64_t rd = m.rotary_dim();
  if (rd < 2 || rd % 2 != 0) {
    return f.field_error("partial_rotary_factor",
                         std::to_string(m.partial_rotary_factor) + " of head_dim " +
                             std::to_string(m.head_dim) + " gives a rotary dim of " +
                             std::to_string(rd) + "; RoPE needs an even number >= 2");
  }
  // Glm4MoeConfig's defaults; the routing is always sigmoid + noaux_tc.
  for (const auto& [k, v] : {std::pair<const char*, Json>{"n_shared_experts", 1},
                             {"first_k_dense_replace", 1},
                             {"rms_norm_eps", 1e-5},
                             {"rope_theta", 10000.0},
                             {"norm_topk_prob", true}}) {
    if (!g.contains(k)) g[k] = v;
  }
  g["scoring_func"] = "sigmoid";
  g["topk_method"] = "noaux_tc";
  g.erase("moe_layer_freq");
  return parse_deepseek(JsonFields(g, f.where()), m);
}

}  // namespace hf_config

using namespace hf_config;

StatusOr<ModelConfig> parse_hf_config(const Json& config, const std::string& source) {
  JsonFields f(config, source);
  MSI_RETURN_IF_ERROR(f.expect_object());
  std::string arch;
  if (f.has("architectures") && config.at("architectures").is_array() &&
      !config.at("architectures").empty() && config.at("architectures")[0].is_string()) {
    arch = config.at("architectures")[0].get<std::string>();
  } else {
    MSI_ASSIGN_OR_RETURN(std::string model_type, f.string_or("model_type", ""));
    if (model_type == "mixtral")
      arch = "MixtralForCausalLM";
    else if (model_type == "qwen2_moe")
      arch = "Qwen2MoeForCausalLM";
    else if (model_type == "qwen3_moe")
      arch = "Qwen3MoeForCausalLM";
    else if (model_type == "dbrx")
      arch = "DbrxForCausalLM";
    else if (model_type == "deepseek_v2")
      arch = "DeepseekV2ForCausalLM";
    else if (model_type == "deepseek_v3")
      arch = "DeepseekV3ForCausalLM";
    else if (model_type == "gpt_oss")
      arch = "GptOssForCausalLM";
    else if (model_type == "glm4_moe")
      arch = "Glm4MoeForCausalLM";
    else {
      return invalid_argument(source + ": no 'architectures' entry and model_type '" + model_type +
                              "' is not supported; supported: " + std::string(kSupported));
    }
  }
  ModelConfig m;
  m.architecture = arch;
  MSI_ASSIGN_OR_RETURN(m.name, f.string_or("_name_or_path", ""));
  if (m.name.empty()) {
    m.name = std::filesystem::path(source).parent_path().filename().string();
    if (m.name.empty()) m.name = arch;
  }
  if (arch == "MixtralForCausalLM") {
    MSI_RETURN_IF_ERROR(parse_common_gqa(f, m));
    MSI_ASSIGN_OR_RETURN(m.experts, get_int(f, "num_local_experts"));
    MSI_ASSIGN_OR_RETURN(m.expert_ffn, f.integer_at_least("intermediate_size", 1));
    m.moe_layers = m.layers;
  } else if (arch == "Qwen2MoeForCausalLM" || arch == "Qwen3MoeForCausalLM") {
    MSI_RETURN_IF_ERROR(parse_common_gqa(f, m));
    MSI_ASSIGN_OR_RETURN(m.experts, get_int(f, "num_experts"));
    MSI_ASSIGN_OR_RETURN(m.expert_ffn, f.integer_at_least("moe_intermediate_size", 1));
    MSI_ASSIGN_OR_RETURN(m.moe_layers, qwen_moe_layers(f, m.layers));
    MSI_ASSIGN_OR_RETURN(m.dense_ffn, f.integer_or("intermediate_size", 0));
    MSI_ASSIGN_OR_RETURN(m.norm_topk_prob, f.boolean_or("norm_topk_prob", false));
    m.qk_norm = arch == "Qwen3MoeForCausalLM";
    if (arch == "Qwen2MoeForCausalLM") {
      MSI_ASSIGN_OR_RETURN(m.shared_expert_ffn, f.integer_or("shared_expert_intermediate_size", 0));
    }
  } else if (arch == "GptOssForCausalLM") {
    MSI_RETURN_IF_ERROR(parse_gpt_oss(f, m));
  } else if (arch == "DbrxForCausalLM") {
    MSI_ASSIGN_OR_RETURN(m.layers, get_int(f, "n_layers"));
    MSI_ASSIGN_OR_RETURN(m.hidden, f.integer_at_least("d_model", 1));
    MSI_ASSIGN_OR_RETURN(m.heads, get_int(f, "n_heads"));
    MSI_ASSIGN_OR_RETURN(m.vocab, f.integer_at_least("vocab_size", 1));
    MSI_ASSIGN_OR_RETURN(m.tied_embeddings, f.boolean_or("tie_word_embeddings", false));
    MSI_ASSIGN_OR_RETURN(JsonFields attn, f.object("attn_config"));
    MSI_ASSIGN_OR_RETURN(JsonFields ffn, f.object("ffn_config"));
    MSI_ASSIGN_OR_RETURN(int64_t kvh, attn.integer_or("kv_n_heads", m.heads));
    m.kv_heads = static_cast<int>(kvh);
    m.head_dim = m.hidden / m.heads;
    MSI_ASSIGN_OR_RETURN(m.experts, get_int(ffn, "moe_num_experts"));
    MSI_ASSIGN_OR_RETURN(m.top_k, get_int(ffn, "moe_top_k"));
    MSI_ASSIGN_OR_RETURN(m.expert_ffn, ffn.integer_at_least("ffn_hidden_size", 1));
    m.moe_layers = m.layers;
  } else if (arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV3ForCausalLM") {
    MSI_ASSIGN_OR_RETURN(m.layers, get_int(f, "num_hidden_layers"));
    MSI_ASSIGN_OR_RETURN(m.hidden, f.integer_at_least("hidden_size", 1));
    MSI_ASSIGN_OR_RETURN(m.heads, get_int(f, "num_attention_heads"));
    MSI_ASSIGN_OR_RETURN(int64_t kvh, f.integer_or("num_key_value_heads", m.heads));
    m.kv_heads = static_cast<int>(kvh);
    MSI_ASSIGN_OR_RETURN(m.vocab, f.integer_at_least("vocab_size", 1));
    MSI_ASSIGN_OR_RETURN(m.tied_embeddings, f.boolean_or("tie_word_embeddings", false));
    MSI_ASSIGN_OR_RETURN(m.experts, get_int(f, "n_routed_experts"));
    MSI_ASSIGN_OR_RETURN(m.top_k, get_int(f, "num_experts_per_tok"));
    MSI_ASSIGN_OR_RETURN(m.expert_ffn, f.integer_at_least("moe_intermediate_size", 1));
    MSI_ASSIGN_OR_RETURN(m.dense_ffn, f.integer_or("intermediate_size", 0));
    MSI_RETURN_IF_ERROR(parse_deepseek(f, m));
    MSI_ASSIGN_OR_RETURN(m.q_lora_rank, f.integer_or("q_lora_rank", 0));
    MSI_ASSIGN_OR_RETURN(m.kv_lora_rank, f.integer_at_least("kv_lora_rank", 1));
    MSI_ASSIGN_OR_RETURN(m.qk_nope_head_dim, f.integer_at_least("qk_nope_head_dim", 1));
    MSI_ASSIGN_OR_RETURN(m.qk_rope_head_dim, f.integer_at_least("qk_rope_head_dim", 1));
    MSI_ASSIGN_OR_RETURN(m.v_head_dim, f.integer_at_least("v_head_dim", 1));
    m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  } else if (arch == "Glm4MoeForCausalLM") {
    MSI_RETURN_IF_ERROR(parse_glm4_moe(f, m));
  } else {
    return invalid_argument(source + ": architecture '" + arch +
                            "' is not supported; supported: " + std::string(kSupported));
  }
  Status s = m.validate();
  if (!s.ok()) return s.with_context(source);
  return m;
}

}  // namespace msinfer
