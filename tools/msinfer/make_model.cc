// msinfer make-model: write a test checkpoint in the real HF layout, or the
// trained demo model embedded in the binary.
#include "msinfer/model/make_model.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "msinfer/core/flags.h"
#include "msinfer/model/demo_model.h"
#include "planner_flags.h"

namespace msinfer::cli {

int run_make_model(int argc, char** argv) {
  FlagSet flags(
      "make-model",
      "Writes a model directory (config.json, *.safetensors, tokenizer.json,\n"
      "tokenizer_config.json) in the layout of the HF Mixtral / Qwen3-MoE / DeepSeek\n"
      "checkpoints. presets: demo (a small Mixtral trained on the King James Bible:\n"
      "it writes English; 5.4 MB, built into this binary), and, with seeded random\n"
      "weights for tests and benchmarks, tiny-mixtral, tiny-qwen3moe (a few MB),\n"
      "small-mixtral (~1.3 GB), tiny-deepseek-v3 (MLA, FP8 block-scaled weights,\n"
      "grouped sigmoid routing, an MTP layer), tiny-deepseek-v2-lite, tiny-glm4-moe\n"
      "(GLM-4.5: GQA with partial rotary and q/k/v biases, DeepSeek-V3's MoE side),\n"
      "tiny-gpt-oss and small-gpt-oss (gpt-oss: sinks, sliding-window layers, biases,\n"
      "MXFP4 experts).");
  flags.add_string("preset", "",
                   "demo | tiny-mixtral | tiny-qwen3moe | small-mixtral | tiny-deepseek-v3 |\n"
                   "tiny-deepseek-v2-lite | tiny-glm4-moe | small-deepseek | tiny-gpt-oss |\n"
                   "small-gpt-oss");
  flags.add_string("out", "", "output directory (created if missing)");
  flags.add_int("seed", 0, 0, INT64_MAX, "seed of the random weights");
  flags.add_string("dtype", "bf16", "weight dtype: bf16 | f16 | f32");
  flags.add_int("shards", 1, 1, 64,
                "number of safetensors files (> 1 adds model.safetensors.index.json)");
  flags.add_string(
      "tokenizer", "",
      "small-mixtral: directory of the Llama-2 tokenizer "
      "(default .cache/tokenizers/llama2 in the working\n"
      "directory or one above it, or above this executable); small-deepseek: of\n"
      "the DeepSeek-V3 tokenizer (default .cache/tokenizers/deepseek_v3, found alike);\n"
      "gpt-oss presets: a tokenizer to use instead of the small trained one\n"
      "(.cache/tokenizers/gptoss: o200k, whose harmony tokens make serve answer chats\n"
      "in harmony)");
  flags.add_string("router-skew", "",
                   "zipf:S: the routers prefer some experts, popularity ~ Zipf(S) over a seeded\n"
                   "ranking, the same in every layer (S in (0, 8]; docs/ENGINE.md)");
  flags.add_bool("json", "print one JSON object (preset, directory, files) instead of a line");
  flags.set_epilog(
      "examples:\n  msinfer make-model --preset demo --out /tmp/demo\n"
      "  msinfer make-model --preset tiny-mixtral --out /tmp/m\n"
      "  msinfer make-model --preset small-mixtral --router-skew zipf:1.2 --out /tmp/skewed");
  if (auto done = parse_command_line(flags, "make-model", argc, argv, 2)) return *done;
  Status s;
  model::MakeModelOptions o;
  o.preset = flags.get_string("preset");
  o.out_dir = flags.get_string("out");
  o.seed = static_cast<uint64_t>(flags.get_int("seed"));
  o.shards = static_cast<int>(flags.get_int("shards"));
  o.tokenizer_dir = flags.get_string("tokenizer");
  o.progress = [](const std::string& line) { std::fprintf(stderr, "  %s\n", line.c_str()); };
  if (o.preset.empty()) return report_error("make-model", invalid_argument("--preset is required"));
  if (o.out_dir.empty()) return report_error("make-model", invalid_argument("--out is required"));
  if (o.preset == model::kDemoPreset) {
    // Trained weights, written as committed: nothing to seed, convert or shard.
    for (const char* f : {"seed", "dtype", "shards", "tokenizer", "router-skew"}) {
      if (flags.was_set(f)) {
        return report_error("make-model",
                            invalid_argument(std::string("--") + f +
                                             " does not apply to --preset demo "
                                             "(trained weights, written as committed)"));
      }
    }
    s = model::write_demo_model(o.out_dir);
    if (!s.ok()) return report_error("make-model", s);
  }
  if (flags.was_set("router-skew")) {
    auto skew = model::parse_router_skew(flags.get_string("router-skew"));
    if (!skew.ok()) return report_error("make-model", skew.status());
    o.router_skew_zipf = *skew;
  }
  const std::string& dt = flags.get_string("dtype");
  if (dt == "bf16") o.dtype = model::DType::kBF16;
  else if (dt == "f16") o.dtype = model::DType::kF16;
  else if (dt == "f32") o.dtype = model::DType::kF32;
  else return report_error("make-model", invalid_argument("--dtype must be bf16, f16 or f32"));
  if (o.preset != model::kDemoPreset) {
    s = model::make_model(o);
    if (!s.ok()) return report_error("make-model", s);
  }
  if (flags.get_bool("json")) {
    Json files = Json::array();
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(o.out_dir, ec)) {
      files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    std::cout << Json{{"preset", o.preset}, {"out", o.out_dir}, {"files", files}}.dump(2) << "\n";
    return 0;
  }
  std::printf("wrote %s model to %s\n", o.preset.c_str(), o.out_dir.c_str());
  return 0;
}

}  // namespace msinfer::cli
