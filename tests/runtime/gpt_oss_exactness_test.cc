// The co-located CPU engine on gpt-oss checkpoints against OpenAI's own
// reference (tests/runtime/gpt_oss_reference.py --dtype engine: its
// gpt_oss/torch/model.py in float32 with the engine's bf16 roundings of GEMM
// inputs and of the KV cache; the MXFP4 experts decoded by its weights.py).
// Prefill plus 16 greedy decode steps, every step's logits within the
// exactness bars of exactness_test.cc (why those: there), the greedy tokens
// identical; whole prompt, prompt in chunks of 5, and batched with two other
// requests over 3 micro-batches. The 12-token prompt and 16 steps run past
// the sliding windows (16 tokens on the preset, 5 on the odd shapes). Skips
// (the harness's exit 77) without torch or without the reference.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "msinfer/core/json.h"
#include "msinfer/runtime/engine.h"
#include "test_models.h"

namespace msinfer::runtime {
namespace {

namespace fs = std::filesystem;
constexpr int kDecodeSteps = 16;

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::string skip;  // the harness's reason when it exited 77
};

GreedyRun reference(const std::string& dir, const std::vector<int32_t>& prompt, int steps) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string out = (fs::path(::testing::TempDir()) / "gpt_oss_ref.json").string();
  const std::string err = (fs::path(::testing::TempDir()) / "gpt_oss_ref.err").string();
  const std::string rc = msinfer::testing::run_capture(
      "cd " + std::string(MSINFER_SOURCE_DIR) + " && /usr/bin/python3 " +
      "tests/runtime/gpt_oss_reference.py '" + dir + "' " + ids + " " + std::to_string(steps) +
      " --dtype engine > " + out + " 2> " + err + "; echo $?");
  std::ifstream e(err);
  const std::string err_text((std::istreambuf_iterator<char>(e)), {});
  GreedyRun r;
  if (rc == "77\n") {
    r.skip = err_text;
    return r;
  }
  EXPECT_EQ(rc, "0\n") << err_text;
  auto j = read_json_file(out);
  EXPECT_TRUE(j.ok()) << err_text;
  if (!j.ok()) return r;
  r.tokens = (*j)["tokens"].get<std::vector<int32_t>>();
  r.logits = (*j)["logits"].get<std::vector<std::vector<float>>>();
  return r;
}

void expect_matches_reference(const std::string& dir, const std::string& label) {
  const std::vector<int32_t> prompt = {5, 17, 42, 99, 3, 250, 7, 64, 11, 128, 33, 2};
  const GreedyRun ref = reference(dir, prompt, kDecodeSteps + 1);
  if (!ref.skip.empty()) GTEST_SKIP() << ref.skip;
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(kDecodeSteps + 1));

  const std::vector<std::vector<int32_t>> two = {{prompt[1], prompt[2]},
                                                 {prompt[3], prompt[0], prompt[4], prompt[5]}};
  struct Variant {
    int64_t chunk;
    std::vector<std::vector<int32_t>> others;
    int micro_batches;
  };
  for (const auto& [chunk, others, mbs] :
       {Variant{256, {}, 1}, Variant{5, {}, 1}, Variant{256, two, 3}}) {
    const testing::EngineRun r =
        testing::run_engine_greedy(dir, prompt, kDecodeSteps + 1, chunk, others, mbs);
    EXPECT_EQ(r.tokens, ref.tokens) << "chunk " << chunk << ", " << others.size() << " others";
    const testing::LogitError err = testing::logit_error(r.logits, ref.logits);
    if (err.max > testing::kMaxLogitError) {  // where it went wrong
      for (size_t st = 0; st < std::min(r.logits.size(), ref.logits.size()); ++st) {
        std::printf("  step %zu: |dlogit| max %.3g\n", st,
                    testing::logit_error({r.logits[st]}, {ref.logits[st]}).max);
      }
    }
    EXPECT_LE(err.max, testing::kMaxLogitError) << label << " chunk " << chunk;
    EXPECT_LE(err.mean, testing::kMeanLogitError) << label << " chunk " << chunk;
    std::printf(
        "[ gpt-oss exactness ] %s, prefill chunk %lld, %zu other requests, %d micro-batches: "
        "|dlogit| max %.3g, mean %.3g over %zu logits\n",
        label.c_str(), static_cast<long long>(chunk), others.size(), mbs, err.max, err.mean,
        err.count);
  }
}

TEST(GptOssExactnessTest, TinyPresetMatchesTheReference) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  expect_matches_reference(testing::test_model_dir("tiny-gpt-oss"), "tiny-gpt-oss");
}

// Shapes no preset has: 3 layers (sliding, full, sliding) with a 5-token
// window (not a multiple of the KV block of 4), 6 query heads over 3 KV heads
// of head_dim 32, hidden 160 and expert width 96 (5 and 3 MXFP4 blocks), 6
// experts top-3, and a SwiGLU limit of 1.5 that clamps many gate and up values.
TEST(GptOssExactnessTest, OddShapesMatchTheReference) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  model::MakeModelOptions o;
  o.preset = "tiny-gpt-oss";
  o.out_dir = (fs::path(::testing::TempDir()) / "gpt_oss_odd").string();
  o.seed = 7;
  o.config_overrides =
      Json{{"hidden_size", 160},       {"intermediate_size", 96},  {"num_hidden_layers", 3},
           {"num_attention_heads", 6}, {"num_key_value_heads", 3}, {"head_dim", 32},
           {"sliding_window", 5},      {"num_local_experts", 6},   {"num_experts_per_tok", 3},
           {"experts_per_token", 3},   {"swiglu_limit", 1.5}};
  const Status made = model::make_model(o);
  ASSERT_TRUE(made.ok()) << made.to_string();
  expect_matches_reference(o.out_dir, "odd shapes");
}

}  // namespace
}  // namespace msinfer::runtime
