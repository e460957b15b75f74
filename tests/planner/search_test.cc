#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "msinfer/planner/plan.h"
#include "test_fixtures.h"

namespace msinfer::planner {
namespace {

using testing::half_util;
using testing::ideal_gpu;
using testing::tiny_model;

SearchOptions tiny_options(double slo) {
  SearchOptions o;
  o.model = tiny_model();
  o.gpu_pairs = {{ideal_gpu(), ideal_gpu()}};
  o.slo = slo;
  o.seq_len = 100;
  o.max_micro_batches = 4;
  o.nic_util = half_util();
  return o;
}

bool feasible(const Deployment& d, double slo) {
  Prediction p = predict(d);
  return p.iteration <= slo && p.attention_memory_bytes <= p.attention_memory_capacity;
}

TEST(SearchTest, BalanceAndLargestBatchOnATinyCatalogue) {
  SearchOptions o = tiny_options(20e-6);
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_FALSE(r->plans.empty());
  const Plan& best = r->plans.front();
  int tp1_plans = 0;
  for (const Plan& p : r->plans) {
    const Deployment& d = p.deployment;
    if (d.shape.tp_attention == 1 && d.shape.tp_expert == 1) {
      // Balance k1 n_e / (k3 K) with the k's refitted around this plan's own
      // batch (n_e = E = 4 with one expert per node; 0 when the expert curve
      // is flat, k3 = 0, below the ridge of a node holding several experts).
      const StageModel& st = d.stage;
      EXPECT_NEAR(p.balance_attention_nodes,
                  st.k3 > 0 ? st.k1 * d.expert_nodes() / (st.k3 * 2) : 0.0, 1e-9);
      // The refit range is centred on the batch found (b/2 .. 2b), or the search's
      // first range when the refit left the batch where it was.
      EXPECT_LE(st.fit.attention_lo, static_cast<double>(d.batch_per_micro_batch));
      ++tp1_plans;
    }
    // The batch is the largest that meets SLO and memory for the shape.
    EXPECT_TRUE(feasible(d, o.slo));
    Deployment next = d;
    next.batch_per_micro_batch += 1;
    EXPECT_FALSE(feasible(next, o.slo));
    EXPECT_LE(p.predicted.objective(Objective::kCost), best.predicted.objective(Objective::kCost));
  }
  EXPECT_GE(tp1_plans, 4);
  // Predictions agree with the closed form evaluated by hand for the best plan.
  const Deployment& d = best.deployment;
  const double b_a = static_cast<double>(d.batch_per_micro_batch);
  const double b_e = b_a * d.attention_nodes * 2 / 4;
  StageTimes t{d.stage.t_attention(b_a), d.stage.t_expert(b_e), d.stage.t_comm(b_a, b_e)};
  EXPECT_DOUBLE_EQ(best.predicted.iteration, iteration_time(t, d.micro_batches, 2));
  EXPECT_DOUBLE_EQ(best.predicted.throughput,
                   b_a * d.micro_batches * d.attention_nodes / best.predicted.iteration);
  EXPECT_DOUBLE_EQ(best.predicted.per_cost, best.predicted.throughput / d.gpus());
}

TEST(SearchTest, BindingConstraintIsReported) {
  // Loose SLO: the KV cache (25.6 kB per request at 100 tokens) fills the 1 MB GPU first.
  auto loose = search_plans(tiny_options(1.0));
  ASSERT_TRUE(loose.ok());
  EXPECT_NE(loose->plans.front().binding.find("attention_memory"), std::string::npos);
  Json c = loose->plans.front().to_json()["constraints"];
  EXPECT_TRUE(c["attention_memory"]["binds"].get<bool>());
  EXPECT_TRUE(c["slo"]["holds"].get<bool>());
  // Tight SLO: time binds.
  auto tight = search_plans(tiny_options(10e-6));
  ASSERT_TRUE(tight.ok());
  EXPECT_EQ(tight->plans.front().binding, "slo");
}

TEST(SearchTest, NoFeasiblePlanIsAnError) {
  auto r = search_plans(tiny_options(1e-9));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("no deployment of tiny"), std::string::npos);
  SearchOptions o = tiny_options(1.0);
  o.gpu_pairs.clear();
  EXPECT_EQ(search_plans(o).status().code(), StatusCode::kInvalidArgument);
}

// Every plan's tp_attention is one the runtime can run: it divides the tiny
// model's 4 query heads, and splits (tp 2) or replicates (tp 4) its 2 KV heads.
TEST(SearchTest, EveryTpAttentionIsRunnable) {
  SearchOptions o = tiny_options(20e-6);
  o.gpu_pairs[0].first.gpus_per_node = 8;  // candidates 1, 2, 4, 8
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::set<int> seen;
  for (const Plan& p : r->plans) seen.insert(p.deployment.shape.tp_attention);
  EXPECT_EQ(seen, (std::set<int>{1, 2, 4}));  // never 8: 4 heads do not split 8 ways
}

TEST(SearchTest, MaxGpusCapsEveryPlan) {
  SearchOptions o = tiny_options(20e-6);
  o.max_gpus = 8;
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const Plan& p : r->plans) EXPECT_LE(p.deployment.gpus(), 8);
  EXPECT_NE(r->plans.front().binding.find("max_gpus"), std::string::npos);
  // Four GPUs: one expert per node would take all four, so the plans put two
  // or four experts on a node.
  o.max_gpus = 4;
  r = search_plans(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const Plan& p : r->plans) {
    EXPECT_LE(p.deployment.gpus(), 4);
    EXPECT_GT(p.deployment.experts_per_node(), 1);
  }
  o.max_gpus = 1;  // an attention node and an expert node take two at least
  EXPECT_FALSE(search_plans(o).ok());
}

