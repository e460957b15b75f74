#include "msinfer/bench/profile.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "msinfer/bench/m2n_bench.h"
#include "msinfer/bench/machine.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/model/make_model.h"
#include "msinfer/planner/cpu_plan.h"
#include "msinfer/planner/perf_model.h"

namespace msinfer::bench {
namespace {

// The AMX tiles' peak is probed at the amx level and only there (the
// kernels bench's roofline for bf16 GEMMs at amx; a TDPBF16PS outside it
// would fault on a CPU without AMX). No figure is asserted, only that the
// probe ran and produced a positive rate.
TEST(MachineTest, TheAmxPeakIsProbedAtTheAmxLevelOnly) {
  using kernels::cpu::IsaLevel;
  const IsaLevel saved = kernels::cpu::active_isa();
  int checked = 0;
  for (IsaLevel level : {IsaLevel::kAvx512Bf16, IsaLevel::kAmx}) {
    if (!kernels::cpu::force_isa(level).ok()) continue;  // not on this CPU
    const MachineLimits m = measure_machine(/*quick=*/true);
    if (level == IsaLevel::kAmx) {
      EXPECT_GT(m.amx_flops_1t, 0);
      EXPECT_GT(m.amx_flops, 0);
    } else {
      EXPECT_EQ(m.amx_flops, 0);
    }
    EXPECT_GT(m.bf16_flops, 0);
    ++checked;
  }
  ASSERT_TRUE(kernels::cpu::force_isa(saved).ok());
  if (checked == 0) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
}

TEST(FitLineTest, HandComputed) {
  // y = 2x + 1 exactly.
  LinearFit f = fit_line({{1, 3}, {2, 5}, {4, 9}});
  EXPECT_NEAR(f.slope, 2, 1e-12);
  EXPECT_NEAR(f.intercept, 1, 1e-12);
  EXPECT_NEAR(f.r2, 1, 1e-12);
  EXPECT_NEAR(f.max_rel_error, 0, 1e-12);
  // (0,0), (1,1), (2,1): slope 0.5, intercept 1/6; residuals -1/6, 1/3, -1/6.
  f = fit_line({{0, 1e-9}, {1, 1}, {2, 1}});
  EXPECT_NEAR(f.slope, 0.5, 1e-6);
  EXPECT_NEAR(f.intercept, 1.0 / 6, 1e-6);
  EXPECT_NEAR(f.r2, 1 - (1.0 / 36 + 1.0 / 9 + 1.0 / 36) / (2.0 / 3), 1e-6);
  // Points whose best line has a negative intercept: through the origin instead.
  f = fit_line({{1, 1}, {2, 3}, {3, 5}});  // y = 2x - 1
  EXPECT_DOUBLE_EQ(f.intercept, 0);
  EXPECT_NEAR(f.slope, (1 + 6 + 15) / 14.0, 1e-12);
  // Decreasing points: a flat line at the mean.
  f = fit_line({{1, 3}, {2, 2}, {3, 1}});
  EXPECT_DOUBLE_EQ(f.slope, 0);
  EXPECT_NEAR(f.intercept, 2, 1e-12);
}

// A preset's model in a temporary directory, removed with it (also when a
// test fails).
struct TempModel {
  explicit TempModel(const std::string& preset)
      : dir(::testing::TempDir() + "/msinfer_profile_" + preset + "_" + std::to_string(getpid())) {
    model::MakeModelOptions mo;
    mo.preset = preset;
    mo.out_dir = dir;
    made = model::make_model(mo);
  }
  ~TempModel() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
  Status made;
};

TEST(ProfileTest, WritesAFileThePlannerReads) {
  const TempModel m("tiny-mixtral");
  ASSERT_TRUE(m.made.ok()) << m.made.to_string();
  ProfileOptions o;
  o.model_dir = m.dir;
  o.seq_len = 64;
  o.attention_batches = {1, 4, 16};
  o.expert_batches = {1, 8, 64};
  o.kv_cache_mb = 16;
  o.min_seconds = 0.01;
  auto r = profile_model(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->attention.size(), 3u);
  ASSERT_EQ(r->attention_next.size(), 3u);  // the same batches, a later micro-batch
  EXPECT_EQ(r->attention_next[1].first, 4.0);
  ASSERT_EQ(r->expert.size(), 3u);
  ASSERT_EQ(r->expert_next.size(), 3u);  // the same batches, a later micro-batch
  // Timings are not asserted; the fit is checked against the points it came from.
  EXPECT_NEAR(r->attention_fit.slope,
              fit_line(r->attention).slope, 1e-15);
  auto p = planner::parse_profile(r->to_json(o), "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_DOUBLE_EQ(*p->k1, r->attention_fit.slope);
  EXPECT_DOUBLE_EQ(*p->k4, r->expert_fit.intercept);
  // The group share is a measurement of this process's threads: some CPU,
  // never more than a core each; the CPU planner reads it back.
  EXPECT_GE(r->group_threads, 1);
  EXPECT_GT(r->group_cores, 0);
  EXPECT_LE(r->group_cores, r->group_threads);
  auto cp = planner::parse_cpu_profile(r->to_json(o), "profile.json");
  ASSERT_TRUE(cp.ok()) << cp.status().to_string();
  EXPECT_DOUBLE_EQ(cp->group_cores, r->group_cores);
  ASSERT_EQ(cp->expert_next_points.size(), 3u);
  EXPECT_NEAR(cp->expert_next_points[2].second, r->expert_next[2].second, 1e-12);
  ASSERT_EQ(cp->attention_next_points.size(), 3u);
  EXPECT_NEAR(cp->attention_next_points[2].second, r->attention_next[2].second, 1e-12);
  // Too small a KV budget is refused, not crashed on.
  o.kv_cache_mb = 0;
  EXPECT_EQ(profile_model(o).status().code(), StatusCode::kResourceExhausted);
}

// A model whose first layer is dense (DeepSeek's first_k_dense_replace):
// T_a and T_e are timed on its MoE layers only (the expert loop aborted on
// layer 0's missing experts before).
TEST(ProfileTest, ADenseFirstLayerIsSkipped) {
  const TempModel m("tiny-deepseek-v3");
  ASSERT_TRUE(m.made.ok()) << m.made.to_string();
  ProfileOptions o;
  o.model_dir = m.dir;
  o.seq_len = 16;
  o.attention_batches = {1, 4};
  o.expert_batches = {1, 8};
  o.kv_cache_mb = 16;
  o.min_seconds = 0.005;
  auto r = profile_model(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->attention.size(), 2u);
  EXPECT_EQ(r->expert.size(), 2u);
}

// The transfer model fitted to M2N rows gives back each measured one-way time
// through the planner's own formula, and keeps the profile's k's.
TEST(TransferModelTest, ReproducesTheMeasuredOneWayTimes) {
  std::vector<M2NBenchRow> rows;
  const std::vector<std::pair<int64_t, double>> measured = {{2048, 6.0}, {32768, 14.0}, {262144, 60.0}};
  for (auto [size, p50_us] : measured) {
    M2NBenchRow r;
    r.name = "msinfer";
    r.provider = "shm";
    r.size = size;
    r.senders = 2;
    r.receivers = 2;
    r.p50_us = p50_us;
    r.gbps = 2.0 * size / (p50_us * 1e-6) / 1e9;  // a sender sends `size` to each receiver
    rows.push_back(r);
  }
  M2NBenchRow mpi = rows.back();
  mpi.name = "mpi-p2p";
  mpi.gbps = 1000;  // other implementations' rows are ignored
  rows.push_back(mpi);
  auto j = add_transfer_model(Json{{"k1_ms_per_token", 0.01}}, rows);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ((*j)["k1_ms_per_token"].get<double>(), 0.01);
  auto p = planner::parse_profile(*j, "test");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_TRUE(p->nic_bandwidth && p->nic_util);
  planner::StageModel sm;
  sm.dispatch_bytes_per_token = 1;  // so b_a counts bytes
  sm.attention_nic_bandwidth = *p->nic_bandwidth;
  sm.nic_util = *p->nic_util;
  for (auto [size, p50_us] : measured) {
    EXPECT_NEAR(sm.t_comm_attention_side(2.0 * size) * 1e6, p50_us, p50_us * 1e-9) << size;
  }
  EXPECT_FALSE(add_transfer_model(Json::object(), {mpi}).ok());
  EXPECT_FALSE(add_transfer_model(Json::array(), rows).ok());
}

}  // namespace
}  // namespace msinfer::bench
