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
// Prefill and decode of `dir` against OpenAI's own reference
// (testing::expect_matches_reference); `label` names the checkpoint.
void expect_matches_reference(const std::string& dir, const std::string& label) {
  testing::expect_matches_reference("gpt_oss_reference.py", "gpt-oss", dir, label);
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