TEST(SearchTest, ObjectivesPickTheExpectedGpuPair) {
  GpuSpec cheap = ideal_gpu("cheap", 1.0);
  GpuSpec pricey = ideal_gpu("pricey", 3.0);
  cheap.tdp_w = 300;
  pricey.tdp_w = 100;
  SearchOptions o = tiny_options(20e-6);
  o.gpu_pairs = {{cheap, cheap}, {cheap, pricey}, {pricey, cheap}, {pricey, pricey}};
  o.objective = Objective::kCost;
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->plans.front().deployment.shape.attention_gpu.name, "cheap");
  EXPECT_EQ(r->plans.front().deployment.shape.expert_gpu.name, "cheap");
  o.objective = Objective::kPower;
  r = search_plans(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->plans.front().deployment.shape.attention_gpu.name, "pricey");
  EXPECT_EQ(r->plans.front().deployment.shape.expert_gpu.name, "pricey");
  const Prediction& p = r->plans.front().predicted;
  EXPECT_DOUBLE_EQ(p.per_watt, p.throughput / (100.0 * r->plans.front().deployment.gpus()));
}

TEST(BaselineTest, ColocatedBaselinesByHand) {
  SearchOptions o = tiny_options(20e-6);
  auto bases = colocated_baselines(o, ideal_gpu());
  ASSERT_EQ(bases.size(), 2u);
  const Baseline& tp = bases[0];
  EXPECT_EQ(tp.name, "tensor-parallel");
  // Its iteration: L (T_attn(b) + AR + E T_gemm(b K / E) + AR) on the roofline curves.
  StageModel s = build_stage_model(o.model, {ideal_gpu(), ideal_gpu(), tp.tp, tp.tp}, 100,
                                   half_util());
  const double b = static_cast<double>(tp.batch);
  RooflineCurve a = s.attention_curve, e = s.expert_curve;
  a.serial_per_token -= allreduce_time(ideal_gpu(), tp.tp, 128, half_util());
  e.overlapped_per_token = 0;
  const double ar = hierarchical_allreduce_time(ideal_gpu(), tp.tp, 128 * b, half_util());
  EXPECT_NEAR(tp.iteration, 2 * (a.at(b) + 2 * ar + 4 * e.at(b * 2 / 4)), 1e-15);
  EXPECT_LE(tp.iteration, o.slo);
  EXPECT_DOUBLE_EQ(tp.per_gpu, b / tp.iteration / tp.tp);
  const Baseline& ep = bases[1];
  EXPECT_EQ(ep.name, "expert-parallel");
  EXPECT_EQ(4 % ep.ep, 0);
  EXPECT_EQ(ep.gpus, ep.ep * ep.tp);
  EXPECT_LE(ep.iteration, o.slo);
  // The search attaches them and the document reports the plan's gain over each.
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok());
  Json doc = plan_document(o, *r, 5);
  ASSERT_EQ(doc["baselines"].size(), 2u);
  for (const auto& b : doc["baselines"]) {
    EXPECT_NEAR(b["plan_gain"].get<double>(),
                doc["predicted"]["throughput_per_cost"].get<double>() /
                    b["throughput_per_cost"].get<double>(),
                1e-9);
  }
}

TEST(PlanDocumentTest, HasSpecFieldsAndRoundTrips) {
  SearchOptions o = tiny_options(20e-6);
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok());
  Json doc = plan_document(o, *r, 5);
  for (const char* k : {"tp_attention", "tp_expert", "attention_nodes", "micro_batches",
                        "global_batch", "attention_gpu", "expert_gpu"}) {
    EXPECT_TRUE(doc["plan"].contains(k)) << k;
  }
  for (const char* k : {"throughput_tokens_per_s", "throughput_per_gpu", "throughput_per_cost",
                        "tbt_ms", "t_attention_ms", "t_expert_ms", "t_comm_ms"}) {
    EXPECT_TRUE(doc["predicted"].contains(k)) << k;
  }
  for (const char* k : {"slo", "attention_memory", "expert_memory", "overlap", "max_gpus"}) {
    EXPECT_TRUE(doc["constraints"][k].contains("holds")) << k;
    EXPECT_TRUE(doc["constraints"][k].contains("binds")) << k;
  }
  EXPECT_LE(doc["alternatives"].size(), 5u);
  auto d = deployment_from_plan_document(doc, "plan.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const Deployment& best = r->plans.front().deployment;
  EXPECT_EQ(d->global_batch(), best.global_batch());
  EXPECT_EQ(d->attention_nodes, best.attention_nodes);
  EXPECT_NEAR(predict(*d).iteration, r->plans.front().predicted.iteration, 1e-12);

  Json bad = doc;
  bad["plan"]["global_batch"] = best.global_batch() + 1;
  auto e = deployment_from_plan_document(bad, "plan.json");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("global_batch"), std::string::npos);
  bad = doc;
  bad.erase("stage_model");
  e = deployment_from_plan_document(bad, "plan.json");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("plan.json: field 'stage_model' is missing"),
            std::string::npos);
}

