#include "msinfer/core/stats.h"

#include <gtest/gtest.h>

namespace msinfer {
namespace {

TEST(StatsTest, NearestRankPercentile) {
  EXPECT_EQ(percentile({}, 0.5), 0);
  EXPECT_EQ(percentile({7}, 0.99), 7);
  // 1..10: p50 is the 5th value, p99 the 10th, p10 the 1st.
  std::vector<double> v = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_EQ(percentile(v, 0.5), 5);
  EXPECT_EQ(percentile(v, 0.99), 10);
  EXPECT_EQ(percentile(v, 0.1), 1);
  EXPECT_EQ(percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(mean(v), 5.5);
  EXPECT_EQ(mean({}), 0);
}

}  // namespace
}  // namespace msinfer
