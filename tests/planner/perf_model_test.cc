#include "msinfer/planner/perf_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_fixtures.h"

namespace msinfer::planner {
namespace {

using testing::half_util;
using testing::ideal_gpu;
using testing::tiny_model;

// Fit ranges entirely above the ridge of both sides of the tiny model (attention:
// 12.1 tokens, experts: 10 tokens), where the roofline is a straight line.
constexpr FitRange kAboveRidge{64, 4096, 64, 4096};

TEST(StageModelTest, RooflineCurvesByHand) {
  const ModelConfig m = tiny_model();
  DeploymentShape shape{ideal_gpu(), ideal_gpu(), 1, 1};
  StageModel s = build_stage_model(m, shape, /*seq_len=*/100, half_util(), nullptr, kAboveRidge);
  const RooflineCurve& a = s.attention_curve;
  // Dense attention-side GEMMs: 31488 FLOPs per token at 1e12; weights 2 * 38208 / 2 layers
  // bytes at 1e11 B/s.
  EXPECT_NEAR(a.compute_per_token, 31488.0 / 1e12, 1e-20);
  EXPECT_NEAR(a.weight, 38208.0 / 1e11, 1e-20);
  // Decode attention reads 128 B * 100 of KV (1.28e-7 s) while computing 25600 score
  // FLOPs (2.56e-8 s): one kernel, the larger of the two.
  EXPECT_NEAR(a.serial_per_token, 128.0 * 100 / 1e11, 1e-20);
  const RooflineCurve& e = s.expert_curve;
  EXPECT_NEAR(e.compute_per_token, 49152.0 / 1e12, 1e-20);  // 6 h h' FLOPs
  EXPECT_NEAR(e.weight, 49152.0 / 1e11, 1e-20);             // 2 * 3 h h' bytes
  EXPECT_EQ(e.serial_per_token, 0.0);
  // Per GEMM max(arithmetic, weights), not the sum: below the ridge the weights,
  // above it the arithmetic.
  EXPECT_NEAR(e.at(5), 49152.0 / 1e11, 1e-20);
  EXPECT_NEAR(e.at(10), 49152.0 / 1e11, 1e-20);
  EXPECT_NEAR(e.at(40), 40 * 49152.0 / 1e12, 1e-20);
  // Above the ridge the fitted line is the curve itself: k2 = k4 = 0 overheads.
  EXPECT_NEAR(s.k1, 31488.0 / 1e12 + 1.28e-7, 1e-15);
  EXPECT_NEAR(s.k2, 0.0, 1e-12);
  EXPECT_NEAR(s.k3, 49152.0 / 1e12, 1e-15);
  EXPECT_NEAR(s.k4, 0.0, 1e-12);
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

TEST(StageModelTest, FitBelowTheRidgeIsAllWeights) {
  StageModel s = build_stage_model(tiny_model(), {ideal_gpu(), ideal_gpu(), 1, 1}, 100, half_util(),
                                   nullptr, FitRange{1, 4, 1, 8});
  // Experts: b_e <= 8 < 10 tokens: T_e = weights alone, 4.9152e-7 s, flat.
  EXPECT_NEAR(s.k3, 0.0, 1e-15);
  EXPECT_NEAR(s.k4, 49152.0 / 1e11, 1e-15);
  // Attention: flat weights 3.8208e-7 plus the KV reads 1.28e-7 per token.
  EXPECT_NEAR(s.k1, 1.28e-7, 1e-15);
  EXPECT_NEAR(s.k2, 38208.0 / 1e11, 1e-15);
}

TEST(StageModelTest, FitAcrossTheRidgeStaysBelowTheSum) {
  // A GEMM at its ridge (10 tokens): roofline 4.9152e-7 s; the old sum k3 b + k4 said twice
  // that. A line fitted over [5, 20] passes within 25% of the curve everywhere on it.
  StageModel s = build_stage_model(tiny_model(), {ideal_gpu(), ideal_gpu(), 1, 1}, 100, half_util(),
                                   nullptr, FitRange{64, 4096, 5, 20});
  const double roof = 49152.0 / 1e11;
  EXPECT_LT(s.t_expert(10), 1.25 * roof);
  EXPECT_GT(s.t_expert(10), roof);  // a line under a convex curve's chord: above at the knee
  for (double b : {5.0, 7.0, 10.0, 14.0, 20.0}) {
    EXPECT_NEAR(s.t_expert(b) / s.expert_curve.at(b), 1.0, 0.25) << b;
  }
  const LinearFit f = fit_linear(RooflineCurve{1e-3, 0, 0, 0, 2e-3}, 1, 100);
  EXPECT_NEAR(f.slope, 1e-3, 1e-12);  // a straight line is fitted exactly
  EXPECT_NEAR(f.intercept, 2e-3, 1e-12);
}

TEST(NicTest, UtilisationAtThePerConnectionMessageSize) {
  // 10% of line rate at 1000 B, 90% at 1e6 B (log-linear between), 1e9 B/s NIC.
  auto curve = UtilCurve::make({{1000, 0.1}, {1e6, 0.9}}, "test");
  ASSERT_TRUE(curve.ok());
  // 4000 B over 4 connections: 1000 B messages, each at 10% of the line rate.
  EXPECT_NEAR(nic_transfer_time(4000, 4, 1e9, *curve), 4000 / 1e8, 1e-15);
  // One connection: one 4000 B message at util(4000) = 0.1 + 0.8 * log2(4) / log2(1000).
  const double u4000 = 0.1 + 0.8 * 2 / std::log2(1000.0);
  EXPECT_NEAR(nic_transfer_time(4000, 1, 1e9, *curve), 4000 / (1e9 * u4000), 1e-15);
  EXPECT_NEAR(nic_transfer_time(4e6, 4, 1e9, *curve), 4e6 / 0.9e9, 1e-15);  // 1e6 B messages

  // In the stage model: an attention GPU sends to E * tp_e = 4 * 2 expert GPUs; an expert
  // GPU hears from n_a * tp_a attention GPUs.
  StageModel s = build_stage_model(tiny_model(), {ideal_gpu(), ideal_gpu(), 2, 2}, 100, *curve);
  EXPECT_DOUBLE_EQ(s.attention_connections, 8);
  // b_a = 125 tokens, 2 * 64 * 2 / 2 = 128 B each: 16000 B, 2000 B per connection.
  const double u2000 = 0.1 + 0.8 * 1 / std::log2(1000.0);
  EXPECT_NEAR(s.t_comm_attention_side(125), 16000 / (1e9 * u2000), 1e-15);
  // b_e = 375 tokens, 64 B each (tp_e 2): 24000 B from 3 nodes * tp_a 2 = 6 senders, 4000 B.
  EXPECT_NEAR(s.t_comm_expert_side(375, 3), 24000 / (1e9 * u4000), 1e-15);
  // Adding attention nodes shrinks each message: slower per byte.
  EXPECT_GT(s.t_comm_expert_side(375, 6), s.t_comm_expert_side(375, 3));
}

TEST(StageModelTest, ExpertReductionOverlappedOrPartialSums) {
  const ModelConfig m = tiny_model();
  DeploymentShape ar_shape{ideal_gpu(), ideal_gpu(), 2, 2, ExpertReduction::kAllReduce};
  DeploymentShape ps_shape{ideal_gpu(), ideal_gpu(), 2, 2, ExpertReduction::kPartialSums};
  StageModel ar = build_stage_model(m, ar_shape, 100, half_util(), nullptr, kAboveRidge);
  StageModel ps = build_stage_model(m, ps_shape, 100, half_util(), nullptr, kAboveRidge);
  // Overlapped collective: all-gather (1/2 of a 128 B row) + all-reduce (2 * 1/2 of it) at
  // 1e10 B/s = 1.92e-8 s per token, hidden under the GEMM (2.4576e-8 s per token) by the max.
  EXPECT_NEAR(ar.expert_curve.overlapped_per_token, 1.5 * 128.0 / 1e10, 1e-20);
  EXPECT_EQ(ar.expert_curve.serial_per_token, 0.0);
  EXPECT_NEAR(ar.expert_curve.at(100), 100 * 49152.0 / 2 / 1e12, 1e-18);
  EXPECT_NEAR(ar.k3, 49152.0 / 2 / 1e12, 1e-15);
  EXPECT_DOUBLE_EQ(ar.expert_bytes_per_token, 64.0);     // a 1/tp_e slice of the row
  EXPECT_DOUBLE_EQ(ar.dispatch_bytes_per_token, 128.0);  // 2 h K / tp_a
  // Partial sums: no collective on the expert side; whole rows both ways (tp_e x bytes);
  // the attention side reads tp_e K partial rows per token: 2 * 64 * 2 * 2 / 2 B at 1e11.
  EXPECT_EQ(ps.expert_curve.overlapped_per_token, 0.0);
  EXPECT_DOUBLE_EQ(ps.expert_bytes_per_token, 128.0);
  EXPECT_DOUBLE_EQ(ps.dispatch_bytes_per_token, 256.0);
  EXPECT_NEAR(ps.attention_curve.serial_per_token - ar.attention_curve.serial_per_token,
              256.0 / 1e11, 1e-20);
  // With a slow link the collective dominates the GEMM and partial sums win on T_e.
  GpuSpec slow = ideal_gpu();
  slow.intra_node_bandwidth = 1e8;
  StageModel ar_slow = build_stage_model(m, {slow, slow, 2, 2, ExpertReduction::kAllReduce}, 100,
                                         half_util(), nullptr, kAboveRidge);
  EXPECT_NEAR(ar_slow.expert_curve.at(100), 100 * 1.5 * 128.0 / 1e8, 1e-15);
  EXPECT_EQ(std::string(expert_reduction_name(ExpertReduction::kPartialSums)), "n2m-partial-sums");
  EXPECT_TRUE(parse_expert_reduction("allreduce-overlapped").ok());
  EXPECT_FALSE(parse_expert_reduction("ring").ok());
}

TEST(StageModelTest, ReduceToShard0SendsWholeRowsAndReducesAfterTheGemms) {
  const ModelConfig m = tiny_model();
  StageModel r =
      build_stage_model(m, {ideal_gpu(), ideal_gpu(), 2, 2, ExpertReduction::kReduceToShard0}, 100,
                        half_util(), nullptr, kAboveRidge);
  StageModel ar =
      build_stage_model(m, {ideal_gpu(), ideal_gpu(), 2, 2, ExpertReduction::kAllReduce}, 100,
                        half_util(), nullptr, kAboveRidge);
  // Shard 0 receives the other shard's 128 B partial row per token over the 1e10 B/s
  // link, after the GEMMs: in series, nothing overlapped.
  EXPECT_NEAR(r.expert_curve.serial_per_token, 128.0 / 1e10, 1e-20);
  EXPECT_EQ(r.expert_curve.overlapped_per_token, 0.0);
  EXPECT_NEAR(r.expert_curve.at(100), 100 * 49152.0 / 2 / 1e12 + 100 * 128.0 / 1e10, 1e-18);
  // Every shard gets the whole row (2 h K / tp_a * tp_e); the attention side adds nothing.
  EXPECT_DOUBLE_EQ(r.dispatch_bytes_per_token, 256.0);
  EXPECT_DOUBLE_EQ(r.expert_bytes_per_token, 128.0);
  EXPECT_DOUBLE_EQ(r.attention_curve.serial_per_token, ar.attention_curve.serial_per_token);
  // tp_e 8 spans two nodes of 4: 7 rows over the NIC (1e9 B/s at 0.5).
  StageModel wide =
      build_stage_model(m, {ideal_gpu(), ideal_gpu(), 1, 8, ExpertReduction::kReduceToShard0}, 100,
                        half_util(), nullptr, kAboveRidge);
  EXPECT_NEAR(wide.expert_curve.serial_per_token, 7 * 128.0 / 0.5e9, 1e-18);
  EXPECT_EQ(std::string(expert_reduction_name(ExpertReduction::kReduceToShard0)),
            "reduce-to-shard0");
  EXPECT_EQ(*parse_expert_reduction("reduce-to-shard0"), ExpertReduction::kReduceToShard0);
}

// The runtime's two modes, on one deployment: partial sums make the attention
// side read tp_e partial rows; reducing to shard 0 makes the expert worker wait
// for the other shards' rows.
TEST(StageModelTest, RuntimeReductionFollowsWhereTheExtraWorkLands) {
  const ModelConfig m = tiny_model();
  RuntimeShape shape;
  shape.attention_workers = 1;
  shape.expert_workers = 2;  // two experts each
  shape.micro_batches = 2;
  shape.tp_expert = 2;
  shape.tokens_per_micro_batch = 64;
  shape.seq_len = 100;
  // A slow link between the shards: each expert worker waits 128 B per row at 1e8 B/s.
  GpuSpec slow = ideal_gpu();
  slow.intra_node_bandwidth = 1e8;
  RuntimeReductionChoice c = prefer_runtime_expert_reduction(m, slow, shape, half_util());
  EXPECT_EQ(c.preferred, ExpertReduction::kPartialSums);
  // By hand: 64 tokens x K 2 / 2 workers = 64 rows per worker, 32 per expert.
  const double rows = 64.0;
  EXPECT_NEAR(c.reduce_to_shard0.t_e - c.partial_sums.t_e, rows * 128.0 / 1e8, 1e-15);
  // The attention side reads 2 h K tp_e / tp_a = 512 B of partials per token.
  EXPECT_NEAR(c.partial_sums.t_a - c.reduce_to_shard0.t_a, 64 * 512.0 / 1e11, 1e-15);
  EXPECT_DOUBLE_EQ(c.partial_sums.t_c, c.reduce_to_shard0.t_c);
  EXPECT_DOUBLE_EQ(c.partial_sums_step, iteration_time(c.partial_sums, 2, 2));
  EXPECT_DOUBLE_EQ(c.reduce_to_shard0_step, iteration_time(c.reduce_to_shard0, 2, 2));
  EXPECT_LT(c.partial_sums_step, c.reduce_to_shard0_step);
  // Eight shards per expert and fast links: attention is the slowest stage, the
  // 8 K partial rows it reads per token add 12% to it, paid in every one of its
  // m L slots, while shard 0's wait for the other shards is nearly free.
  GpuSpec fast = ideal_gpu();
  fast.intra_node_bandwidth = fast.nic_bandwidth = 1e13;
  fast.gpus_per_node = 8;
  shape.tp_expert = 8;
  c = prefer_runtime_expert_reduction(m, fast, shape, half_util());
  EXPECT_GT(c.partial_sums.t_a, c.partial_sums.t_e);
  EXPECT_NEAR(c.partial_sums.t_a - c.reduce_to_shard0.t_a, 64 * 2.0 * 64 * 2 * 8 / 1e11, 1e-15);
  EXPECT_GT(c.partial_sums_step, kReduceToShard0MinGain * c.reduce_to_shard0_step);
  EXPECT_EQ(c.preferred, ExpertReduction::kReduceToShard0);
  // The same, gaining less than the margin: partial sums stay.
  shape.tp_expert = 2;
  c = prefer_runtime_expert_reduction(m, fast, shape, half_util());
  EXPECT_LT(c.reduce_to_shard0_step, c.partial_sums_step);
  EXPECT_LT(c.partial_sums_step, kReduceToShard0MinGain * c.reduce_to_shard0_step);
  EXPECT_EQ(c.preferred, ExpertReduction::kPartialSums);
}

TEST(StageModelTest, TensorParallelSplitsWorkAndAddsAllReduce) {
  const ModelConfig m = tiny_model();
  StageModel s1 = build_stage_model(m, {ideal_gpu(), ideal_gpu(), 1, 1}, 100, half_util(), nullptr,
                                    kAboveRidge);
  StageModel s2 = build_stage_model(m, {ideal_gpu(), ideal_gpu(), 2, 2}, 100, half_util(), nullptr,
                                    kAboveRidge);
  // Ring all-reduce of a 128-byte hidden row over 2 GPUs: 2 * 1/2 * 128 B at 1e10 B/s.
  const double ar = 128.0 / 1e10;
  EXPECT_NEAR(s2.attention_curve.compute_per_token, s1.attention_curve.compute_per_token / 2,
              1e-20);
  EXPECT_NEAR(s2.attention_curve.weight, s1.attention_curve.weight / 2, 1e-20);
  EXPECT_NEAR(s2.attention_curve.serial_per_token, s1.attention_curve.serial_per_token / 2 + ar,
              1e-20);
  EXPECT_NEAR(s2.expert_curve.compute_per_token, s1.expert_curve.compute_per_token / 2, 1e-20);
  EXPECT_NEAR(s2.expert_curve.weight, s1.expert_curve.weight / 2, 1e-20);
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
  StageModel s = build_stage_model(tiny_model(), {g, g, 1, 1}, 100, half_util(), nullptr,
                                   FitRange{1, 2, 1, 2});  // below both ridges
  EXPECT_NEAR(s.attention_curve.weight, 2 * 38208.0 / 1e11, 1e-15);
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
  // docs/PLANNER.md 3b: 4 m b_a s h L / g + 2 P_a, with h = 64, g = 2.
  const int mb = 3;
  const double b_a = 5, s = 100;
  EXPECT_DOUBLE_EQ(attention_node_bytes(m, mb, b_a, s),
                   4.0 * mb * b_a * s * 64 * 2 / 2 + 2 * m.attention_side_params());
  // tp 2 splits the 2 KV heads: the same bytes; tp 4 holds one KV head on
  // each of 4 ranks: twice the KV bytes of the node.
  EXPECT_DOUBLE_EQ(attention_node_bytes(m, mb, b_a, s, 2), attention_node_bytes(m, mb, b_a, s));
  EXPECT_DOUBLE_EQ(attention_node_bytes(m, mb, b_a, s, 4),
                   2 * 4.0 * mb * b_a * s * 64 * 2 / 2 + 2 * m.attention_side_params());
  EXPECT_DOUBLE_EQ(attention_node_capacity(ideal_gpu(), 2), 2e6);
  EXPECT_DOUBLE_EQ(expert_node_bytes(m), 2 * 49152.0);
}

// gpt-oss's sliding layers (issue 49): a layer with a window of 32 tokens
// reads and holds at most 32 tokens of KV; with one of the tiny model's two
// layers sliding, a 100-token context attends to (100 + 32) / 2 = 66 tokens a
// layer, and a context inside the window to all of it.
TEST(MemoryTest, SlidingLayersReadAndHoldTheirWindow) {
  ModelConfig m = tiny_model();
  const ModelConfig full = m;
  m.sliding_window = 32;
  m.sliding_layers = {true, false};
  EXPECT_DOUBLE_EQ(m.attended_tokens(100), 66.0);
  EXPECT_DOUBLE_EQ(m.attended_tokens(20), 20.0);
  EXPECT_DOUBLE_EQ(full.attended_tokens(100), 100.0);
  const int mb = 3;
  const double b_a = 5;
  EXPECT_DOUBLE_EQ(attention_node_bytes(m, mb, b_a, 100),
                   4.0 * mb * b_a * 66 * 64 * 2 / 2 + 2 * m.attention_side_params());
  DeploymentShape shape{ideal_gpu(), ideal_gpu(), 1, 1};
  StageModel s = build_stage_model(m, shape, /*seq_len=*/100, half_util(), nullptr, kAboveRidge);
  // RooflineCurvesByHand's KV read, over 66 tokens instead of 100.
  EXPECT_NEAR(s.attention_curve.serial_per_token, 128.0 * 66 / 1e11, 1e-20);
  // A plan document carries the windows (and the context bound) its figures assumed.
  m.max_position_embeddings = 4096;
  auto back = ModelConfig::from_json(JsonFields(m.to_json(), "model"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->sliding_window, 32);
  EXPECT_EQ(back->sliding_layers, m.sliding_layers);
  EXPECT_EQ(back->max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(back->attended_tokens(100), 66.0);
  Json bad = m.to_json();
  bad["layer_types"] = Json::array({"sliding_attention"});
  auto refused = ModelConfig::from_json(JsonFields(bad, "model"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("layer_types"), std::string::npos)
      << refused.status().message();
}

TEST(RooflineTest, ExpertGemmUtilisation) {
  GpuSpec a100 = ideal_gpu();
  a100.bf16_flops = 312e12;
  a100.memory_bandwidth = 2000e9;
  // docs/PLANNER.md 3b: an A100 needs ~156 tokens per GEMM to be compute-bound.
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
