// The co-located CPU engine on both tiny DeepSeek presets against DeepSeek's
// own reference (tests/runtime/deepseek_reference.py --dtype engine: its
// inference/model.py in float32 with the engine's bf16 roundings of GEMM
// inputs and of the latent cache). Prefill plus 16 greedy decode steps, every
// step's logits within the exactness bars of exactness_test.cc (why those:
// there), the greedy tokens identical; whole prompt, prompt in chunks of 5,
// and batched with two other requests over 3 micro-batches. Skips (the
// harness's exit 77) without torch or without the reference checkout.
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
// Prefill and decode of `dir` against DeepSeek's own reference
// (testing::expect_matches_reference); `label` names the checkpoint.
void expect_matches_reference(const std::string& dir, const std::string& label) {
  testing::expect_matches_reference("deepseek_reference.py", "deepseek", dir, label);
}

class DeepSeekExactnessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepSeekExactnessTest, LogitsAndGreedyTokensMatchTheReference) {
  if (const std::string why = testing::reference_unavailable("deepseek_reference.py");
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  expect_matches_reference(testing::test_model_dir(GetParam()), GetParam());
}

// A checkpoint of shapes no preset has: 3 heads, ranks and head sizes that
// are not powers of two (nor multiples of the fp8 block, so every weight has
// partial 128x128 blocks), 12 experts in 3 groups of which 2 are kept, top-3.
TEST(DeepSeekOddShapesTest, LogitsAndGreedyTokensMatchTheReference) {
  if (const std::string why = testing::reference_unavailable("deepseek_reference.py");
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  model::MakeModelOptions o;
  o.preset = "tiny-deepseek-v3";
  o.out_dir = (fs::path(::testing::TempDir()) / "deepseek_odd").string();
  o.seed = 7;
  o.config_overrides = Json{{"hidden_size", 176},
                            {"intermediate_size", 200},
                            {"moe_intermediate_size", 72},
                            {"num_attention_heads", 3},
                            {"num_key_value_heads", 3},
                            {"q_lora_rank", 72},
                            {"kv_lora_rank", 40},
                            {"qk_nope_head_dim", 24},
                            {"qk_rope_head_dim", 10},
                            {"v_head_dim", 20},
                            {"n_routed_experts", 12},
                            {"n_group", 3},
                            {"topk_group", 2},
                            {"num_experts_per_tok", 3}};
  const Status made = model::make_model(o);
  ASSERT_TRUE(made.ok()) << made.to_string();
  expect_matches_reference(o.out_dir, "odd shapes");
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, DeepSeekExactnessTest,
                         ::testing::Values("tiny-deepseek-v3", "tiny-deepseek-v2-lite"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = (ch == '-') ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace msinfer::runtime