TEST(SensitivityTest, ReportsEveryPerturbation) {
  SearchOptions o = tiny_options(20e-6);
  auto r = search_plans(o);
  ASSERT_TRUE(r.ok());
  auto rows = sensitivity(o, r->plans.front());
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 2u + 4);  // one price and k1, k3, each -20% and +20%
  for (const auto& row : *rows) {
    EXPECT_GE(row.original_loss, -1e-12) << row.parameter;
    if (!row.plan_changed) {
      EXPECT_NEAR(row.original_loss, 0.0, 1e-12) << row.parameter;
    }
  }
  // One GPU type: its price scales every plan's cost alike, so the choice stands.
  EXPECT_EQ((*rows)[0].parameter, "price:T1");
  EXPECT_FALSE((*rows)[0].plan_changed);
  EXPECT_FALSE((*rows)[1].plan_changed);

  o.gpu_pairs = {{ideal_gpu("a", 1.0), ideal_gpu("b", 1.1)}};
  r = search_plans(o);
  ASSERT_TRUE(r.ok());
  rows = sensitivity(o, r->plans.front());
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->size(), 2u * 2 + 4);
}

}  // namespace
}  // namespace msinfer::planner

namespace msinfer::planner {
namespace {

TEST(BaselineTest, HierarchicalAllReduceByHand) {
  // 4 GPUs per node, link 1e10 B/s, NIC 1e9 B/s at 0.5. tp 8 = 2 nodes, 8000 B per GPU:
  // inside the node 2 * 3/4 * 8000 B at 1e10 = 1.2e-6 s; across nodes each GPU all-reduces
  // its 2000 B shard with one peer: 2 * 1/2 * 2000 B at 0.5e9 = 4e-6 s.
  EXPECT_NEAR(hierarchical_allreduce_time(testing::ideal_gpu(), 8, 8000, testing::half_util()),
              1.2e-6 + 4e-6, 1e-18);
  EXPECT_NEAR(hierarchical_allreduce_time(testing::ideal_gpu(), 4, 8000, testing::half_util()),
              1.2e-6, 1e-18);
  EXPECT_EQ(hierarchical_allreduce_time(testing::ideal_gpu(), 1, 8000, testing::half_util()), 0);
}

TEST(BaselineTest, TensorParallelChargesOneWholeBatchAllReducePerLayer) {
  SearchOptions o;
  o.model = testing::tiny_model();
  o.seq_len = 100;
  o.slo = 1e-4;
  o.nic_util = testing::half_util();
  GpuSpec g = testing::ideal_gpu();
  g.memory_bytes = 1e9;
  auto bases = colocated_baselines(o, g);
  ASSERT_FALSE(bases.empty());
  const Baseline& tp = bases.front();
  ASSERT_EQ(tp.name, "tensor-parallel");
  EXPECT_NE(tp.description.find("ideal co-located bound"), std::string::npos);
  // Recompute its iteration by hand from the roofline curves at its tp and batch.
  StageModel s = build_stage_model(o.model, {g, g, tp.tp, tp.tp}, 100, o.nic_util);
  const double b = static_cast<double>(tp.batch);
  RooflineCurve a = s.attention_curve, e = s.expert_curve;
  a.serial_per_token -= allreduce_time(g, tp.tp, 128, o.nic_util);
  e.overlapped_per_token = 0;
  const double ar = hierarchical_allreduce_time(g, tp.tp, 128 * b, o.nic_util);
  EXPECT_NEAR(tp.iteration, 2 * (a.at(b) + ar + 4 * e.at(b * 2 / 4) + ar), 1e-15);
  EXPECT_LE(tp.iteration, o.slo);
}

TEST(WorkloadTest, MeanDecodeContextIsInputPlusHalfTheOutput) {
  // A request decoding token j (1..O) reads I + j tokens; the mean over j and over
  // requests at uniformly random points of their decode is I + O/2 (to within 1/2).
  auto w = workload_preset("paper-trace");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_DOUBLE_EQ(w->input_len, 571);
  EXPECT_DOUBLE_EQ(w->output_len, 159);
  EXPECT_DOUBLE_EQ(w->mean_decode_context(), 571 + 159 / 2.0);  // 650.5
  Workload custom{"custom", 1000, 0};
  EXPECT_DOUBLE_EQ(custom.mean_decode_context(), 1000);
  auto bad = workload_preset("sharegpt");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("paper-trace"), std::string::npos);
}

}  // namespace
}  // namespace msinfer::planner
