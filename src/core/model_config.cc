#include "msinfer/core/model_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <tuple>

namespace msinfer {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* kSupported =
    "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DbrxForCausalLM, "
    "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM, Glm4MoeForCausalLM";

ModelConfig gqa_model(std::string name, int layers, int64_t h, int64_t ffn, int e, int k, int heads,
                    int kv_heads, int64_t vocab) {
  ModelConfig m;
  m.name = std::move(name);
  m.architecture = "builtin";
  m.layers = m.moe_layers = layers;
  m.hidden = h;
  m.expert_ffn = ffn;
  m.experts = e;
  m.top_k = k;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = h / heads;
  m.vocab = vocab;
  return m;
}

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

StatusOr<int> get_int(const JsonFields& f, const std::string& key, int64_t min_value = 1) {
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
    std::string type;
    if (rs.has("type")) {
      MSI_ASSIGN_OR_RETURN(type, rs.string("type"));
    } else {
      MSI_ASSIGN_OR_RETURN(type, rs.string_or("rope_type", ""));
    }
    if (type != "yarn") {
      return rs.field_error("type", "'" + type + "' is not supported (DeepSeek models: yarn)");
    }
    MSI_ASSIGN_OR_RETURN(m.yarn_factor, rs.positive("factor"));
    if (m.yarn_factor > 1e6) return rs.field_error("factor", "must be <= 1e6");
    MSI_ASSIGN_OR_RETURN(m.yarn_original_max_position,
                         rs.integer_at_least("original_max_position_embeddings", 1));
    MSI_ASSIGN_OR_RETURN(m.yarn_beta_fast, rs.number_or("beta_fast", 32));
    MSI_ASSIGN_OR_RETURN(m.yarn_beta_slow, rs.number_or("beta_slow", 1));
    MSI_ASSIGN_OR_RETURN(m.yarn_mscale, rs.number_or("mscale", 1));
    MSI_ASSIGN_OR_RETURN(m.yarn_mscale_all_dim, rs.number_or("mscale_all_dim", 0));
    if (!(m.yarn_beta_fast > 0 && m.yarn_beta_slow > 0 && m.yarn_beta_fast >= m.yarn_beta_slow &&
          m.yarn_beta_fast < 1e6)) {
      return rs.field_error("beta_fast", "and beta_slow must satisfy 0 < beta_slow <= beta_fast");
    }
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
    std::string type;
    if (rs.has("rope_type")) {
      MSI_ASSIGN_OR_RETURN(type, rs.string("rope_type"));
    } else {
      MSI_ASSIGN_OR_RETURN(type, rs.string_or("type", ""));
    }
    if (type != "yarn") {
      return rs.field_error("rope_type", "'" + type + "' is not supported (gpt-oss: yarn)");
    }
    MSI_ASSIGN_OR_RETURN(m.yarn_factor, rs.positive("factor"));
    if (m.yarn_factor > 1e6) return rs.field_error("factor", "must be <= 1e6");
    MSI_ASSIGN_OR_RETURN(m.yarn_original_max_position,
                         rs.integer_at_least("original_max_position_embeddings", 1));
    MSI_ASSIGN_OR_RETURN(m.yarn_beta_fast, rs.number_or("beta_fast", 32));
    MSI_ASSIGN_OR_RETURN(m.yarn_beta_slow, rs.number_or("beta_slow", 1));
    MSI_ASSIGN_OR_RETURN(m.yarn_truncate, rs.boolean_or("truncate", true));
    if (!(m.yarn_beta_fast > 0 && m.yarn_beta_slow > 0 && m.yarn_beta_fast >= m.yarn_beta_slow &&
          m.yarn_beta_fast < 1e6)) {
      return rs.field_error("beta_fast", "and beta_slow must satisfy 0 < beta_slow <= beta_fast");
    }
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

}  // namespace

int64_t ModelConfig::attention_window(int i) const {
  return i >= 0 && i < static_cast<int>(sliding_layers.size()) && sliding_layers[i] ? sliding_window
                                                                                    : 0;
}

bool ModelConfig::is_moe_layer(int i) const {
  return i >= first_k_dense_replace && i % std::max(moe_layer_freq, 1) == 0;
}

namespace {
double yarn_get_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}
}  // namespace

