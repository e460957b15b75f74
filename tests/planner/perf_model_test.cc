#include "msinfer/planner/perf_model.h"

#include <gtest/gtest.h>

#include "test_fixtures.h"

namespace msinfer::planner {
namespace {

using testing::half_util;
using testing::ideal_gpu;
using testing::tiny_model;

TEST(StageModelTest, RooflineCoefficientsByHand) {
  const ModelConfig m = tiny_model();
  DeploymentShape shape{ideal_gpu(), ideal_gpu(), 1, 1};
  StageModel s = build_stage_model(m, shape, /*seq_len=*/100, half_util());
  // k2: attention-side weights per MoE layer, 2 bytes * 38208 params / 2 layers, at 1e11 B/s.
  EXPECT_NEAR(s.k2, 38208.0 / 1e11, 1e-18);
  // k1: KV 128 B * 100 tokens at 1e11 B/s + (31488 dense + 25600 score) FLOPs at 1e12.
  EXPECT_NEAR(s.k1, 128.0 * 100 / 1e11 + (31488.0 + 25600.0) / 1e12, 1e-18);
  // k4: one expert's weights per layer, 2 * 3 * 64 * 128 bytes.
  EXPECT_NEAR(s.k4, 49152.0 / 1e11, 1e-18);
  // k3: 6 * 64 * 128 FLOPs per token.
  EXPECT_NEAR(s.k3, 49152.0 / 1e12, 1e-18);
  EXPECT_DOUBLE_EQ(s.dispatch_bytes_per_token, 2.0 * 64 * 2);  // bf16 row to K = 2 experts
  EXPECT_DOUBLE_EQ(s.expert_bytes_per_token, 2.0 * 64);
  // T_c: bytes / (1e9 B/s * 0.5).
  EXPECT_DOUBLE_EQ(s.t_comm_attention_side(10), 2560.0 / 5e8);
  EXPECT_DOUBLE_EQ(s.t_comm_expert_side(10), 1280.0 / 5e8);
  EXPECT_DOUBLE_EQ(s.t_comm(10, 10), 2560.0 / 5e8);
  EXPECT_DOUBLE_EQ(s.t_comm(10, 40), 5120.0 / 5e8);
  EXPECT_DOUBLE_EQ(s.t_attention(3), 3 * s.k1 + s.k2);
  EXPECT_DOUBLE_EQ(s.t_expert(3), 3 * s.k3 + s.k4);
}

TEST(StageModelTest, TensorParallelSplitsWorkAndAddsAllReduce) {
  const ModelConfig m = tiny_model();
  StageModel s1 = build_stage_model(m, {ideal_gpu(), ideal_gpu(), 1, 1}, 100, half_util());
  StageModel s2 = build_stage_model(m, {ideal_gpu(), ideal_gpu(), 2, 2}, 100, half_util());
  // Ring all-reduce of a 128-byte hidden row over 2 GPUs: 2 * 1/2 * 128 B at 1e10 B/s.
  const double ar = 128.0 / 1e10;
  EXPECT_NEAR(s2.k1, s1.k1 / 2 + ar, 1e-18);
  EXPECT_NEAR(s2.k2, s1.k2 / 2, 1e-18);
  EXPECT_NEAR(s2.k3, s1.k3 / 2 + ar, 1e-18);
  EXPECT_NEAR(s2.k4, s1.k4 / 2, 1e-18);
  EXPECT_DOUBLE_EQ(s2.dispatch_bytes_per_token, s1.dispatch_bytes_per_token / 2);
  EXPECT_DOUBLE_EQ(allreduce_time(ideal_gpu(), 1, 1e6, half_util()), 0.0);
  // Beyond a node (4 GPUs) the all-reduce crosses the NIC (1e9 B/s at 0.5).
  EXPECT_DOUBLE_EQ(allreduce_time(ideal_gpu(), 8, 1000, half_util()), 2.0 * 7 / 8 * 1000 / 5e8);
}

TEST(StageModelTest, EfficiencyAndOverheadsComeFromTheCatalogue) {
  GpuSpec g = ideal_gpu();
  g.efficiency.memory_bandwidth = 0.5;
  g.efficiency.attention_layer_overhead_s = 1e-5;
  g.efficiency.expert_layer_overhead_s = 2e-5;
  StageModel s = build_stage_model(tiny_model(), {g, g, 1, 1}, 100, half_util());
  EXPECT_NEAR(s.k2, 2 * 38208.0 / 1e11 + 1e-5, 1e-15);
  EXPECT_NEAR(s.k4, 2 * 49152.0 / 1e11 + 2e-5, 1e-15);
}

TEST(StageModelTest, ProfileOverridesAndScalesWithTp) {
  Json j = Json::parse(R"({"k1_ms_per_token": 0.01, "k2_ms": 0.5, "k3_ms_per_token": 0.002,
                           "k4_ms": 0.25, "tp_attention": 1, "tp_expert": 1,
                           "nic_util_curve": [[1, 0.25]], "nic_gb_s": 2})");
  auto p = parse_profile(j, "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  StageModel s = build_stage_model(tiny_model(), {ideal_gpu(), ideal_gpu(), 1, 1}, 100,
                                   half_util(), &*p);
  EXPECT_DOUBLE_EQ(s.k1, 1e-5);
  EXPECT_DOUBLE_EQ(s.k2, 5e-4);
  EXPECT_DOUBLE_EQ(s.k3, 2e-6);
  EXPECT_DOUBLE_EQ(s.k4, 2.5e-4);
  EXPECT_DOUBLE_EQ(s.t_comm_attention_side(10), 2560.0 / (2e9 * 0.25));
  EXPECT_EQ(s.source, "profile profile.json");
  StageModel s2 = build_stage_model(tiny_model(), {ideal_gpu(), ideal_gpu(), 2, 1}, 100,
                                    half_util(), &*p);
  EXPECT_NEAR(s2.k1, 0.5e-5 + 128.0 / 1e10, 1e-18);
  EXPECT_DOUBLE_EQ(s2.k2, 2.5e-4);

