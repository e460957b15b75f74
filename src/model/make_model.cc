#include "msinfer/model/make_model.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "internal/generated_checkpoint.h"
#include "internal/make_model_deepseek.h"
#include "internal/make_model_gpt_oss.h"
#include "msinfer/core/bf16.h"
#include "msinfer/model/tokenizer.h"

namespace msinfer::model {
namespace {

namespace fs = std::filesystem;

// Text the tiny tokenizers learn their merges from.
const char* kCorpus =
    "Mixture-of-Experts models route every token to a few experts. In decoding, every request "
    "reads its own KV cache, so attention is bound by memory bandwidth, while the experts are "
    "GEMMs whose weights are shared by the whole batch. Disaggregation puts attention and experts "
    "on different workers: attention is replicated so that every expert sees a large batch, and "
    "micro-batches ping-pong between the two sides so that nobody idles. The quick brown fox "
    "jumps over the lazy dog. Hello world! Hello there, how are you today? def main(): return 0 "
    "for i in range(10): print(i) 1234567890 the and of to in is that it with as for on was";

}  // namespace

Json train_tokenizer(const std::string& text, int merges, bool byte_level) {
  const std::string meta = "\xe2\x96\x81";  // ▁
  auto bc = [](unsigned char c) { return byte_level_char(c); };
  // Words: split at spaces, the space attached to the following word.
  std::map<std::vector<std::string>, int> words;
  std::string word;
  auto flush = [&](bool space_before) {
    if (word.empty()) return;
    std::vector<std::string> sym;
    if (byte_level) {
      if (space_before) sym.push_back(bc(' '));
      for (unsigned char c : word) sym.push_back(bc(c));
    } else {
      sym.push_back(meta);
      for (auto& ch : utf8_characters(word)) sym.push_back(ch);
    }
    ++words[sym];
    word.clear();
  };
  bool space = false;
  for (char c : text) {
    if (c == ' ') {
      flush(space);
      space = true;
    } else {
      word += c;
    }
  }
  flush(space);

  Json vocab = Json::object();
  std::vector<std::string> order;
  auto add = [&](const std::string& t) {
    if (!vocab.contains(t)) {
      vocab[t] = static_cast<int64_t>(order.size());
      order.push_back(t);
    }
  };
  Json added = Json::array();
  if (!byte_level) {
    for (const char* s : {"<unk>", "<s>", "</s>"}) {
      added.push_back({{"id", static_cast<int64_t>(order.size())}, {"content", s},
                       {"special", true}, {"normalized", false}});
      add(s);
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      add(name);
    }
    add(meta);
    for (const auto& [w, n] : words) {
      for (const auto& s : w) add(s);
    }
  } else {
    for (int b = 0; b < 256; ++b) add(bc(static_cast<unsigned char>(b)));
  }
  Json merge_list = Json::array();
  std::map<std::vector<std::string>, int> cur = words;
  for (int m = 0; m < merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [w, n] : cur) {
      for (size_t i = 0; i + 1 < w.size(); ++i) pairs[{w[i], w[i + 1]}] += n;
    }
    if (pairs.empty()) break;
    auto best = std::max_element(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) {
      return a.second < b.second || (a.second == b.second && a.first > b.first);
    });
    if (best->second < 2) break;
    const auto [a, b] = best->first;
    merge_list.push_back(a + " " + b);
    add(a + b);
    std::map<std::vector<std::string>, int> next;
    for (const auto& [w, n] : cur) {
      std::vector<std::string> nw;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          nw.push_back(a + b);
          ++i;
        } else {
          nw.push_back(w[i]);
        }
      }
      next[nw] += n;
    }
    cur = std::move(next);
  }
  Json tok;
  tok["version"] = "1.0";
  if (byte_level) {
    const int64_t base = static_cast<int64_t>(order.size());
    int64_t i = 0;
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
      added.push_back({{"id", base + i++}, {"content", s}, {"special", true}, {"normalized", false}});
    }
    tok["normalizer"] = {{"type", "NFC"}};
    tok["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    tok["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
    tok["post_processor"] = nullptr;
    tok["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list},
                    {"byte_fallback", false}, {"ignore_merges", false}};
  } else {
    tok["normalizer"] = nullptr;
    tok["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", meta},
                            {"prepend_scheme", "first"}, {"split", false}};
    tok["decoder"] = {{"type", "Sequence"},
                      {"decoders",
                       {{{"type", "Replace"}, {"pattern", {{"String", meta}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}},
                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
    tok["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", Json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
    tok["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list},
                    {"byte_fallback", true}, {"fuse_unk", true}, {"unk_token", "<unk>"}};
  }
  tok["added_tokens"] = added;
  return tok;
}

// --router-skew zipf:S. A Mixtral / Qwen-MoE router has no bias, so the skew
// gets a channel of its own: hidden dimension 0 of every token's embedding is
// the constant c = 2 sqrt(h); nothing writes dimension 0 afterwards (row 0 of
// o_proj and of every expert's down projection is 0) and only the routers read
// it (column 0 of q/k/v, of the experts' gate/up projections and of the LM
// head is 0). After post_attention_layernorm (weight 1 at dimension 0) it is
// about x0 = sqrt(h) * 2 / sqrt(5), so column 0 of router row e, b_e / x0,
// adds b_e to expert e's logit. The rest of the logit is about N(0, 1/5) when
// the other dimensions are unit-variance; the biases b are fitted to that by
// Monte Carlo (seeded) so that each expert's share of the top-K picks is its
// Zipf share K * r^-S / sum r^-S over ranks r = 1..E (a share above 0.97 of
// the tokens is capped: a token picks an expert at most once).
class RouterSkew {
 public:
  static constexpr double kChannel = 2.0;  // c / sqrt(h)
  RouterSkew(double s, int64_t experts, int64_t top_k, int64_t hidden, uint64_t seed)
      : hidden_(hidden) {
    // Ranking: a seeded permutation (Fisher-Yates, so it does not depend on
    // the standard library's shuffle).
    std::mt19937_64 rng(seed ^ 0x5eed5ce7ULL);
    by_rank_.resize(experts);
    for (int64_t e = 0; e < experts; ++e) by_rank_[e] = static_cast<int>(e);
    for (int64_t i = experts - 1; i > 0; --i) std::swap(by_rank_[i], by_rank_[rng() % (i + 1)]);
    // Target picks per token of each rank, capped at 0.97 with the excess
    // spread over the others in proportion.
    std::vector<double> t(experts);
    double z = 0;
    for (int64_t r = 0; r < experts; ++r) z += std::pow(r + 1.0, -s);
    for (int64_t r = 0; r < experts; ++r) t[r] = top_k * std::pow(r + 1.0, -s) / z;
    for (int it = 0; it < 64; ++it) {
      double excess = 0, free_mass = 0;
      for (double& v : t) {
        if (v > 0.97) {
          excess += v - 0.97;
          v = 0.97;
        } else if (v < 0.97) {
          free_mass += v;
        }
      }
      if (excess <= 0 || free_mass <= 0) break;
      for (double& v : t) {
        if (v < 0.97) v += excess * v / free_mass;
      }
    }
    target_ = t;
    // Fit the biases: logits b_r + sigma * N(0, 1), top-K picks per rank.
    const double sigma = 1.0 / std::sqrt(kChannel * kChannel + 1.0);
    std::vector<double> b(experts, 0.0);
    std::normal_distribution<double> normal(0.0, sigma);
    const int samples = 20000;
    std::vector<double> logit(experts);
    std::vector<int> idx(experts);
    for (int iter = 0; iter < 80; ++iter) {
      std::mt19937_64 mc(seed + 17);  // the same samples every iteration
      std::vector<double> picks(experts, 0.0);
      for (int n = 0; n < samples; ++n) {
        for (int64_t r = 0; r < experts; ++r) logit[r] = b[r] + normal(mc);
        for (int64_t r = 0; r < experts; ++r) idx[r] = static_cast<int>(r);
        std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                          [&](int a, int c) { return logit[a] > logit[c]; });
        for (int64_t k = 0; k < top_k; ++k) picks[idx[k]] += 1.0 / samples;
      }
      for (int64_t r = 0; r < experts; ++r) {
        b[r] += 0.5 * sigma * (std::log(t[r]) - std::log(std::max(picks[r], 1e-4)));
      }
    }
    double mean = 0;
    for (double v : b) mean += v / static_cast<double>(experts);
    bias_.assign(experts, 0.0);
    for (int64_t r = 0; r < experts; ++r) bias_[by_rank_[r]] = b[r] - mean;
  }

  // Rewrites the generated values of tensor `name` (shape [rows, cols]).
  void apply(const std::string& name, int64_t rows, int64_t cols, std::vector<float>& v) const {
    auto ends = [&](const char* suffix) {
      const std::string x(suffix);
      return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
    };
    const float c = static_cast<float>(kChannel * std::sqrt(static_cast<double>(hidden_)));
    auto column0 = [&](float value) {
      for (int64_t r = 0; r < rows; ++r) v[r * cols] = value;
    };
    if (name == "model.embed_tokens.weight") {
      column0(c);
    } else if (ends("q_proj.weight") || ends("k_proj.weight") || ends("v_proj.weight") ||
               ends(".w1.weight") || ends(".w3.weight") || ends("gate_proj.weight") ||
               ends("up_proj.weight") || name == "lm_head.weight") {
      column0(0.f);
    } else if (ends("o_proj.weight") || ends(".w2.weight") || ends("down_proj.weight")) {
      std::fill(v.begin(), v.begin() + cols, 0.f);  // row 0
    } else if (ends("post_attention_layernorm.weight")) {
      v[0] = 1.f;
    } else if (ends("mlp.gate.weight") || ends("block_sparse_moe.gate.weight")) {
      const double x0 =
          std::sqrt(static_cast<double>(hidden_)) * kChannel / std::sqrt(kChannel * kChannel + 1.0);
      for (int64_t e = 0; e < rows; ++e) v[e * cols] = static_cast<float>(bias_[e] / x0);
    }
  }

  Json describe(double s) const {
    return Json{{"distribution", "zipf"},
                {"s", s},
                {"experts_by_popularity", by_rank_},
                {"target_picks_per_token", target_}};
  }

 private:
  int64_t hidden_;
  std::vector<int> by_rank_;  // expert of rank r (0: the most popular)
  std::vector<double> target_, bias_;
};

StatusOr<double> parse_router_skew(const std::string& value) {
  const std::string prefix = "zipf:";
  const std::string what = "--router-skew '" + value + "': expected zipf:S with S in (0, " +
                           std::to_string(static_cast<int>(kMaxRouterSkew)) + "], e.g. zipf:1.2";
  if (value.rfind(prefix, 0) != 0 || value.size() == prefix.size()) return invalid_argument(what);
  const std::string num = value.substr(prefix.size());
  char* end = nullptr;
  errno = 0;
  const double s = std::strtod(num.c_str(), &end);
  if (errno != 0 || end != num.c_str() + num.size() || !std::isfinite(s) || !(s > 0) ||
      s > kMaxRouterSkew || !std::isdigit(static_cast<unsigned char>(num[0]))) {
    return invalid_argument(what);
  }
  return s;
}

std::vector<std::string> model_presets() {
  std::vector<std::string> p = {"tiny-mixtral", "tiny-qwen3moe", "small-mixtral"};
  for (const auto& d : internal::deepseek_presets()) p.push_back(d);
  for (const auto& g : internal::gpt_oss_presets()) p.push_back(g);
  return p;
}

StatusOr<Json> preset_config(const std::string& preset, int64_t vocab) {
  if (internal::is_deepseek_preset(preset)) return internal::deepseek_preset_config(preset, vocab);
  if (internal::is_gpt_oss_preset(preset)) return internal::gpt_oss_preset_config(preset, vocab);
  if (preset == "tiny-mixtral" || preset == "small-mixtral") {
    const bool tiny = preset == "tiny-mixtral";
    return Json{{"architectures", {"MixtralForCausalLM"}},
                {"model_type", "mixtral"},
                {"hidden_size", tiny ? 64 : 1024},
                {"intermediate_size", tiny ? 128 : 2816},
                {"num_hidden_layers", tiny ? 2 : 8},
                {"num_attention_heads", tiny ? 4 : 16},
                {"num_key_value_heads", tiny ? 2 : 4},
                {"head_dim", tiny ? 16 : 64},
                {"num_local_experts", 8},
                {"num_experts_per_tok", 2},
                {"vocab_size", vocab},
                {"rope_theta", 1e6},
                {"rms_norm_eps", 1e-5},
                {"max_position_embeddings", tiny ? 4096 : 32768},
                {"tie_word_embeddings", false},
                {"bos_token_id", 1},
                {"eos_token_id", 2},
                {"torch_dtype", "bfloat16"}};
  }
  if (preset == "tiny-qwen3moe") {
    return Json{{"architectures", {"Qwen3MoeForCausalLM"}},
                {"model_type", "qwen3_moe"},
                {"hidden_size", 64},
                {"moe_intermediate_size", 96},
                {"intermediate_size", 192},
                {"num_hidden_layers", 3},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 32},
                {"num_experts", 8},
                {"num_experts_per_tok", 2},
                {"norm_topk_prob", true},
                {"decoder_sparse_step", 1},
                {"mlp_only_layers", Json::array()},
                {"vocab_size", vocab},
                {"rope_theta", 1e6},
                {"rms_norm_eps", 1e-6},
                {"max_position_embeddings", 4096},
                {"tie_word_embeddings", false},
                {"bos_token_id", Json()},
                {"eos_token_id", vocab - 3},  // <|endoftext|>
                {"torch_dtype", "bfloat16"}};
  }
  if (preset == "demo") {
    return invalid_argument(
        "--preset demo is trained, not generated: model/demo_model.h writes it");
  }
  std::string known = "demo";
  for (const auto& p : model_presets()) known += ", " + p;
  return invalid_argument("--preset '" + preset + "' is not one of " + known);
}

std::string default_llama2_tokenizer_dir() { return default_tokenizer_dir("llama2"); }

std::string default_tokenizer_dir(const std::string& name) {
  const fs::path rel = fs::path(".cache") / "tokenizers" / name;
  auto search_up = [&](fs::path dir) -> std::string {
    std::error_code ec;
    for (; !dir.empty(); dir = dir.parent_path()) {
      if (fs::exists(dir / rel / "tokenizer.json", ec)) return (dir / rel).string();
      if (dir == dir.root_path()) break;
    }
    return "";
  };
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    if (auto d = search_up(cwd); !d.empty()) return d;
  }
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    if (auto d = search_up(exe.parent_path()); !d.empty()) return d;
  }
  return rel.string();
}