double ModelConfig::yarn_attention_mscale() const {
  if (yarn_factor == 0 || yarn_mscale_all_dim == 0) return 1.0;
  return yarn_get_mscale(yarn_factor, yarn_mscale_all_dim);
}

double ModelConfig::yarn_rope_mscale() const {
  if (yarn_factor == 0) return 1.0;
  return yarn_get_mscale(yarn_factor, yarn_mscale) /
         yarn_get_mscale(yarn_factor, yarn_mscale_all_dim);
}

int64_t ModelConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

double ModelConfig::gqa_group() const {
  return kv_heads > 0 ? static_cast<double>(heads) / kv_heads : 1.0;
}

double ModelConfig::attention_params_per_layer() const {
  double h = static_cast<double>(hidden);
  if (kv_lora_rank > 0) {
    double qk = static_cast<double>(qk_nope_head_dim + qk_rope_head_dim);
    double q = q_lora_rank > 0 ? h * q_lora_rank + static_cast<double>(q_lora_rank) * heads * qk
                               : h * heads * qk;
    double kv_a = h * static_cast<double>(kv_lora_rank + qk_rope_head_dim);
    double kv_b = static_cast<double>(kv_lora_rank) * heads * (qk_nope_head_dim + v_head_dim);
    double o = static_cast<double>(heads) * v_head_dim * h;
    return q + kv_a + kv_b + o;
  }
  double hd = static_cast<double>(head_dim);
  return h * heads * hd + 2.0 * h * kv_heads * hd + heads * hd * h;
}

double ModelConfig::attention_side_params() const {
  double h = static_cast<double>(hidden);
  double per_layer = attention_params_per_layer() + 2.0 * h;  // + two RMSNorm weights
  double p = layers * per_layer;
  p += moe_layers * (h * experts + 3.0 * h * shared_expert_ffn);
  p += (layers - moe_layers) * 3.0 * h * dense_ffn;
  p += vocab * h * (tied_embeddings ? 1.0 : 2.0) + h;
  return p;
}

double ModelConfig::expert_params() const { return moe_layers * 3.0 * hidden * expert_ffn; }

double ModelConfig::total_params() const {
  return attention_side_params() + experts * expert_params();
}

double ModelConfig::kv_bytes_per_token_per_layer() const {
  if (kv_lora_rank > 0) return 2.0 * static_cast<double>(kv_lora_rank + qk_rope_head_dim);
  return 2.0 /*K,V*/ * 2.0 /*bf16*/ * kv_heads * head_dim;
}

Status ModelConfig::check_attention_tp(int tp) const {
  if (tp >= 1 && heads % tp == 0 &&
      (kv_lora_rank > 0 ||  // MLA: one latent per token, every rank holds it
       (kv_heads >= 1 && (kv_heads % tp == 0 || tp % kv_heads == 0)))) {
    return ok_status();
  }
  return invalid_argument("tp_attention " + std::to_string(tp) + " must divide the query heads (" +
                          std::to_string(heads) +
                          ") and divide or be a multiple of the KV heads (" +
                          std::to_string(kv_heads) + ")");
}

int ModelConfig::kv_heads_per_attention_rank(int tp) const {
  return std::max(1, (kv_heads + tp - 1) / std::max(tp, 1));
}

int ModelConfig::first_kv_head_of_attention_rank(int r, int tp) const {
  return static_cast<int>(static_cast<int64_t>(r) * (heads / tp) / (heads / kv_heads));
}

double ModelConfig::kv_bytes_per_token_per_layer_per_attention_rank(int tp) const {
  if (kv_lora_rank > 0) return kv_bytes_per_token_per_layer();
  return kv_bytes_per_token_per_layer() * kv_heads_per_attention_rank(tp) / kv_heads;
}

double ModelConfig::attention_side_flops_per_token_per_moe_layer() const {
  double h = static_cast<double>(hidden);
  // All dense work of the attention side over the whole model, per token,
  // spread evenly over the MoE layers (dense layers and the LM head included).
  double params = layers * attention_params_per_layer() +
                  moe_layers * (h * experts + 3.0 * h * shared_expert_ffn) +
                  (layers - moe_layers) * 3.0 * h * dense_ffn + vocab * h;
  return 2.0 * params / moe_layers;
}

