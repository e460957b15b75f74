#include "msinfer/core/model_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "internal/hf_config_fields.h"

namespace msinfer {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

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

using hf_config::get_int;
using hf_config::parse_deepseek;

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