namespace {

// Chat templates, as the models they imitate ship them: Llama-2-chat's
// (meta-llama/Llama-2-7b-chat-hf) for the Llama-style tokenizers, ChatML
// (Qwen) for the byte-level one, so `serve` answers chat completions.
constexpr const char* kLlama2ChatTemplate =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";

// The tokenizer.json and tokenizer_config.json of a Mixtral-family preset
// (both null for presets without a tokenizer).
Status mixtral_family_tokenizer(const MakeModelOptions& o, Json* tok_json, Json* tok_config) {
  if (o.preset == "small-mixtral") {
    std::string dir = o.tokenizer_dir.empty() ? default_llama2_tokenizer_dir() : o.tokenizer_dir;
    auto t = read_json_file(dir + "/tokenizer.json");
    if (!t.ok()) {
      return not_found("small-mixtral needs the Llama-2 tokenizer at " + dir +
                       " (run scripts/fetch-tokenizers, or pass --tokenizer DIR)");
    }
    *tok_json = *t;
    auto c = read_json_file(dir + "/tokenizer_config.json");
    *tok_config = c.ok() ? *c : Json{{"add_bos_token", true}};
    if (!tok_config->contains("chat_template"))
      (*tok_config)["chat_template"] = kLlama2ChatTemplate;
  } else if (o.preset == "tiny-mixtral") {
    *tok_json = train_tokenizer(kCorpus, 200, /*byte_level=*/false);
    *tok_config = {{"add_bos_token", true}, {"bos_token", "<s>"},
                   {"eos_token", "</s>"},   {"tokenizer_class", "LlamaTokenizer"},
                   {"legacy", true},        {"chat_template", kLlama2ChatTemplate}};
  } else if (o.preset == "tiny-qwen3moe") {
    *tok_json = train_tokenizer(kCorpus, 200, /*byte_level=*/true);
    *tok_config = internal::chatml_tokenizer_config();
  }
  return ok_status();
}

// One tensor to generate: std > 0 N(0, std^2); < 0 a norm weight 1 + N(0, 0.1^2).
struct MixtralSpec {
  std::string name;
  std::vector<int64_t> shape;
  double std;
};

// The tensors of a Mixtral (or, `qwen`, Qwen3-MoE with its q/k norms) checkpoint.
std::vector<MixtralSpec> mixtral_family_specs(const Json& config, int64_t vocab, bool qwen) {
  const int64_t h = config["hidden_size"], L = config["num_hidden_layers"];
  const int64_t H = config["num_attention_heads"], KV = config["num_key_value_heads"];
  const int64_t hd = config["head_dim"];
  const int64_t E =
      qwen ? config["num_experts"].get<int64_t>() : config["num_local_experts"].get<int64_t>();
  const int64_t F = qwen ? config["moe_intermediate_size"].get<int64_t>()
                         : config["intermediate_size"].get<int64_t>();
  std::vector<MixtralSpec> specs;
  const double out_scale = 1.0 / std::sqrt(2.0 * L);
  specs.push_back({"model.embed_tokens.weight", {vocab, h}, 1.0});
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}, -1});
    specs.push_back({p + "self_attn.q_proj.weight", {H * hd, h}, 1 / std::sqrt(double(h))});
    specs.push_back({p + "self_attn.k_proj.weight", {KV * hd, h}, 1 / std::sqrt(double(h))});
    specs.push_back({p + "self_attn.v_proj.weight", {KV * hd, h}, 1 / std::sqrt(double(h))});
    specs.push_back(
        {p + "self_attn.o_proj.weight", {h, H * hd}, out_scale / std::sqrt(double(H * hd))});
    if (qwen) {
      specs.push_back({p + "self_attn.q_norm.weight", {hd}, -1});
      specs.push_back({p + "self_attn.k_norm.weight", {hd}, -1});
    }
    specs.push_back({p + "post_attention_layernorm.weight", {h}, -1});
    const std::string moe = p + (qwen ? "mlp." : "block_sparse_moe.");
    specs.push_back({moe + "gate.weight", {E, h}, 1 / std::sqrt(double(h))});
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".";
      specs.push_back(
          {x + (qwen ? "gate_proj" : "w1") + ".weight", {F, h}, 1 / std::sqrt(double(h))});
      specs.push_back(
          {x + (qwen ? "down_proj" : "w2") + ".weight", {h, F}, out_scale / std::sqrt(double(F))});
      specs.push_back(
          {x + (qwen ? "up_proj" : "w3") + ".weight", {F, h}, 1 / std::sqrt(double(h))});
    }
  }
  specs.push_back({"model.norm.weight", {h}, -1});
  specs.push_back({"lm_head.weight", {vocab, h}, 1 / std::sqrt(double(h))});
  return specs;
}

}  // namespace