double ModelConfig::attention_score_flops(double seq_len) const {
  if (kv_lora_rank > 0) {
    // Absorbed MLA decode: scores and values over the compressed latent per head.
    return 2.0 * heads * (2.0 * kv_lora_rank + qk_rope_head_dim) * seq_len;
  }
  return 4.0 * heads * static_cast<double>(head_dim) * seq_len;
}

double ModelConfig::attended_tokens(double context) const {
  if (sliding_layers.empty() || layers <= 0) return context;
  double sum = 0;
  for (int i = 0; i < layers; ++i) {
    const int64_t w = attention_window(i);
    sum += w > 0 ? std::min(context, static_cast<double>(w)) : context;
  }
  return sum / layers;
}

Json ModelConfig::to_json() const {
  Json j{{"name", name},
         {"architecture", architecture},
         {"layers", layers},
         {"moe_layers", moe_layers},
         {"hidden", hidden},
         {"expert_ffn", expert_ffn},
         {"experts", experts},
         {"top_k", top_k},
         {"heads", heads},
         {"kv_heads", kv_heads},
         {"head_dim", head_dim},
         {"vocab", vocab},
         {"dense_ffn", dense_ffn},
         {"shared_expert_ffn", shared_expert_ffn},
         {"params_total", total_params()},
         {"params_attention_side", attention_side_params()},
         {"params_per_expert", expert_params()}};
  j["tied_embeddings"] = tied_embeddings;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_norm_eps;
  j["norm_topk_prob"] = norm_topk_prob;
  j["qk_norm"] = qk_norm;
  if (attention_bias) j["attention_bias"] = true;
  if (partial_rotary_factor != 1.0) j["partial_rotary_factor"] = partial_rotary_factor;
  if (!sliding_layers.empty()) {
    // config.json's names: a plan keeps the windows its KV figures assumed.
    j["sliding_window"] = sliding_window;
    Json types = Json::array();
    for (bool sliding : sliding_layers)
      types.push_back(sliding ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (kv_lora_rank > 0 || architecture == "Glm4MoeForCausalLM") {
    if (kv_lora_rank > 0) {
      j["q_lora_rank"] = q_lora_rank;
      j["kv_lora_rank"] = kv_lora_rank;
      j["qk_nope_head_dim"] = qk_nope_head_dim;
      j["qk_rope_head_dim"] = qk_rope_head_dim;
      j["v_head_dim"] = v_head_dim;
    }
    j["shared_experts"] = shared_experts;
    j["first_k_dense_replace"] = first_k_dense_replace;
    j["moe_layer_freq"] = moe_layer_freq;
    j["nextn_predict_layers"] = nextn_predict_layers;
    j["scoring_func"] = scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
    j["topk_method"] = topk_method == TopkMethod::kNoauxTc              ? "noaux_tc"
                       : topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                        : "greedy";
    j["n_group"] = n_group;
    j["topk_group"] = topk_group;
    j["routed_scaling_factor"] = routed_scaling_factor;
    if (yarn_factor > 0) {
      j["rope_scaling"] = Json{{"type", "yarn"},
                               {"factor", yarn_factor},
                               {"original_max_position_embeddings", yarn_original_max_position},
                               {"beta_fast", yarn_beta_fast},
                               {"beta_slow", yarn_beta_slow},
                               {"mscale", yarn_mscale},
                               {"mscale_all_dim", yarn_mscale_all_dim}};
    }
    if (fp8_weights) {
      j["quantization_config"] = Json{{"quant_method", "fp8"},
                                      {"fmt", "e4m3"},
                                      {"weight_block_size", {fp8_block_rows, fp8_block_cols}}};
    }
  }
  return j;
}

Status ModelConfig::check_executable() const {
  auto no = [&](const std::string& why) {
    return unimplemented("model '" + name + "' (" + architecture + "): " + why +
                         "; the engine runs MixtralForCausalLM, Qwen3MoeForCausalLM, "
                         "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM and "
                         "Glm4MoeForCausalLM");
  };
  if (architecture == "Glm4MoeForCausalLM") {
    if (kv_lora_rank != 0) return no("latent attention in a GLM model");
    if (yarn_factor != 0) return no("rope_scaling");
    return validate();
  }
  if (architecture == "DeepseekV2ForCausalLM" || architecture == "DeepseekV3ForCausalLM") {
    if (kv_lora_rank == 0) return no("DeepSeek without latent attention (kv_lora_rank 0)");
    return validate();
  }
  if (architecture != "MixtralForCausalLM" && architecture != "Qwen3MoeForCausalLM" &&
      architecture != "GptOssForCausalLM") {
    return no("architecture not supported by the engine");
  }
  if (moe_layers != layers) return no("dense (mlp-only) layers are not supported yet");
  if (shared_expert_ffn != 0) return no("shared experts are not supported yet");
  if (kv_lora_rank != 0) return no("latent attention is not supported yet");
  return validate();
}

Status ModelConfig::validate() const {
  auto bad = [&](const std::string& what) {
    return invalid_argument("model '" + name + "': " + what);
  };
  if (layers < 1) return bad("layers must be >= 1");
  if (moe_layers < 1 || moe_layers > layers) return bad("needs 1..layers MoE layers");
  if (hidden < 1 || expert_ffn < 1) return bad("hidden and expert FFN sizes must be >= 1");
  if (experts < 1) return bad("experts must be >= 1");
  if (top_k < 1 || top_k > experts) return bad("top-K must be in 1..experts");
  if (heads < 1) return bad("heads must be >= 1");
  if (kv_lora_rank == 0) {
    if (kv_heads < 1 || heads % kv_heads != 0) {
      return bad("KV heads must divide attention heads (" + std::to_string(heads) + " / " +
                 std::to_string(kv_heads) + ")");
    }
    if (head_dim < 1) return bad("head_dim must be >= 1");
  }
  if (vocab < 1) return bad("vocab must be >= 1");
  // Upper bounds far above any published model, so that sizes and FLOP counts
  // derived from them stay finite and in range (a plan with hidden 1e12 used to
  // be accepted). docs/PLANNER.md lists them.
  for (auto [what, v, hi] : {std::tuple{"layers", int64_t{layers}, int64_t{4096}},
                             {"hidden", hidden, int64_t{1} << 18},
                             {"expert FFN", expert_ffn, int64_t{1} << 20},
                             {"experts", int64_t{experts}, int64_t{1} << 16},
                             {"heads", int64_t{heads}, int64_t{1} << 14},
                             {"head_dim", head_dim, int64_t{1} << 14},
                             {"vocab", vocab, int64_t{1} << 24},
                             {"dense FFN", dense_ffn, int64_t{1} << 20},
                             {"shared expert FFN", shared_expert_ffn, int64_t{1} << 20},
                             {"q_lora_rank", q_lora_rank, int64_t{1} << 16},
                             {"kv_lora_rank", kv_lora_rank, int64_t{1} << 16},
                             {"qk_nope_head_dim", qk_nope_head_dim, int64_t{1} << 14},
                             {"qk_rope_head_dim", qk_rope_head_dim, int64_t{1} << 14},
                             {"v_head_dim", v_head_dim, int64_t{1} << 14}}) {
    if (v < 0 || v > hi) {
      return bad(std::string(what) + " must be in 0.." + std::to_string(hi) + ", got " +
                 std::to_string(v));
    }
  }
  if (n_group < 1 || n_group > experts || experts % n_group != 0) {
    return bad("n_group " + std::to_string(n_group) + " must divide the experts (" +
               std::to_string(experts) + ")");
  }
  if (topk_group < 1 || topk_group > n_group) {
    return bad("topk_group " + std::to_string(topk_group) + " must be in 1..n_group (" +
               std::to_string(n_group) + ")");
  }
  if (!(routed_scaling_factor > 0 && routed_scaling_factor < 1e6)) {
    return bad("routed_scaling_factor must be in (0, 1e6)");
  }
  if (!(yarn_factor >= 0 && yarn_factor <= 1e6)) return bad("YaRN factor must be in [0, 1e6]");
  if (fp8_weights && (fp8_block_rows < 1 || fp8_block_cols < 1)) {
    return bad("FP8 weight blocks must be >= 1 x 1");
  }
  if (sliding_window < 0 || sliding_window > max_position_embeddings) {
    return bad("sliding_window " + std::to_string(sliding_window) + " must be in 0..the context (" +
               std::to_string(max_position_embeddings) + ")");
  }
  if (!sliding_layers.empty() && static_cast<int>(sliding_layers.size()) != layers) {
    return bad("layer_types must name every layer");
  }
  if (!(rope_theta > 0 && rope_theta < 1e12)) return bad("rope_theta must be in (0, 1e12)");
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1)) {
    return bad("partial_rotary_factor must be in (0, 1]");
  }
  if (kv_lora_rank == 0 && partial_rotary_factor != 1.0 &&
      (rotary_dim() < 2 || rotary_dim() % 2 != 0)) {
    return bad("partial_rotary_factor " + std::to_string(partial_rotary_factor) + " of head_dim " +
               std::to_string(head_dim) + " gives a rotary dim of " + std::to_string(rotary_dim()) +
               "; RoPE needs an even number >= 2");
  }
  if (!(rms_norm_eps > 0 && rms_norm_eps < 1)) return bad("rms_norm_eps must be in (0, 1)");
  return ok_status();
}

