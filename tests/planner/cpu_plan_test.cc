// The CPU deployment model of docs/PLANNER.md section 8 on a synthetic profile.
#include "msinfer/planner/cpu_plan.h"

#include <gtest/gtest.h>

namespace msinfer::planner {
namespace {

CpuSearchOptions options() {
  CpuSearchOptions o;
  o.model.name = "test";
  o.model.layers = o.model.moe_layers = 4;
  o.model.hidden = 256;
  o.model.expert_ffn = 512;
  o.model.experts = 8;
  o.model.top_k = 2;
  o.model.heads = 4;
  o.model.kv_heads = 2;
  o.model.head_dim = 64;
  o.model.vocab = 1000;
  CpuProfile& p = o.profile;
  p.k1 = 0.1e-3;  // s per token
  p.k2 = 0.5e-3;
  p.k3 = 0.02e-3;
  p.k4 = 1e-3;
  p.head_per_token = 0.01e-3;
  p.head = 2e-3;
  p.has_head = true;
  p.threads = 1;
  p.nic_bandwidth = 10e9;
  o.cores = 2;
  o.memory_bytes = 16e9;
  o.slo = 1.0;
  o.workload = Workload{"custom", 32, 32};
  o.local_fit = false;
  return o;
}

TEST(CpuPlan, StepIsTheLayersPipelinePlusTheHead) {
  const CpuSearchOptions o = options();
  CpuDeployment d{1, 1, 2, 1, 1, 1, 4};  // 1 + 1 workers, m 2, b_a 4
  const CpuPrediction p = predict_cpu(o, d);
  EXPECT_NEAR(p.t_attention, 0.1e-3 * 4 + 0.5e-3, 1e-12);
  // 8 experts on one worker, 4 x 2 / 8 = 1 row each: 8 (k3 + k4).
  EXPECT_DOUBLE_EQ(p.rows_per_expert, 1.0);
  EXPECT_NEAR(p.t_expert, 8 * (0.02e-3 + 1e-3), 1e-12);
  EXPECT_GT(p.t_comm, 0);
  const StageTimes t{p.t_attention, p.t_expert, p.t_comm};
  EXPECT_NEAR(p.layers_time, iteration_time(t, 2, 4), 1e-12);
  EXPECT_NEAR(p.t_head, 0.01e-3 * 8 + 2e-3, 1e-12);
  EXPECT_NEAR(p.tbt, p.layers_time + p.t_head, 1e-12);
  EXPECT_NEAR(p.throughput, 8 / p.tbt, 1e-9);
  EXPECT_FALSE(p.shares_cores);
}

TEST(CpuPlan, ThreadsScaleTheProfileAndSharedCoresBoundTheStep) {
  CpuSearchOptions o = options();
  o.cores = 4;
  CpuDeployment one{1, 1, 1, 1, 1, 1, 4}, two = one;
  two.expert_threads = 2;
  EXPECT_NEAR(predict_cpu(o, two).t_expert, predict_cpu(o, one).t_expert / 2, 1e-12);
  // On 2 cores the spinning attention worker's thread is the third: every
  // runnable thread gets 2/3 of a core.
  o.cores = 2;
  EXPECT_NEAR(predict_cpu(o, two).t_expert, predict_cpu(o, one).t_expert / 2 * 1.5, 1e-12);
  // Four one-thread expert workers and two attention workers on one core:
  // the cores' work, not the pipeline, sets the step.
  o.cores = 1;
  CpuDeployment shared{2, 4, 2, 1, 1, 1, 4};
  const CpuPrediction p = predict_cpu(o, shared);
  EXPECT_TRUE(p.shares_cores);
  // m = 2: both sides compute at once, 6 threads on the core; the head is
  // the 2 attention workers' alone.
  EXPECT_DOUBLE_EQ(p.share_factor_attention, 6);
  EXPECT_DOUBLE_EQ(p.share_factor_expert, 6);
  EXPECT_DOUBLE_EQ(p.share_factor_head, 2);
  EXPECT_NEAR(p.cpu_seconds,
              2 * (4 * 2 * p.t_attention / 6 + p.t_head / 2) + 4 * (4 * 2 * p.t_expert) / 6, 1e-12);
  EXPECT_GE(p.tbt, p.cpu_bound);
  EXPECT_GE(p.tbt, p.layers_time + p.t_head);
}

TEST(CpuPlan, AProfileThatSharedItsCoresScalesToTheDeploymentsShare) {
  CpuSearchOptions o = options();
  const CpuDeployment d{1, 1, 1, 1, 1, 1, 4};
  const CpuPrediction alone = predict_cpu(o, d);
  // The one-thread profile's group got half a core. While the expert worker
  // computes, the attention worker spins (2 processes on 2 cores): they
  // split that half core. The attention stage and the head have it alone
  // (the idle expert worker sleeps).
  o.profile.cpu_share = 0.5;
  const CpuPrediction shared = predict_cpu(o, d);
  EXPECT_DOUBLE_EQ(shared.group_cores, 0.5);
  EXPECT_DOUBLE_EQ(shared.share_factor_expert, 2);
  EXPECT_DOUBLE_EQ(shared.share_factor_attention, 1);
  EXPECT_DOUBLE_EQ(shared.share_factor_head, 1);
  EXPECT_NEAR(shared.t_expert, alone.t_expert * 2, 1e-12);
  EXPECT_NEAR(shared.t_head, alone.t_head, 1e-12);
  // The CPU the workers compute is the same work: on half a core it takes
  // twice the time it takes on a core.
  EXPECT_NEAR(shared.cpu_seconds, alone.cpu_seconds * 0.5, 1e-12);
  EXPECT_NEAR(shared.cpu_bound, alone.cpu_seconds, 1e-12);
  // With m = 2 both sides compute at once: every stage splits the group.
  CpuDeployment two = d;
  two.micro_batches = 2;
  EXPECT_DOUBLE_EQ(predict_cpu(o, two).share_factor_attention, 2);
  // Three processes on two cores: the waiting side yields, the side that
  // computes has the group's half core to itself.
  const CpuDeployment three{2, 1, 1, 1, 1, 1, 4};
  EXPECT_DOUBLE_EQ(predict_cpu(o, three).share_factor_expert, 1);
  EXPECT_DOUBLE_EQ(predict_cpu(o, three).share_factor_attention, 2);
}

TEST(CpuPlan, AMeasuredGroupShareGivesEachStageItsRunnableThreadsShare) {
  CpuSearchOptions o = options();
  const CpuDeployment d{1, 1, 1, 1, 1, 1, 4};
  // An idle machine: the one-thread profile got 99% of its core, two busy
  // threads 1.98 cores. While the expert worker computes the attention
  // worker spins: two runnable threads, a core each. Without the second
  // point the group was the profile's 0.99 cores, so the expert stage ran
  // at half speed (the discontinuity of section 8).
  o.profile.cpu_share = 0.99;
  EXPECT_DOUBLE_EQ(predict_cpu(o, d).share_factor_expert, 2);
  o.profile.group_threads = 2;
  o.profile.group_cores = 1.98;
  const CpuPrediction idle = predict_cpu(o, d);
  EXPECT_DOUBLE_EQ(idle.share_factor_expert, 1);
  EXPECT_DOUBLE_EQ(idle.share_factor_attention, 1);
  EXPECT_DOUBLE_EQ(idle.group_cores, 1.98);
  // A loaded machine: one thread got half a core, two together 0.8 cores.
  o.profile.cpu_share = 0.5;
  o.profile.group_cores = 0.8;
  const CpuPrediction loaded = predict_cpu(o, d);
  EXPECT_DOUBLE_EQ(loaded.share_factor_expert, 0.5 / 0.4);  // 2 threads: 0.4 each
  EXPECT_DOUBLE_EQ(loaded.share_factor_attention, 1);       // 1 thread: the profile's
  // Three threads runnable at once (2 attention workers and the expert
  // worker, m = 2) on two cores: the two-thread group's 0.8 cores over three.
  const CpuDeployment three{2, 1, 2, 1, 1, 1, 4};
  EXPECT_DOUBLE_EQ(predict_cpu(o, three).share_factor_attention, 0.5 / (0.8 / 3));
  EXPECT_NEAR(predict_cpu(o, three).cpu_bound, predict_cpu(o, three).cpu_seconds / 0.8, 1e-12);
}

TEST(CpuPlan, DenseLayersAreTheAttentionWorkersWithTheDenseFfn) {
  CpuSearchOptions o = options();
  const CpuDeployment d{1, 1, 1, 1, 1, 1, 4};
  const CpuPrediction all_moe = predict_cpu(o, d);
  EXPECT_DOUBLE_EQ(all_moe.t_dense_layer, 0);
  // DeepSeek's shape: the first of 4 layers dense (FFN 1024 wide), shared
  // experts 256 wide in the MoE layers (in T_a already), experts 512 wide.
  o.model.moe_layers = 3;
  o.model.dense_ffn = 1024;
  o.model.shared_expert_ffn = 256;
  const CpuPrediction p = predict_cpu(o, d);
  const double ffn = o.profile.k3 * 4 + o.profile.k4;  // the expert FFN at b_a = 4 rows
  EXPECT_NEAR(p.t_dense_layer, all_moe.t_attention + (1024.0 - 256) / 512 * ffn, 1e-12);
  // Its time is spread over the 3 MoE layers the pipeline runs; the expert
  // side has 3 layers, not 4.
  EXPECT_NEAR(p.t_attention, all_moe.t_attention + p.t_dense_layer / 3, 1e-12);
  StageTimes t;
  t.t_a = p.t_attention;
  t.t_e = p.t_expert;
  t.t_c = p.t_comm;
  EXPECT_NEAR(p.layers_time, iteration_time(t, 1, 3), 1e-12);
  // The dense FFN runs on the attention worker: its threads scale it, the
  // expert worker's do not.
  CpuDeployment two = d;
  two.attention_threads = 2;
  EXPECT_NEAR(predict_cpu(o, two).t_dense_layer, p.t_dense_layer / 2, 1e-12);
  two = d;
  two.expert_threads = 2;
  EXPECT_NEAR(predict_cpu(o, two).t_dense_layer, p.t_dense_layer, 1e-12);
}

TEST(CpuPlan, LaterMicroBatchesUseTheProfilesNextMicroBatchExpertTimes) {
  CpuSearchOptions o = options();
  o.local_fit = true;
  // First-pass points on the line k3 b + k4 and second-pass points at 60%.
  for (double b : {1.0, 2.0, 4.0, 8.0}) {
    o.profile.expert_points.emplace_back(b, o.profile.k3 * b + o.profile.k4);
    o.profile.expert_next_points.emplace_back(b, 0.6 * (o.profile.k3 * b + o.profile.k4));
  }
  CpuDeployment d{1, 1, 1, 1, 1, 1, 4};
  const CpuPrediction one = predict_cpu(o, d);
  EXPECT_DOUBLE_EQ(one.t_expert_next, one.t_expert);  // m = 1: no later micro-batch
  d.micro_batches = 3;
  const CpuPrediction three = predict_cpu(o, d);
  EXPECT_NEAR(three.t_expert_next, 0.6 * three.t_expert_first, 1e-12);
  EXPECT_NEAR(three.t_expert, (1 + 2 * 0.6) / 3 * three.t_expert_first, 1e-12);
  // Without the points (older profiles) every micro-batch is a first one.
  o.profile.expert_next_points.clear();
  EXPECT_DOUBLE_EQ(predict_cpu(o, d).t_expert, predict_cpu(o, d).t_expert_first);
}

TEST(CpuPlan, LaterMicroBatchesUseTheProfilesNextMicroBatchAttentionTimes) {
  CpuSearchOptions o = options();
  o.local_fit = true;
  o.profile.k2 = 20e-3;  // attention-bound: T_a 20.4 ms, T_e 8 x 1.02 ms
  // First-micro-batch points on the line k1 b + k2, later ones at 70%.
  for (double b : {1.0, 2.0, 4.0, 8.0}) {
    o.profile.attention_points.emplace_back(b, o.profile.k1 * b + o.profile.k2);
    o.profile.attention_next_points.emplace_back(b, 0.7 * (o.profile.k1 * b + o.profile.k2));
  }
  CpuDeployment d{1, 1, 1, 1, 1, 1, 4};
  const CpuPrediction one = predict_cpu(o, d);
  EXPECT_DOUBLE_EQ(one.t_attention_next, one.t_attention);  // m = 1: no later micro-batch
  EXPECT_DOUBLE_EQ(one.t_attention_first, one.t_attention);
  d.micro_batches = 3;
  const CpuPrediction three = predict_cpu(o, d);
  EXPECT_NEAR(three.t_attention_first, o.profile.k1 * 4 + o.profile.k2, 1e-12);
  EXPECT_NEAR(three.t_attention_next, 0.7 * three.t_attention_first, 1e-12);
  EXPECT_NEAR(three.t_attention, (1 + 2 * 0.7) / 3 * three.t_attention_first, 1e-12);
  // The shorter stage shortens the step: the layers are attention-bound here.
  CpuSearchOptions first_only = o;
  first_only.profile.attention_next_points.clear();
  EXPECT_LT(three.layers_time, predict_cpu(first_only, d).layers_time);
  // Without the points (older profiles) or with --global-fit every
  // micro-batch is a first one.
  o.profile.attention_next_points.clear();
  EXPECT_DOUBLE_EQ(predict_cpu(o, d).t_attention, predict_cpu(o, d).t_attention_first);
  o.profile.attention_next_points.emplace_back(1.0, 0.0);
  o.profile.attention_next_points.emplace_back(8.0, 0.0);
  o.local_fit = false;
  EXPECT_DOUBLE_EQ(predict_cpu(o, d).t_attention, predict_cpu(o, d).t_attention_first);
}

TEST(CpuPlan, AProfilesGroupShareIsReadAndChecked) {
  Json j = {{"k1_ms_per_token", 0.1}, {"k2_ms", 0.5},       {"k3_ms_per_token", 0.02},
            {"k4_ms", 1.0},           {"threads", 1},       {"cores", 2},
            {"cpu_share", 0.9},       {"group_threads", 2}, {"group_cores", 1.7}};
  auto p = parse_cpu_profile(j, "p.json");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->group_threads, 2);
  EXPECT_DOUBLE_EQ(p->group_cores, 1.7);
  j["group_cores"] = 2.5;  // more cores than threads
  auto bad = parse_cpu_profile(j, "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("group_cores"), std::string::npos);
  j["group_cores"] = 0;  // threads without cores
  EXPECT_FALSE(parse_cpu_profile(j, "p.json").ok());
  j.erase("group_cores");
  j.erase("group_threads");  // profiles before the measurement: none
  p = parse_cpu_profile(j, "p.json");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->group_threads, 0);
}

TEST(CpuPlan, LocalFitIsTheLineThroughTheBracketingPoints) {
  const std::vector<std::pair<double, double>> pts{{1, 1.0}, {2, 1.5}, {4, 3.5}, {8, 4.0}};
  const LinearFit g{9, 9};
  // (2, 1.5)-(4, 3.5) crosses zero at b = 0.5: kept >= 0, through the origin.
  LinearFit f = local_fit(pts, 3, g);
  EXPECT_DOUBLE_EQ(f.slope, 3.5 / 4);
  EXPECT_DOUBLE_EQ(f.intercept, 0.0);
  f = local_fit(pts, 1.5, g);
  EXPECT_DOUBLE_EQ(f.slope, 0.5);
  EXPECT_DOUBLE_EQ(f.intercept, 0.5);
  f = local_fit(pts, 100, g);  // beyond the points: the last segment
  EXPECT_DOUBLE_EQ(f.slope, 0.125);
  EXPECT_DOUBLE_EQ(local_fit({{1, 1.0}}, 2, g).slope, 9);
}

TEST(CpuPlan, SearchKeepsEveryPlanWithinCoresMemoryKvAndSlo) {
  CpuSearchOptions o = options();
  o.slo = 0.2;
  o.max_batch = 64;
  o.kv_cache_mb = 4;
  auto plans = search_cpu_plans(o);
  ASSERT_TRUE(plans.ok()) << plans.status().to_string();
  ASSERT_FALSE(plans->empty());
  for (const CpuPlan& p : *plans) {
    const CpuDeployment& d = p.deployment;
    EXPECT_TRUE(d.threads() <= o.cores || (d.attention_threads == 1 && d.expert_threads == 1));
    EXPECT_TRUE(check_cpu_deployment(o, d, p.predicted).empty());
    EXPECT_LE(p.predicted.tbt, o.slo);
    EXPECT_LE(p.predicted.kv_bytes_per_worker, 4 << 20);
    EXPECT_LE(d.global_batch(), 64);
  }
  for (size_t i = 1; i < plans->size(); ++i) {
    EXPECT_GE((*plans)[i - 1].predicted.throughput, (*plans)[i].predicted.throughput);
  }
  // A fixed shape is honoured, its batch searched.
  o.attention_workers = 2;
  o.expert_workers = 1;
  o.micro_batches = 2;
  auto fixed = search_cpu_plans(o);
  ASSERT_TRUE(fixed.ok());
  for (const CpuPlan& p : *fixed) {
    EXPECT_EQ(p.deployment.attention_workers, 2);
    EXPECT_EQ(p.deployment.expert_workers, 1);
    EXPECT_EQ(p.deployment.micro_batches, 2);
  }
  // Nothing fits an SLO below one layer's time.
  o.slo = 1e-6;
  EXPECT_FALSE(search_cpu_plans(o).ok());
}

TEST(CpuPlan, DocumentRoundTripsAndIsChecked) {
  CpuSearchOptions o = options();
  o.max_batch = 16;
  auto plans = search_cpu_plans(o);
  ASSERT_TRUE(plans.ok());
  const Json doc = cpu_plan_document(o, *plans, 3);
  EXPECT_TRUE(is_cpu_plan_document(doc));
  for (const char* k : {"throughput_tokens_per_s", "tbt_ms", "t_attention_ms", "t_expert_ms",
                        "t_comm_ms", "t_head_ms"}) {
    EXPECT_TRUE(doc["predicted"].contains(k)) << k;
  }
  auto d = cpu_deployment_from_plan_document(doc, "plan.json", o.model);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->global_batch(), plans->front().deployment.global_batch());
  Json bad = doc;
  bad["plan"]["global_batch"] = d->global_batch() + 1;
  EXPECT_FALSE(cpu_deployment_from_plan_document(bad, "plan.json", o.model).ok());
  bad = doc;
  bad["plan"]["expert_workers"] = 3;
  auto e = cpu_deployment_from_plan_document(bad, "plan.json", o.model);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("expert_workers"), std::string::npos);
}

}  // namespace
}  // namespace msinfer::planner
