#include "msinfer/planner/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "test_fixtures.h"

namespace msinfer::planner {
namespace {

using testing::half_util;
using testing::ideal_gpu;

// A deployment whose stage times are set directly: T_a = ta, T_e = te (at every
// batch), one-way T_c = tc on both sides (constant-time transfers).
Deployment fixed_times(double ta, double te, double tc, int n_a, int m, int layers, int experts = 4,
                       int top_k = 2) {
  Deployment d;
  d.model = testing::tiny_model();
  d.model.layers = d.model.moe_layers = layers;
  d.model.experts = experts;
  d.model.top_k = top_k;
  d.shape = DeploymentShape{ideal_gpu(), ideal_gpu(), 1, 1};
  d.attention_nodes = n_a;
  d.micro_batches = m;
  d.batch_per_micro_batch = 8;
  d.seq_len = 100;
  StageModel& s = d.stage;
  s.k1 = 0;
  s.k2 = ta;
  s.k3 = 0;
  s.k4 = te;
  s.nic_util = half_util();
  // Transfer time = bytes / (bandwidth * 0.5) = tc for both sides at this batch.
  s.dispatch_bytes_per_token = 100;
  s.attention_nic_bandwidth = 8 * 100 / (0.5 * tc);
  const double b_e = 8.0 * n_a * top_k / experts;
  s.expert_bytes_per_token = 100;
  s.expert_nic_bandwidth = b_e * 100 / (0.5 * tc);
  return d;
}

TEST(SimulatorTest, MatchesSpecTotalUnderFullOverlap) {
  struct Case {
    double ta, te, tc;
    int n_a, m, layers;
  };
  for (const Case c : {Case{1.0e-3, 1.0e-3, 0.2e-3, 2, 3, 8}, Case{1.0e-3, 0.8e-3, 0.3e-3, 3, 3, 16},
                       Case{0.7e-3, 1.0e-3, 0.4e-3, 4, 4, 12}, Case{1.0e-3, 0.9e-3, 0.1e-3, 1, 4, 30}}) {
    Deployment d = fixed_times(c.ta, c.te, c.tc, c.n_a, c.m, c.layers);
    StageTimes t = d.stage_times();
    ASSERT_NEAR(t.t_c, c.tc, 1e-15);
    ASSERT_TRUE(full_overlap(t, c.m)) << c.n_a << " " << c.m;
    SimOptions o;
    o.iterations = 5;
    auto r = simulate(d, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const double spec = spec_iteration_time(t, c.m, c.layers);
    EXPECT_NEAR(r->tbt_mean / spec, 1.0, 0.01) << "case ta=" << c.ta << " m=" << c.m;
    EXPECT_NEAR(r->tbt_p99 / spec, 1.0, 0.01);
    EXPECT_NEAR(r->t_attention, c.ta, 1e-12);
    EXPECT_NEAR(r->t_expert, c.te, 1e-12);
    EXPECT_NEAR(r->t_comm, c.tc, 1e-9);
    EXPECT_EQ(r->tokens, 5 * d.global_batch());
    EXPECT_NEAR(r->throughput, d.global_batch() / r->tbt_mean, r->throughput * 1e-9);
  }
}

TEST(SimulatorTest, MatchesGeneralisedClosedFormOutsideFullOverlap) {
  // m below 2 (1 + T_c / T_f), and T_c above T_f.
  for (auto [ta, te, tc, m] : {std::tuple{1.0e-3, 1.0e-3, 0.8e-3, 2}, std::tuple{1e-3, 1e-3, 1.5e-3, 4},
                               std::tuple{1e-3, 0.5e-3, 0.2e-3, 1}}) {
    Deployment d = fixed_times(ta, te, tc, 2, m, 10);
    auto r = simulate(d, SimOptions{});
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r->tbt_mean / iteration_time(d.stage_times(), m, 10), 1.0, 0.01)
        << ta << " " << te << " " << tc << " " << m;
  }
}

TEST(SimulatorTest, CommunicationBoundPipelineShowsIdleCompute) {
  // T_c = 2 T_f: the NICs are the bottleneck, compute idles about half the time.
  Deployment d = fixed_times(1e-3, 1e-3, 2e-3, 2, 4, 20);
  StageTimes t = d.stage_times();
  EXPECT_FALSE(full_overlap(t, 4));
  auto r = simulate(d, SimOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_LT(r->attention_busy, 0.6);
  EXPECT_LT(r->expert_busy, 0.6);
  EXPECT_GT(r->attention_nic_busy, 0.9);
  EXPECT_NEAR(r->attention_busy, t.t_a / t.t_c, 0.1);
  // With fast links and enough micro-batches both sides stay busy.
  Deployment good = fixed_times(1e-3, 1e-3, 0.2e-3, 2, 4, 20);
  auto g = simulate(good, SimOptions{});
  ASSERT_TRUE(g.ok());
  EXPECT_GT(g->attention_busy, 0.9);
  EXPECT_GT(g->expert_busy, 0.9);
}

TEST(SimulatorTest, TooFewMicroBatchesLeaveBubbles) {
  // m = 2 < 2 (1 + T_c / T_f) = 3.2: each layer waits for the round trip.
  Deployment d = fixed_times(1e-3, 1e-3, 0.6e-3, 2, 2, 20);
  EXPECT_EQ(min_micro_batches_for_overlap(d.stage_times()), 4);
  auto r = simulate(d, SimOptions{});
  ASSERT_TRUE(r.ok());
  // Busy = m T_a / (T_a + T_e + 2 T_c) per layer = 2 / 3.2.
  EXPECT_NEAR(r->attention_busy, 2.0 / 3.2, 0.03);
  EXPECT_GT(r->attention_bubble, 0.3 * r->tbt_mean);
}

TEST(SimulatorTest, OneMicroBatchKeepsEachSideBusyAtMostHalfTheTime) {
  for (double tc : {0.0, 0.1e-3, 0.5e-3}) {
    Deployment d = fixed_times(1e-3, 1e-3, std::max(tc, 1e-9), 3, 1, 10);
    auto r = simulate(d, SimOptions{});
    ASSERT_TRUE(r.ok());
    EXPECT_LE(r->attention_busy, 0.5 + 1e-6);
    EXPECT_LE(r->expert_busy, 0.5 + 1e-6);
    EXPECT_GT(r->attention_busy, 0.3);
  }
}

TEST(SimulatorTest, ZipfSharesAreCappedAndSumToOne) {
  auto p = zipf_expert_shares(8, 2, 0.0);
  for (double x : p) EXPECT_DOUBLE_EQ(x, 1.0 / 8);
  p = zipf_expert_shares(8, 2, 3.0);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
  EXPECT_NEAR(p[0], 0.5, 1e-12);  // capped at 1 / K
  for (size_t i = 1; i < p.size(); ++i) EXPECT_LE(p[i], p[i - 1] + 1e-15);
  p = zipf_expert_shares(4, 4, 5.0);  // K = E: every expert sees every token
  for (double x : p) EXPECT_NEAR(x, 0.25, 1e-12);
}

// The tiny model on ideal GPUs with expert compute made to matter (k3 x 20),
// for the load-skew tests.
Deployment expert_bound_deployment() {
  Deployment d;
  d.model = testing::tiny_model();
  d.model.layers = d.model.moe_layers = 8;
  d.shape = DeploymentShape{ideal_gpu(), ideal_gpu(), 1, 1};
  d.attention_nodes = 4;
  d.micro_batches = 3;
  d.batch_per_micro_batch = 64;
  d.seq_len = 100;
  d.stage = build_stage_model(d.model, d.shape, 100, half_util());
  d.stage.k3 *= 20;  // make expert compute matter
  return d;
}

TEST(SimulatorTest, SkewedLoadMakesTheHotExpertAStraggler) {
  const Deployment d = expert_bound_deployment();
  auto flat = simulate(d, SimOptions{});
  SimOptions skew;
  skew.zipf_s = 1.5;
  auto hot = simulate(d, skew);
  ASSERT_TRUE(flat.ok() && hot.ok());
  EXPECT_GT(hot->tbt_mean, flat->tbt_mean * 1.1);
  EXPECT_LT(hot->throughput, flat->throughput);
  EXPECT_GT(hot->expert_busy_max, hot->expert_busy + 0.05);
  EXPECT_NEAR(flat->expert_busy_max, flat->expert_busy, 1e-9);
}

// A placement (SimOptions::node_replica_shares) with one expert per node and
// the Zipf shares is the Zipf run itself; splitting the hottest expert over two
// nodes (the coldest two sharing one) lowers the busiest node's load and the
// time between tokens. Shares that do not fit the deployment are refused.
TEST(SimulatorTest, APlacementWithReplicasSpreadsTheHotExpert) {
  const Deployment d = expert_bound_deployment();
  const int E = d.model.experts;
  SimOptions zipf;
  zipf.zipf_s = 1.5;
  const std::vector<double> sh = zipf_expert_shares(E, d.model.top_k, 1.5);
  SimOptions same;
  for (int e = 0; e < E; ++e) same.node_replica_shares.push_back({sh[e]});
  auto a = simulate(d, zipf);
  auto b = simulate(d, same);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  EXPECT_DOUBLE_EQ(a->tbt_mean, b->tbt_mean);
  EXPECT_DOUBLE_EQ(a->expert_busy_max, b->expert_busy_max);

  // Expert 0 (the hottest) on nodes 0 and E-1 by halves; the two coldest
  // experts share node E-2.
  SimOptions replicated;
  replicated.node_replica_shares.assign(E, {});
  replicated.node_replica_shares[0] = {sh[0] / 2};
  replicated.node_replica_shares[E - 1] = {sh[0] / 2};
  for (int e = 1; e < E - 2; ++e) replicated.node_replica_shares[e] = {sh[e]};
  replicated.node_replica_shares[E - 2] = {sh[E - 2], sh[E - 1]};
  auto c = simulate(d, replicated);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_LT(c->expert_busy_max, a->expert_busy_max);
  EXPECT_LT(c->tbt_mean, a->tbt_mean);
  EXPECT_NEAR(c->expert_load_share[0], sh[0] / 2, 1e-12);
  EXPECT_NEAR(c->expert_load_share[E - 2], sh[E - 2] + sh[E - 1], 1e-12);

  SimOptions wrong_count;
  wrong_count.node_replica_shares.assign(E - 1, {1.0 / (E - 1)});
  EXPECT_EQ(simulate(d, wrong_count).status().code(), StatusCode::kInvalidArgument);
  SimOptions wrong_sum = same;
  wrong_sum.node_replica_shares[0][0] += 0.5;
  EXPECT_EQ(simulate(d, wrong_sum).status().code(), StatusCode::kInvalidArgument);
}

TEST(SimulatorTest, JitterIsSeededAndWidensTheTail) {
  Deployment d = fixed_times(1e-3, 1e-3, 0.2e-3, 2, 3, 10);
  SimOptions o;
  o.jitter = 0.2;
  o.iterations = 20;
  o.seed = 7;
  auto a = simulate(d, o);
  auto b = simulate(d, o);
  o.seed = 8;
  auto c = simulate(d, o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_DOUBLE_EQ(a->tbt_mean, b->tbt_mean);
  EXPECT_NE(a->tbt_mean, c->tbt_mean);
  EXPECT_GT(a->tbt_p99, a->tbt_p50);
}

TEST(SimulatorTest, RejectsBadOptions) {
  Deployment d = fixed_times(1e-3, 1e-3, 0.2e-3, 2, 3, 10);
  SimOptions o;
  o.iterations = 0;
  EXPECT_FALSE(simulate(d, o).ok());
  o = SimOptions{};
  o.jitter = 1.5;
  EXPECT_FALSE(simulate(d, o).ok());
  d.micro_batches = 0;
  EXPECT_FALSE(simulate(d, SimOptions{}).ok());
}

TEST(SweepTest, HoldsBatchPerMicroBatchAndGrowsGlobalBatch) {
  Deployment d = fixed_times(1e-3, 1e-3, 0.2e-3, 2, 3, 6);
  SweepParameter p;
  int from = 0, to = 0;
  ASSERT_TRUE(parse_sweep("attention-nodes=1..4", &p, &from, &to).ok());
  EXPECT_EQ(p, SweepParameter::kAttentionNodes);
  auto rows = sweep(d, p, from, to, SimOptions{});
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 4u);
  for (const auto& row : *rows) {
    EXPECT_EQ(row.deployment.attention_nodes, row.value);
    EXPECT_EQ(row.deployment.batch_per_micro_batch, 8);
    EXPECT_EQ(row.deployment.global_batch(), 8 * 3 * row.value);
  }
  ASSERT_TRUE(parse_sweep("micro-batches=1..3", &p, &from, &to).ok());
  EXPECT_EQ(p, SweepParameter::kMicroBatches);
  EXPECT_FALSE(parse_sweep("layers=1..3", &p, &from, &to).ok());
  EXPECT_FALSE(parse_sweep("micro-batches=3..1", &p, &from, &to).ok());
  EXPECT_FALSE(parse_sweep("micro-batches=1..x", &p, &from, &to).ok());
  EXPECT_FALSE(parse_sweep("micro-batches", &p, &from, &to).ok());
}

TEST(ChartsTest, GanttAndSweepSvgsAreWritten) {
  Deployment d = fixed_times(1e-3, 1e-3, 0.2e-3, 2, 3, 4);
  SimOptions o;
  o.gantt_iterations = 1;
  auto r = simulate(d, o);
  ASSERT_TRUE(r.ok());
  // Attention, dispatch, expert and combine jobs of one iteration: 4 layers x 3 micro-batches.
  EXPECT_EQ(r->intervals.size(), 4u * 3 * (2 + 2 + 4 + 4));
  std::string path = ::testing::TempDir() + "/gantt_test.svg";
  ASSERT_TRUE(write_gantt_svg(d, *r, path).ok());
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  std::string svg = ss.str();
  EXPECT_NE(svg.find("attention 1"), std::string::npos);
  EXPECT_NE(svg.find("M2N from attn 0"), std::string::npos);
  EXPECT_NE(svg.find("N2M from expert 3"), std::string::npos);
  EXPECT_NE(svg.find("micro-batch 2"), std::string::npos);
  auto rows = sweep(d, SweepParameter::kMicroBatches, 1, 3, SimOptions{});
  ASSERT_TRUE(rows.ok());
  std::string plot = ::testing::TempDir() + "/sweep_test.svg";
  ASSERT_TRUE(write_sweep_svg(SweepParameter::kMicroBatches, *rows, plot).ok());
  std::remove(path.c_str());
  std::remove(plot.c_str());
}

}  // namespace
}  // namespace msinfer::planner