std::vector<std::string> builtin_model_names() {
  return {"mixtral-8x22b", "dbrx", "scaled-moe"};
}

StatusOr<ModelConfig> builtin_model(const std::string& name) {
  std::string n = lower(name);
  if (n == "mixtral-8x22b" || n == "mixtral") {
    return gqa_model("mixtral-8x22b", 56, 6144, 16384, 8, 2, 48, 8, 32768);
  }
  if (n == "dbrx") return gqa_model("dbrx", 40, 6144, 10752, 16, 4, 48, 8, 100352);
  if (n == "scaled-moe" || n == "scaled-moe-317b") {
    return gqa_model("scaled-moe", 48, 8192, 8192, 32, 4, 64, 8, 32000);
  }
  std::string known;
  for (const auto& k : builtin_model_names()) known += (known.empty() ? "" : ", ") + k;
  return not_found("model '" + name + "' is neither a built-in model (" + known +
                   ") nor an existing config.json or model directory");
}

StatusOr<ModelConfig> parse_hf_config(const Json& config, const std::string& source) {
  JsonFields f(config, source);
  MSI_RETURN_IF_ERROR(f.expect_object());
  std::string arch;
  if (f.has("architectures") && config.at("architectures").is_array() &&
      !config.at("architectures").empty() && config.at("architectures")[0].is_string()) {
    arch = config.at("architectures")[0].get<std::string>();
  } else {
    MSI_ASSIGN_OR_RETURN(std::string model_type, f.string_or("model_type", ""));
    if (model_type == "mixtral") arch = "MixtralForCausalLM";
    else if (model_type == "qwen2_moe") arch = "Qwen2MoeForCausalLM";
    else if (model_type == "qwen3_moe") arch = "Qwen3MoeForCausalLM";
    else if (model_type == "dbrx") arch = "DbrxForCausalLM";
    else if (model_type == "deepseek_v2") arch = "DeepseekV2ForCausalLM";
    else if (model_type == "deepseek_v3") arch = "DeepseekV3ForCausalLM";
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

StatusOr<ModelConfig> load_model_config(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(name_or_path);
  if (fs::is_directory(p, ec)) p /= "config.json";
  if (fs::is_regular_file(p, ec)) {
    MSI_ASSIGN_OR_RETURN(Json j, read_json_file(p.string()));
    return parse_hf_config(j, p.string());
  }
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json")) {
    return not_found("--model " + name_or_path + ": no such file or directory");
  }
  return builtin_model(name_or_path);
}

}  // namespace msinfer

