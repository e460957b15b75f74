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
constexpr int kDecodeSteps = 16;

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::string skip;  // the harness's reason when it exited 77
};

GreedyRun reference(const std::string& dir, const std::vector<int32_t>& prompt, int steps) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string out = (fs::path(::testing::TempDir()) / "ds_ref.json").string();
  const std::string err = (fs::path(::testing::TempDir()) / "ds_ref.err").string();
  const std::string rc = msinfer::testing::run_capture(
      "cd " + std::string(MSINFER_SOURCE_DIR) + " && /usr/bin/python3 " +
      "tests/runtime/deepseek_reference.py '" + dir + "' " + ids + " " + std::to_string(steps) +
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

// Prefill and decode of `dir` against the reference, in the three variants
// above; `label` names the checkpoint in messages.
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
        "[ deepseek exactness ] %s, prefill chunk %lld, %zu other requests, %d micro-batches: "
        "|dlogit| max %.3g, mean %.3g over %zu logits\n",
        label.c_str(), static_cast<long long>(chunk), others.size(), mbs, err.max, err.mean,
        err.count);
  }
}

class DeepSeekExactnessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepSeekExactnessTest, LogitsAndGreedyTokensMatchTheReference) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  expect_matches_reference(testing::test_model_dir(GetParam()), GetParam());
}

// A checkpoint of shapes no preset has: 3 heads, ranks and head sizes that
// are not powers of two (nor multiples of the fp8 block, so every weight has
// partial 128x128 blocks), 12 experts in 3 groups of which 2 are kept, top-3.
TEST(DeepSeekOddShapesTest, LogitsAndGreedyTokensMatchTheReference) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
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