  EXPECT_FALSE(parse_profile(Json::parse(R"({"k1_ms_per_token": -1})"), "p").ok());
  EXPECT_FALSE(parse_profile(Json::parse(R"({"tp_attention": 0, "k2_ms": 1})"), "p").ok());
  auto empty = parse_profile(Json::parse("{}"), "p.json");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("p.json: holds none of"), std::string::npos);
}

TEST(StageModelTest, JsonRoundTrip) {
  StageModel s = build_stage_model(tiny_model(), {ideal_gpu(), ideal_gpu(), 1, 1}, 100,
                                   half_util());
  Json j = s.to_json();
  auto back = StageModel::from_json(JsonFields(j, "stage_model"));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_NEAR(back->k1, s.k1, 1e-18);
  EXPECT_NEAR(back->k4, s.k4, 1e-18);
  EXPECT_DOUBLE_EQ(back->t_comm(7, 9), s.t_comm(7, 9));
  j.erase("k3_ms_per_token");
  EXPECT_FALSE(StageModel::from_json(JsonFields(j, "stage_model")).ok());
}

TEST(MemoryTest, SpecFormula) {
  const ModelConfig m = tiny_model();
  // SPEC: 4 m b_a s h L / g + 2 P_a, with h = 64, g = 2.
  const int mb = 3;
  const double b_a = 5, s = 100;
  EXPECT_DOUBLE_EQ(attention_node_bytes(m, mb, b_a, s),
                   4.0 * mb * b_a * s * 64 * 2 / 2 + 2 * m.attention_side_params());
  EXPECT_DOUBLE_EQ(attention_node_capacity(ideal_gpu(), 2), 2e6);
  EXPECT_DOUBLE_EQ(expert_node_bytes(m), 2 * 49152.0);
}

TEST(RooflineTest, ExpertGemmUtilisation) {
  GpuSpec a100 = ideal_gpu();
  a100.bf16_flops = 312e12;
  a100.memory_bandwidth = 2000e9;
  // SPEC section 1: an A100 needs ~156 tokens per GEMM to be compute-bound.
  EXPECT_NEAR(expert_gemm_utilization(78, a100), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(expert_gemm_utilization(156, a100), 1.0);
  EXPECT_DOUBLE_EQ(expert_gemm_utilization(1000, a100), 1.0);
}

TEST(ClosedFormTest, SpecTotalByHand) {
  StageTimes t{1.0, 0.8, 0.3};
  // (1 + 0.8 + 0.6) + 1.0 * (3 * 4 - 1) = 2.4 + 11
  EXPECT_DOUBLE_EQ(spec_iteration_time(t, 3, 4), 13.4);
  // m = 3 >= 2 (1 + 0.3) = 2.6 and T_c < T_f: full overlap, both forms agree.
  EXPECT_TRUE(full_overlap(t, 3));
  EXPECT_DOUBLE_EQ(iteration_time(t, 3, 4), 13.4);
  EXPECT_EQ(min_micro_batches_for_overlap(t), 3);
  // m = 1: one micro-batch walks the layers alone: L * (T_a + T_e + 2 T_c).
  EXPECT_FALSE(full_overlap(t, 1));
  EXPECT_DOUBLE_EQ(iteration_time(t, 1, 4), 4 * 2.4);
  // m = 2 < 2.6: the round trip (2.4) is longer than 2 T_f (2.0) and sets the period.
  EXPECT_FALSE(full_overlap(t, 2));
  EXPECT_DOUBLE_EQ(iteration_time(t, 2, 4), 2.4 + 3 * 2.4 + 1.0);
  // Communication slower than compute: the NIC is the slowest stage.
  StageTimes slow_net{1.0, 1.0, 1.5};
  EXPECT_FALSE(full_overlap(slow_net, 8));
  EXPECT_DOUBLE_EQ(iteration_time(slow_net, 4, 2), 5.0 + 1 * 6.0 + 3 * 1.5);
  EXPECT_EQ(min_micro_batches_for_overlap(StageTimes{1, 1, 0}), 2);
}

}  // namespace
}  // namespace msinfer::planner
