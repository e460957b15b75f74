// Writes test checkpoints in the real HF layout (config.json, safetensors,
// tokenizer.json, tokenizer_config.json, generation_config.json) with seeded
// random weights, so every test and benchmark goes through the real loader.
//
// Presets: tiny-mixtral and tiny-qwen3moe (a few MB; 8 experts top-2, GQA,
// >= 2 layers, with a small BPE tokenizer trained on an embedded text: a
// Llama-style byte-fallback one and a Qwen-style byte-level one), and
// small-mixtral (hidden 1024, 8 layers, 8 experts top-2, FFN 2816, 16/4 heads,
// the real Llama-2 tokenizer from scripts/fetch-tokenizers; about 1.3 GB).
//
// Weights are scaled so activations stay in a sane range: Linear weights
// N(0, 1/fan_in), output projections further by 1/sqrt(2 layers), norms 1 + N(0, 0.1^2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/model/safetensors.h"

namespace msinfer::model {

struct MakeModelOptions {
  std::string preset;
  std::string out_dir;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
  int shards = 1;                 // > 1: model-0000i-of-0000n.safetensors + index
  // small-mixtral's tokenizer (default: default_llama2_tokenizer_dir()), or
  // small-deepseek's (default: default_tokenizer_dir("deepseek_v3")).
  std::string tokenizer_dir;
  // Called with a line after each 10% of the weights of a model over 64 M
  // parameters (may be null): the small preset takes tens of seconds.
  void (*progress)(const std::string&) = nullptr;
  // > 0: a router skew. Expert popularity (share of routed rows) follows
  // Zipf(router_skew_zipf) over a seeded ranking of the experts, the same in
  // every layer (see RouterSkew in make_model.cc for how the weights do it).
  double router_skew_zipf = 0;
  // A JSON merge patch (RFC 7396) applied to the preset's config.json before
  // the weights are drawn, for tests that need other shapes (odd head counts
  // and ranks, other group counts); DeepSeek and gpt-oss presets only. The result must
  // still be a config the loader accepts.
  Json config_overrides;
};

// The largest Zipf exponent make-model accepts for --router-skew.
constexpr double kMaxRouterSkew = 8.0;
// Parses "zipf:S" (S finite, in (0, kMaxRouterSkew]); errors name --router-skew.
StatusOr<double> parse_router_skew(const std::string& value);

// Where small-mixtral's Llama-2 tokenizer is when no directory is given:
// .cache/tokenizers/llama2 (scripts/fetch-tokenizers) in the working
// directory or the nearest directory above it that has one, else in the
// nearest above the running executable (build/msinfer in a checkout), so that
// make-model works from any directory. Absolute where found; else the
// relative default, for the error message.
std::string default_llama2_tokenizer_dir();
// The same search for .cache/tokenizers/<name> (small-deepseek: "deepseek_v3").
std::string default_tokenizer_dir(const std::string& name);

// The generated presets (the trained "demo" preset is model/demo_model.h's).
std::vector<std::string> model_presets();
// The HF config.json a preset writes (vocab filled in from its tokenizer).
StatusOr<Json> preset_config(const std::string& preset, int64_t vocab);
Status make_model(const MakeModelOptions& options);

// Trains a small BPE tokenizer on `text`: byte-level (Qwen style) or
// byte-fallback with a Metaspace pre-tokenizer (Llama/Mistral style).
Json train_tokenizer(const std::string& text, int merges, bool byte_level);

}  // namespace msinfer::model
