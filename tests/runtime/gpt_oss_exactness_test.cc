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
#include "msinfer/kernels/cpu/isa.h"
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

// A checkpoint of shapes no preset has: 3 layers (sliding, full, sliding) with a 5-token
// window (not a multiple of the KV block of 4), 6 query heads over 3 KV heads
// of head_dim 32, hidden 160 and expert width 96 (5 and 3 MXFP4 blocks), 6
// experts top-3, and a SwiGLU limit of 1.5 that clamps many gate and up values.
std::string odd_shapes_dir() {
  static std::string dir;
  if (!dir.empty()) return dir;
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
  EXPECT_TRUE(made.ok()) << made.to_string();
  dir = o.out_dir;
  return dir;
}

TEST(GptOssExactnessTest, OddShapesMatchTheReference) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  expect_matches_reference(odd_shapes_dir(), "odd shapes");
}

// --weights mxfp4 (experts kept 4-bit, decoded in the GEMM's registers)
// against the experts decoded to bf16 at load, on the active level, the
// request batched with two others over 2 micro-batches (expert GEMMs of
// several rows) and alone (one row). At generic, avx2 and avx512 the mxfp4
// kernel is the bf16 kernel on the same values: every logit is the same bits.
// At avx512bf16 and amx (bf16 by vdpbf16ps, mxfp4 by the avx512 FMAs) the
// greedy tokens are the same up to a near-tie: where they first part, the
// bf16 run's logit for the mxfp4 run's token is within kMaxLogitError of its
// best, and the logits before it within the exactness bars.
TEST(GptOssMxfp4Test, FourBitExpertsGiveTheDecodedBf16Tokens) {
  using kernels::cpu::IsaLevel;
  const IsaLevel level = kernels::cpu::active_isa();
  const bool same_bits =
      level == IsaLevel::kGeneric || level == IsaLevel::kAvx2 || level == IsaLevel::kAvx512;
  const std::vector<int32_t> prompt = {5, 9, 22, 40, 7, 8, 11, 3, 30, 17, 2, 12};
  const std::vector<std::vector<int32_t>> others = {{4, 4, 8, 1, 9, 33, 6}, {21, 7, 7, 2, 5, 10}};
  for (const std::string& dir : {testing::test_model_dir("tiny-gpt-oss"), odd_shapes_dir()}) {
    for (bool batched : {false, true}) {
      const auto& with = batched ? others : std::vector<std::vector<int32_t>>{};
      const int mb = batched ? 2 : 1;
      const testing::EngineRun b = testing::run_engine_greedy(dir, prompt, 16, 5, with, mb,
                                                              kernels::cpu::WeightFormat::kBf16);
      const testing::EngineRun m = testing::run_engine_greedy(dir, prompt, 16, 5, with, mb,
                                                              kernels::cpu::WeightFormat::kMxfp4);
      const std::string what =
          dir + (batched ? " batched" : " alone") + " at " + kernels::cpu::isa_name(level);
      ASSERT_EQ(b.tokens.size(), 16u) << what;
      ASSERT_EQ(m.tokens.size(), 16u) << what;
      if (same_bits) {
        EXPECT_EQ(m.tokens, b.tokens) << what;
        EXPECT_TRUE(m.logits == b.logits) << what << ": logits differ";
        continue;
      }
      size_t i = 0;
      while (i < b.tokens.size() && b.tokens[i] == m.tokens[i]) ++i;
      const size_t upto = std::min(i + 1, b.logits.size());
      using Steps = std::vector<std::vector<float>>;
      const testing::LogitError e =
          testing::logit_error(Steps(m.logits.begin(), m.logits.begin() + upto),
                               Steps(b.logits.begin(), b.logits.begin() + upto));
      EXPECT_LE(e.max, testing::kMaxLogitError) << what;
      EXPECT_LE(e.mean, testing::kMeanLogitError) << what;
      if (i < b.tokens.size()) {
        const auto& l = b.logits[i];
        const float best = *std::max_element(l.begin(), l.end());
        EXPECT_LE(best - l[m.tokens[i]], testing::kMaxLogitError)
            << what << ": token " << i << " is " << m.tokens[i] << ", bf16's " << b.tokens[i];
      }
      std::printf("[ mxfp4 ] %s: |dlogit| max %.3g mean %.3g, tokens equal to %zu of 16\n",
                  what.c_str(), e.max, e.mean, i);
    }
  }
}

}  // namespace
}  // namespace msinfer::runtime
