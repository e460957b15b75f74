#include "msinfer/bench/profile.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "msinfer/model/make_model.h"
#include "msinfer/planner/perf_model.h"

namespace msinfer::bench {
namespace {

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

TEST(ProfileTest, WritesAFileThePlannerReads) {
  const std::string dir = ::testing::TempDir() + "/msinfer_profile_model_" + std::to_string(getpid());
  model::MakeModelOptions mo;
  mo.preset = "tiny-mixtral";
  mo.out_dir = dir;
  ASSERT_TRUE(model::make_model(mo).ok());
  ProfileOptions o;
  o.model_dir = dir;
  o.seq_len = 64;
  o.attention_batches = {1, 4, 16};
  o.expert_batches = {1, 8, 64};
  o.kv_cache_mb = 16;
  o.min_seconds = 0.01;
  auto r = profile_model(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->attention.size(), 3u);
  ASSERT_EQ(r->expert.size(), 3u);
  // Timings are not asserted; the fit is checked against the points it came from.
  EXPECT_NEAR(r->attention_fit.slope,
              fit_line(r->attention).slope, 1e-15);
  auto p = planner::parse_profile(r->to_json(o), "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_DOUBLE_EQ(*p->k1, r->attention_fit.slope);
  EXPECT_DOUBLE_EQ(*p->k4, r->expert_fit.intercept);
  // Too small a KV budget is refused, not crashed on.
  o.kv_cache_mb = 0;
  EXPECT_EQ(profile_model(o).status().code(), StatusCode::kResourceExhausted);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace msinfer::bench
