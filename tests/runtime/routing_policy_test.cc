// The router's choice of attention replica (routing_policy.h, issue 50):
// cache-aware takes the longest cached prefix within the load slack,
// least-loaded and round-robin as their names say, dead replicas never.
#include "msinfer/runtime/routing_policy.h"

#include <gtest/gtest.h>

namespace msinfer::runtime {
namespace {

std::vector<ReplicaView> views(std::vector<int64_t> loads, std::vector<int64_t> cached) {
  std::vector<ReplicaView> v;
  for (size_t i = 0; i < loads.size(); ++i) v.push_back({true, loads[i], cached[i]});
  return v;
}

TEST(RoutingPolicyTest, CacheAwareTakesTheLongestMatchWithinTheSlack) {
  int rr = 0;
  // Replica 1 holds 3 blocks, 100 tokens busier than replica 0.
  auto v = views({500, 600, 900}, {0, 3, 5});
  EXPECT_EQ(choose_attention_replica(RoutingPolicy::kCacheAware, v, 2048, &rr), 2);
  EXPECT_EQ(choose_attention_replica(RoutingPolicy::kCacheAware, v, 400, &rr), 2);  // 900 is within
  EXPECT_EQ(choose_attention_replica(RoutingPolicy::kCacheAware, v, 399, &rr), 1);
  // The load bound overrides the match: beyond the slack, the least loaded.
  EXPECT_EQ(choose_attention_replica(RoutingPolicy::kCacheAware, v, 99, &rr), 0);
  EXPECT_EQ(choose_attention_replica(RoutingPolicy::kCacheAware, v, 100, &rr), 1);
  // No match anywhere: least-loaded; equal matches: the less loaded.
  EXPECT_EQ(
      choose_attention_replica(RoutingPolicy::kCacheAware, views({5, 3, 4}, {0, 0, 0}), 2048, &rr),
      1);
  EXPECT_EQ(
      choose_attention_replica(RoutingPolicy::kCacheAware, views({5, 3, 4}, {2, 1, 2}), 2048, &rr),
      2);
  // Least-loaded ignores the match.
  EXPECT_EQ(choose_attention_replica(RoutingPolicy::kLeastLoaded, v, 2048, &rr), 0);
  EXPECT_EQ(rr, 0);  // only round-robin moves its cursor
}

TEST(RoutingPolicyTest, DeadReplicasAreNeverChosen) {
  int rr = 0;
  auto v = views({500, 0, 900}, {0, 3, 5});
  v[2].live = false;
  v[1].live = false;
  for (RoutingPolicy p :
       {RoutingPolicy::kCacheAware, RoutingPolicy::kLeastLoaded, RoutingPolicy::kRoundRobin}) {
    EXPECT_EQ(choose_attention_replica(p, v, 2048, &rr), 0) << routing_policy_name(p);
  }
  v[0].live = false;
  for (RoutingPolicy p :
       {RoutingPolicy::kCacheAware, RoutingPolicy::kLeastLoaded, RoutingPolicy::kRoundRobin}) {
    EXPECT_EQ(choose_attention_replica(p, v, 2048, &rr), -1) << routing_policy_name(p);
  }
}

TEST(RoutingPolicyTest, RoundRobinCyclesOverTheLiveReplicas) {
  int rr = 0;
  auto v = views({0, 0, 0}, {0, 0, 0});
  std::vector<int> got;
  for (int i = 0; i < 4; ++i) {
    got.push_back(choose_attention_replica(RoutingPolicy::kRoundRobin, v, 0, &rr));
  }
  EXPECT_EQ(got, (std::vector<int>{0, 1, 2, 0}));
  v[2].live = false;
  got.clear();
  for (int i = 0; i < 3; ++i) {
    got.push_back(choose_attention_replica(RoutingPolicy::kRoundRobin, v, 0, &rr));
  }
  EXPECT_EQ(got, (std::vector<int>{1, 0, 1}));
}

TEST(RoutingPolicyTest, NamesParseBackAndAnUnknownOneIsNamed) {
  for (RoutingPolicy p :
       {RoutingPolicy::kCacheAware, RoutingPolicy::kLeastLoaded, RoutingPolicy::kRoundRobin}) {
    auto q = parse_routing_policy(routing_policy_name(p), "--routing");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(*q, p);
  }
  auto bad = parse_routing_policy("random", "--routing");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--routing: unknown routing policy 'random'"),
            std::string::npos);
}

TEST(PrefixIndexTest, CountsPerGroupAndIgnoresUnknownRemovals) {
  PrefixIndex index;
  index.apply({1, 2, 3, 2}, {});  // hash 2 registered in two layer groups
  EXPECT_EQ(index.size(), 3);
  EXPECT_EQ(index.match({1, 2, 3, 4}), 3);
  EXPECT_EQ(index.match({2, 1}), 2);
  EXPECT_EQ(index.match({4, 1}), 0);
  index.apply({}, {2, 9});  // one group evicted it; 9 was never stored
  EXPECT_TRUE(index.contains(2));
  index.apply({}, {2});
  EXPECT_FALSE(index.contains(2));
  EXPECT_EQ(index.match({1, 2, 3}), 1);
  index.clear();
  EXPECT_EQ(index.size(), 0);
}

}  // namespace
}  // namespace msinfer::runtime