namespace msinfer {

StatusOr<ModelConfig> ModelConfig::from_json(const JsonFields& f) {
  MSI_RETURN_IF_ERROR(f.expect_object());
  ModelConfig m;
  MSI_ASSIGN_OR_RETURN(m.name, f.string("name"));
  MSI_ASSIGN_OR_RETURN(m.architecture, f.string_or("architecture", "builtin"));
  MSI_ASSIGN_OR_RETURN(m.layers, get_int(f, "layers"));
  MSI_ASSIGN_OR_RETURN(m.moe_layers, get_int(f, "moe_layers"));
  MSI_ASSIGN_OR_RETURN(m.hidden, f.integer_at_least("hidden", 1));
  MSI_ASSIGN_OR_RETURN(m.expert_ffn, f.integer_at_least("expert_ffn", 1));
  MSI_ASSIGN_OR_RETURN(m.experts, get_int(f, "experts"));
  MSI_ASSIGN_OR_RETURN(m.top_k, get_int(f, "top_k"));
  MSI_ASSIGN_OR_RETURN(m.heads, get_int(f, "heads"));
  MSI_ASSIGN_OR_RETURN(m.kv_heads, get_int(f, "kv_heads"));
  MSI_ASSIGN_OR_RETURN(m.head_dim, f.integer_at_least("head_dim", 1));
  MSI_ASSIGN_OR_RETURN(m.vocab, f.integer_at_least("vocab", 1));
  MSI_ASSIGN_OR_RETURN(m.dense_ffn, f.integer_or("dense_ffn", 0));
  MSI_ASSIGN_OR_RETURN(m.shared_expert_ffn, f.integer_or("shared_expert_ffn", 0));
  MSI_ASSIGN_OR_RETURN(m.tied_embeddings, f.boolean_or("tied_embeddings", false));
  MSI_ASSIGN_OR_RETURN(m.max_position_embeddings,
                       f.integer_or("max_position_embeddings", m.max_position_embeddings));
  MSI_ASSIGN_OR_RETURN(m.rope_theta, f.number_or("rope_theta", m.rope_theta));
  MSI_ASSIGN_OR_RETURN(m.rms_norm_eps, f.number_or("rms_norm_eps", m.rms_norm_eps));
  MSI_ASSIGN_OR_RETURN(m.norm_topk_prob, f.boolean_or("norm_topk_prob", m.norm_topk_prob));
  MSI_ASSIGN_OR_RETURN(m.qk_norm, f.boolean_or("qk_norm", false));
  MSI_ASSIGN_OR_RETURN(m.attention_bias, f.boolean_or("attention_bias", false));
  MSI_ASSIGN_OR_RETURN(m.partial_rotary_factor, f.number_or("partial_rotary_factor", 1.0));
  if (f.json().contains("layer_types")) {
    MSI_ASSIGN_OR_RETURN(m.sliding_window, f.integer_at_least("sliding_window", 1));
    const Json& types = f.json().at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != m.layers) {
      return f.field_error("layer_types", "must be an array of one entry per layer (" +
                                              std::to_string(m.layers) + ")");
    }
    for (const Json& t : types) {
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
        return f.field_error("layer_types", "entries must be sliding_attention or full_attention");
      }
      m.sliding_layers.push_back(t == "sliding_attention");
    }
  }
  MSI_ASSIGN_OR_RETURN(m.q_lora_rank, f.integer_or("q_lora_rank", 0));
  MSI_ASSIGN_OR_RETURN(m.kv_lora_rank, f.integer_or("kv_lora_rank", 0));
  MSI_ASSIGN_OR_RETURN(m.qk_nope_head_dim, f.integer_or("qk_nope_head_dim", 0));
  MSI_ASSIGN_OR_RETURN(m.qk_rope_head_dim, f.integer_or("qk_rope_head_dim", 0));
  MSI_ASSIGN_OR_RETURN(m.v_head_dim, f.integer_or("v_head_dim", 0));
  if (m.kv_lora_rank > 0 || m.architecture == "Glm4MoeForCausalLM") {
    // What to_json() writes for a DeepSeek or GLM model: the config.json field names,
    // so the same parser reads them (the shapes above are already set).
    MSI_ASSIGN_OR_RETURN(int64_t shared, f.integer_or("shared_experts", 0));
    const Json& j = f.json();
    Json ds{{"architectures", {m.architecture}}, {"num_hidden_layers", m.layers},
            {"n_routed_experts", m.experts},     {"num_experts_per_tok", m.top_k},
            {"intermediate_size", m.dense_ffn},  {"n_shared_experts", shared}};
    for (const char* k : {"first_k_dense_replace", "moe_layer_freq", "scoring_func", "topk_method",
                          "n_group", "topk_group", "routed_scaling_factor", "rope_scaling",
                          "quantization_config", "norm_topk_prob", "rope_theta", "rms_norm_eps"}) {
      if (j.contains(k)) ds[k] = j.at(k);
    }
    if (j.contains("nextn_predict_layers"))
      ds["num_nextn_predict_layers"] = j.at("nextn_predict_layers");
    ModelConfig d = m;
    MSI_RETURN_IF_ERROR(parse_deepseek(JsonFields(ds, f.where()), d));
    const int64_t moe_layers = m.moe_layers;
    m = d;
    m.moe_layers = static_cast<int>(moe_layers);
  }
  Status s = m.validate();
  if (!s.ok()) return s.with_context(f.where());
  return m;
}

}  // namespace msinfer
