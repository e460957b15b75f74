// GLM-4.5 (Glm4MoeForCausalLM: GQA with q/k/v biases, partial rotary and q/k
// norms; dense first layer, shared experts, grouped sigmoid routing) on the
// disaggregated runtime against the co-located engine, through the msinfer
// binary as a user runs it: the dense layer's MLP on the attention workers,
// the shared experts on either side (--shared-experts), the routed experts on
// the expert workers; under
// attention tp each rank holds its heads' rows of q/k/v and of their biases.
// And `msinfer plan` reads the model's config.json.
#include <gtest/gtest.h>

#include <fstream>

#include "../common/subprocess.h"
#include "msinfer/runtime/disaggregated.h"
#include "test_models.h"
#include "tp_checks.h"

namespace msinfer::runtime {
namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const std::string p = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(p) << text;
  return p;
}

// Greedy tokens of 1+1 (m 1), 2+3 with m 2, attention tp 2 over a placement
// with every expert on two workers, and expert tp 2 equal the co-located
// engine's; the tp runs up to a near-tie (tp_checks.h: they add o_proj's or
// the down projection's partial sums in another order).
TEST(Glm4MoeDisaggregatedTest, SameTokensAsTheColocatedEngine) {
  const std::string dir = testing::test_model_dir("tiny-glm4-moe");
  const ModelConfig mc = load_model_config(dir).value();
  ASSERT_EQ(mc.architecture, "Glm4MoeForCausalLM");
  ASSERT_LT(mc.moe_layers, mc.layers);  // a dense layer: a unit with no rows
  Placement replicas;
  replicas.workers = 3;
  for (int e = 0; e < mc.experts; ++e)
    replicas.replicas.push_back({{e % 3, 0.5}, {(e + 1) % 3, 0.5}});
  const std::string replicated = write_file("glm_replicas.json", replicas.to_json().dump());
  const std::vector<int32_t> prompt = {5, 9, 22, 40, 7, 8, 11};
  const std::string args =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
  const auto ref = testing::generate(args).tokens;
  ASSERT_EQ(ref.size(), 12u);
  // Both shared-expert placements (--shared-experts expert: layer l's shared
  // expert on expert worker l mod 3, slot 0 of every token with weight 1).
  for (const std::string d :
       {"--attention-workers 1 --expert-workers 1 --micro-batches 1",
        "--attention-workers 2 --expert-workers 3 --micro-batches 2 --shared-experts attention",
        "--attention-workers 2 --expert-workers 3 --micro-batches 2 --shared-experts expert"}) {
    EXPECT_EQ(testing::generate(args + " " + d).tokens, ref) << d;
  }
  for (const std::string& d :
       {"--attention-workers 1 --expert-workers 3 --micro-batches 2 --tp-attention 2 "
        "--placement " +
            replicated,
        std::string("--attention-workers 1 --expert-workers 2 --micro-batches 2 --tp-expert 2")}) {
    const testing::Generated g = testing::generate(args + " " + d);
    testing::expect_equal_up_to_near_tie(ref, g.tokens, dir, prompt, "tiny-glm4-moe " + d);
    if (d.find("--tp-attention 2") != std::string::npos) {  // each rank holds half the heads
      EXPECT_NE(g.err.find("attention worker 0 tp rank 1 ready"), std::string::npos) << g.err;
      EXPECT_NE(g.err.find("heads 3..5"), std::string::npos) << g.err;
    }
  }
}

// `msinfer plan` takes the model directory: the config's dense layer and
// shared expert go to the attention side of the plan.
TEST(Glm4MoePlanTest, PlanReadsTheConfig) {
  const std::string dir = testing::test_model_dir("tiny-glm4-moe");
  const std::string out = msinfer::testing::run_capture(
      std::string(MSINFER_BINARY) + " plan --model " + dir + " --gpu A100 --json 2>&1");
  auto j = parse_json(out, "plan --json");
  ASSERT_TRUE(j.ok()) << out.substr(0, 600);
  ASSERT_TRUE(j->contains("model")) << out.substr(0, 600);
  EXPECT_EQ((*j)["model"]["architecture"], "Glm4MoeForCausalLM");
  EXPECT_EQ((*j)["model"]["moe_layers"], 2);
  EXPECT_EQ((*j)["model"]["shared_expert_ffn"], 48);
  EXPECT_EQ((*j)["model"]["attention_bias"], true);
  EXPECT_EQ((*j)["model"]["partial_rotary_factor"], 0.5);
}

}  // namespace
}  // namespace msinfer::runtime