Status make_model(const MakeModelOptions& o) {
  if (o.preset == "small-deepseek") {  // DeepSeek-V3's own tokenizer and chat template
    const std::string dir =
        o.tokenizer_dir.empty() ? default_tokenizer_dir("deepseek_v3") : o.tokenizer_dir;
    auto t = read_json_file(dir + "/tokenizer.json");
    if (!t.ok()) {
      return not_found("small-deepseek needs the DeepSeek-V3 tokenizer at " + dir +
                       " (run scripts/fetch-tokenizers, or pass --tokenizer DIR)");
    }
    MSI_ASSIGN_OR_RETURN(Json c, read_json_file(dir + "/tokenizer_config.json"));
    return internal::make_deepseek_model(o, *t, c);
  }
  if (internal::is_deepseek_preset(o.preset)) {
    return internal::make_deepseek_model(o, train_tokenizer(kCorpus, 200, /*byte_level=*/true));
  }
  if (internal::is_gpt_oss_preset(o.preset)) {
    if (!o.tokenizer_dir.empty()) {  // e.g. .cache/tokenizers/gptoss: o200k, harmony's tokens
      const fs::path dir(o.tokenizer_dir);
      MSI_ASSIGN_OR_RETURN(Json tok, read_json_file((dir / "tokenizer.json").string()));
      Json cfg = Json::object();
      if (fs::exists(dir / "tokenizer_config.json")) {
        MSI_ASSIGN_OR_RETURN(cfg, read_json_file((dir / "tokenizer_config.json").string()));
      }
      return internal::make_gpt_oss_model(o, tok, cfg);
    }
    return internal::make_gpt_oss_model(o, train_tokenizer(kCorpus, 200, /*byte_level=*/true));
  }
  if (!o.config_overrides.is_null()) {
    return invalid_argument(
        "config overrides are supported for the DeepSeek and gpt-oss presets only");
  }
  // Tokenizer first: the vocabulary size comes from it.
  Json tok_json, tok_config;
  MSI_RETURN_IF_ERROR(mixtral_family_tokenizer(o, &tok_json, &tok_config));
  int64_t vocab = 0;
  if (!tok_json.is_null()) {
    auto t = Tokenizer::from_json(tok_json, &tok_config, "tokenizer.json");
    if (!t.ok()) return t.status();
    vocab = t->vocab_size();
  }
  MSI_ASSIGN_OR_RETURN(Json config, preset_config(o.preset, vocab));
  if (o.shards < 1 || o.shards > 64) return invalid_argument("--shards must be in 1..64");
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return not_found("--out " + o.out_dir + ": cannot create (" + ec.message() + ")");

  const bool qwen = o.preset == "tiny-qwen3moe";
  const std::vector<MixtralSpec> specs = mixtral_family_specs(config, vocab, qwen);
  const int64_t E =
      qwen ? config["num_experts"].get<int64_t>() : config["num_local_experts"].get<int64_t>();
  std::unique_ptr<RouterSkew> skew;
  if (o.router_skew_zipf != 0) {
    if (!(o.router_skew_zipf > 0) || o.router_skew_zipf > kMaxRouterSkew) {
      return invalid_argument("--router-skew: S must be in (0, 8]");
    }
    skew = std::make_unique<RouterSkew>(o.router_skew_zipf, E,
                                        config["num_experts_per_tok"].get<int64_t>(),
                                        config["hidden_size"].get<int64_t>(), o.seed);
    config["msinfer_router_skew"] = skew->describe(o.router_skew_zipf);
  }
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  int64_t total_elems = 0, done_elems = 0;
  int reported_tenth = 0;
  for (const MixtralSpec& sp : specs) total_elems += internal::numel(sp.shape);
  MSI_RETURN_IF_ERROR(internal::write_generated_weights(
      o.out_dir, specs.size(), o.shards,
      [&](size_t i, std::vector<internal::GeneratedTensor>& outs) {
        const MixtralSpec& sp = specs[i];
        const int64_t n = internal::numel(sp.shape);
        std::vector<float> vals = internal::draw_values(n, sp.std, rng, normal);
        if (skew) skew->apply(sp.name, sp.shape[0], sp.shape.size() > 1 ? sp.shape[1] : 1, vals);
        outs.push_back(internal::encode_tensor(sp.name, sp.shape, vals, o.dtype));
        done_elems += n;
        if (o.progress != nullptr && total_elems > (int64_t{64} << 20) &&
            done_elems * 10 / total_elems > reported_tenth) {
          reported_tenth = static_cast<int>(done_elems * 10 / total_elems);
          o.progress(std::to_string(reported_tenth * 10) + "% of the weights generated");
        }
      }));
  Json gen{{"eos_token_id", config["eos_token_id"]}};
  if (!config["bos_token_id"].is_null()) gen["bos_token_id"] = config["bos_token_id"];
  return internal::write_model_files(o.out_dir, config, tok_json, tok_config, gen);
}

}  // namespace msinfer::model
