// Routing statistics (the sliding window, the document) and the greedy
// min-max placement of msinfer balance, on small hand-checked cases.
#include "msinfer/runtime/balance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <tuple>

namespace msinfer::runtime {
namespace {

// Workers holding expert e, ascending, and e's share on each.
std::vector<int> workers_of(const Placement& p, int e) {
  std::vector<int> w;
  for (auto [worker, share] : p.replicas[e]) w.push_back(worker);
  return w;
}

TEST(RoutingWindowTest, CountsPerLayerAndExpert) {
  RoutingWindow w(2, 3);
  w.begin_step();
  w.add(0, 1, 5);
  w.add(1, 2, 7);
  w.begin_step();
  w.add(0, 1, 1);
  EXPECT_EQ(w.steps(), 2);
  EXPECT_EQ(w.counts(), (std::vector<int64_t>{0, 6, 0, 0, 0, 7}));
  const Json j = w.to_json();
  EXPECT_EQ(j["window_steps"], RoutingWindow::kWindowSteps);
  EXPECT_EQ(j["layer_expert_tokens"], Json::parse("[[0, 6, 0], [0, 0, 7]]"));
  w.reset();
  EXPECT_EQ(w.steps(), 0);
  EXPECT_EQ(w.counts(), std::vector<int64_t>(6, 0));
}

TEST(RoutingWindowTest, SlidesByWholeBuckets) {
  constexpr int kPerBucket = RoutingWindow::kWindowSteps / RoutingWindow::kBuckets;
  RoutingWindow w(1, 2);
  // One bucket's worth of steps routed to expert 0, then a full window of
  // steps routed to expert 1: expert 0's rows leave the window when the
  // ring comes round to their bucket, and never sooner.
  for (int s = 0; s < kPerBucket; ++s) {
    w.begin_step();
    w.add(0, 0, 1);
  }
  for (int s = 0; s < RoutingWindow::kWindowSteps - kPerBucket; ++s) {
    w.begin_step();
    w.add(0, 1, 1);
  }
  EXPECT_EQ(w.steps(), RoutingWindow::kWindowSteps);
  EXPECT_EQ(w.counts()[0], kPerBucket);
  w.begin_step();  // the first bucket is dropped whole
  w.add(0, 1, 1);
  EXPECT_EQ(w.counts()[0], 0);
  EXPECT_EQ(w.counts()[1], RoutingWindow::kWindowSteps - kPerBucket + 1);
  EXPECT_EQ(w.steps(), RoutingWindow::kWindowSteps - kPerBucket + 1);
}

TEST(BalancednessTest, BusiestMemberOfEachLayerOverTheMean) {
  // Layer 0: max 3, mean 2; layer 1: max 2, mean 2 -> (3 + 2) / (2 + 2).
  const std::vector<double> x = {3, 1, 2, 2};
  EXPECT_DOUBLE_EQ(*balancedness(x, 2, 2), 1.25);
  EXPECT_DOUBLE_EQ(*layer_balancedness(x, 0, 2), 1.5);
  EXPECT_DOUBLE_EQ(*layer_balancedness(x, 1, 2), 1.0);
  // One member takes everything: n.
  EXPECT_DOUBLE_EQ(*balancedness({0, 0, 9, 0}, 1, 4), 4.0);
  EXPECT_FALSE(balancedness({0, 0}, 1, 2).has_value());
}

TEST(BalancePlacementTest, LptWithoutSpareSlots) {
  // 2 workers x 2 slots, 4 experts: 6 -> w0, 3 -> w1, 2 -> w1 (3 < 6), and 1
  // must go to w0 (w1 is full).
  auto p = balance_placement({6, 3, 2, 1}, 2, 2);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->experts_on(0), (std::vector<int>{0, 3}));
  EXPECT_EQ(p->experts_on(1), (std::vector<int>{1, 2}));
  EXPECT_TRUE(p->validate(4).ok());
}

TEST(BalancePlacementTest, SpareSlotReplicatesTheHottestExpert) {
  // One spare slot: expert 0 (8 per replica) gets a second replica (4 + 4);
  // then 4 -> w0, 4 -> w1, 2 -> w0 (tie: lower index), 2 -> w1: 6 and 6.
  auto p = balance_placement({8, 2, 2}, 2, 2);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(workers_of(*p, 0), (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(p->replicas[0][0].second, 0.5);
  EXPECT_DOUBLE_EQ(p->replicas[0][1].second, 0.5);
  EXPECT_EQ(workers_of(*p, 1), std::vector<int>{0});
  EXPECT_EQ(workers_of(*p, 2), std::vector<int>{1});
  const auto loads = predicted_worker_loads({8, 2, 2}, 1, *p);
  EXPECT_DOUBLE_EQ(loads[0], 6);
  EXPECT_DOUBLE_EQ(loads[1], 6);
  // Round robin puts 8 + 2 on worker 0: max/mean 10/6.
  const auto rr = predicted_worker_loads({8, 2, 2}, 1, Placement::round_robin(3, 2));
  EXPECT_NEAR(*balancedness(rr, 1, 2), 10.0 / 6.0, 1e-12);
  EXPECT_DOUBLE_EQ(*balancedness(loads, 1, 2), 1.0);
}

TEST(BalancePlacementTest, FixedCostPerReplicaUsesASpareSlotOnlyWhenItPays) {
  // Loads {8, 2, 2} on 2 workers x 2 slots, each replica costing `fixed` more.
  // fixed 3: without a replica 11 | 5 + 5, max 11; replicating expert 0 gives
  // 7 + 5 | 7 + 5, max 12: no replica.
  auto p = balance_placement({8, 2, 2}, 2, 2, 3.0);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(workers_of(*p, 0), std::vector<int>{0});
  EXPECT_EQ(p->experts_on(1), (std::vector<int>{1, 2}));
  // fixed 1: 9 | 3 + 3 (max 9) against 5 + 3 | 5 + 3 (max 8): replicate.
  p = balance_placement({8, 2, 2}, 2, 2, 1.0);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(workers_of(*p, 0), (std::vector<int>{0, 1}));
  // The prediction counts the fixed cost of every replica a worker holds.
  const auto loads = predicted_worker_loads({8, 2, 2}, 1, *p, 1.0);
  EXPECT_DOUBLE_EQ(loads[0], 8);
  EXPECT_DOUBLE_EQ(loads[1], 8);
  EXPECT_FALSE(balance_placement({8, 2, 2}, 2, 2, -1.0).ok());
}

// A layer that routed no rows (DeepSeek's dense first layers) costs no expert
// work, not even the fixed part, and does not count as a layer with rows.
TEST(BalancePlacementTest, ALayerWithoutRoutedRowsCostsNothing) {
  const Placement p = Placement::round_robin(3, 2);
  const std::vector<int64_t> rows = {0, 0, 0, 8, 2, 2};  // layer 0 dense
  const auto loads = predicted_worker_loads(rows, 2, p, 1.0);
  ASSERT_EQ(loads.size(), 4u);
  EXPECT_DOUBLE_EQ(loads[0], 0);
  EXPECT_DOUBLE_EQ(loads[1], 0);
  EXPECT_DOUBLE_EQ(loads[2], 8 + 2 + 2 * 1.0);  // experts 0 and 2
  EXPECT_DOUBLE_EQ(loads[3], 2 + 1.0);
  EXPECT_EQ(layers_with_rows(rows, 2, 3), 1);
  EXPECT_DOUBLE_EQ(*balancedness(loads, 2, 2), 12.0 / 7.5);
}

TEST(BalancePlacementTest, AtMostOneReplicaPerWorker) {
  // 4 spare slots but only 2 workers: each expert reaches 2 replicas and the
  // other slots stay empty.
  auto p = balance_placement({10, 1}, 2, 3);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(workers_of(*p, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(workers_of(*p, 1), (std::vector<int>{0, 1}));
}

TEST(BalancePlacementTest, SlotLimitHolds) {
  // A skewed load on 3 workers x 3 slots (9 slots, 6 experts): no worker
  // holds more than 3 experts, and the max load is below round robin's.
  const std::vector<double> load = {100, 50, 30, 20, 10, 5};
  auto p = balance_placement(load, 3, 3);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  for (int w = 0; w < 3; ++w) EXPECT_LE(p->experts_on(w).size(), 3u) << w;
  EXPECT_TRUE(p->validate(6).ok());
  const std::vector<int64_t> rows(load.begin(), load.end());
  const double after = *balancedness(predicted_worker_loads(rows, 1, *p), 1, 3);
  const double before =
      *balancedness(predicted_worker_loads(rows, 1, Placement::round_robin(6, 3)), 1, 3);
  EXPECT_LT(after, before);
  EXPECT_LT(after, 1.1);  // LPT: 68.3 / 78.3 / 68.3 of mean 71.7 (round robin: 120 / 60 / 35)
}

TEST(BalancePlacementTest, BadInputIsAnError) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [load, workers, slots, expect] :
       std::vector<std::tuple<std::vector<double>, int, int, std::string>>{
           {{}, 2, 2, "no experts"},
           {{1, 2, 3}, 0, 2, "expert workers must be in"},
           {{1, 2, 3}, 2, 0, "slots per worker"},
           {{1, 2, 3}, 1, 2, "2 slots for 3 experts"},
           {{1, -2}, 2, 1, "expert 1 has load"},
           {{1, nan}, 2, 1, "expert 1 has load"},
       }) {
    auto p = balance_placement(load, workers, slots);
    ASSERT_FALSE(p.ok()) << expect;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(expect), std::string::npos) << p.status().message();
  }
}

TEST(RoutingStatsTest, FromWorkersSumsReplicasAndRoundTrips) {
  // Expert 0 replicated on both workers, expert 1 on worker 1.
  auto placement = Placement::from_json(
      Json::parse(R"({"expert_workers": 2, "experts": [[[0, 0.5], [1, 0.5]], 1]})"), 2, "p");
  ASSERT_TRUE(placement.ok());
  std::vector<Json> workers = {Json{{"role", "attention"}, {"index", 0}},
                               Json::parse(R"({"role": "expert", "index": 0,
                      "routed": {"steps": 4, "layer_expert_tokens": [[3, 0]]}})"),
                               Json::parse(R"({"role": "expert", "index": 1,
                      "routed": {"steps": 4, "layer_expert_tokens": [[5, 2]]}})")};
  auto st = RoutingStats::from_workers(workers, *placement, 1, 2);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->expert_tokens, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(st->worker_tokens, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(st->steps, 4);
  const Json j = st->to_json();
  EXPECT_DOUBLE_EQ(j["expert_balance"].get<double>(), 8.0 / 5.0);
  EXPECT_DOUBLE_EQ(j["worker_balance"].get<double>(), 7.0 / 5.0);
  // balance reads the document, also inside a whole generate --json answer.
  for (const Json& doc : {j, Json{{"token_ids", Json::array()}, {"routing", j}}}) {
    auto back = RoutingStats::from_json(doc, "stats.json");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->expert_tokens, st->expert_tokens);
    EXPECT_EQ(back->worker_tokens, st->worker_tokens);
    EXPECT_EQ(back->expert_totals(), (std::vector<double>{8, 2}));
  }
}

TEST(RoutingStatsTest, MalformedDocumentsNameTheField) {
  for (const auto& [text, expect] : std::vector<std::pair<std::string, std::string>>{
           {R"([1, 2])", "stats.json"},
           {R"({"experts": 2, "expert_tokens": [[1, 2]]})", "layers"},
           {R"({"layers": 1, "experts": 2})", "expert_tokens"},
           {R"({"layers": 2, "experts": 2, "expert_tokens": [[1, 2]]})", "expert_tokens"},
           {R"({"layers": 1, "experts": 2, "expert_tokens": [[1]]})", "row 0"},
           {R"({"layers": 1, "experts": 2, "expert_tokens": [[1, -1]]})", "non-negative"},
           {R"({"layers": 1, "experts": 2, "expert_tokens": [[1, 0.5]]})", "non-negative"},
           {R"({"layers": 0, "experts": 2, "expert_tokens": []})", "layers"},
           {R"({"layers": 1, "experts": 2, "expert_tokens": [[1, 1]], "expert_workers": 2})",
            "worker_tokens"},
       }) {
    auto st = RoutingStats::from_json(Json::parse(text), "stats.json");
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.status().to_string().find(expect), std::string::npos)
        << text << " -> " << st.status().to_string();
  }
}

}  // namespace
}  // namespace msinfer::runtime

namespace msinfer::runtime {
namespace {

Placement placement_of(const std::string& text, int experts) {
  auto p = Placement::from_json(Json::parse(text), experts, "p");
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : Placement();
}

TEST(SplitRowsTest, ReplicatedRowsGoToTheLeastLoadedWorker) {
  // Expert 0 alone on worker 0 (5 rows), expert 1 on both: its 3 rows all go
  // to worker 1, which has nothing else.
  const Placement p = placement_of(R"({"expert_workers": 2, "experts": [0, [[0, 0.5], [1, 0.5]]]})", 2);
  EXPECT_EQ(split_rows(p, {5, 3}), (std::vector<std::vector<int64_t>>{{5}, {0, 3}}));
  // 9 rows: worker 1 takes rows until it has 5, then they alternate: 5 + 2 and 7.
  EXPECT_EQ(split_rows(p, {5, 9}), (std::vector<std::vector<int64_t>>{{5}, {2, 7}}));
  // One row and nothing else anywhere: the first replica (no share rounding).
  EXPECT_EQ(split_rows(p, {0, 1}), (std::vector<std::vector<int64_t>>{{0}, {1, 0}}));
  // Shares do not bias the split: 0.9 / 0.1 still evens the load.
  const Placement q = placement_of(R"({"expert_workers": 2, "experts": [[[1, 0.9], [0, 0.1]], 1]})", 2);
  EXPECT_EQ(split_rows(q, {4, 2}), (std::vector<std::vector<int64_t>>{{1, 3}, {2}}));
}

TEST(SplitRowsTest, LargestReplicatedExpertFirst) {
  // Experts 0 (2 rows) and 1 (6 rows) both on workers 0 and 1, expert 2 (4
  // rows) on worker 2 alone. Expert 1 first: 3 / 3; then expert 0: 1 / 1.
  const Placement p = placement_of(
      R"({"expert_workers": 3, "experts": [[[0, 0.5], [1, 0.5]], [[0, 0.5], [1, 0.5]], 2]})", 3);
  const auto take = split_rows(p, {2, 6, 4});
  EXPECT_EQ(take, (std::vector<std::vector<int64_t>>{{1, 1}, {3, 3}, {4}}));
  // Every row is placed exactly once.
  for (int e = 0; e < 3; ++e) {
    int64_t n = 0;
    for (int64_t x : take[e]) n += x;
    EXPECT_EQ(n, (std::vector<int64_t>{2, 6, 4})[e]);
  }
}

// A dead expert worker's replicas leave the placement: the others share its
// tokens in their old proportions, higher workers move down, and an expert
// with no other replica is named.
TEST(PlacementWithoutTest, SurvivingReplicasTakeOverAndWorkersMoveDown) {
  auto p = Placement::from_json(
      Json::parse(R"({"expert_workers": 3, "experts": [[[0, 0.5], [1, 0.5]], [[1, 0.2], [2, 0.6],
                  [0, 0.2]], 2, [[2, 0.5], [0, 0.5]]]})"),
      4, "test");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto q = p->without(1);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->workers, 2);
  ASSERT_EQ(q->replicas[0].size(), 1u);
  EXPECT_EQ(q->replicas[0][0].first, 0);
  EXPECT_DOUBLE_EQ(q->replicas[0][0].second, 1.0);
  ASSERT_EQ(q->replicas[1].size(), 2u);
  EXPECT_EQ(q->replicas[1][0].first, 1);  // worker 2 is now 1
  EXPECT_DOUBLE_EQ(q->replicas[1][0].second, 0.75);
  EXPECT_EQ(q->replicas[1][1].first, 0);
  EXPECT_DOUBLE_EQ(q->replicas[1][1].second, 0.25);
  EXPECT_EQ(q->replicas[2][0].first, 1);
  EXPECT_TRUE(q->validate(4).ok());
  auto orphan = p->without(2);  // expert 2 lives on worker 2 only
  EXPECT_EQ(orphan.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(orphan.status().message().find("expert(s) 2 have no replica"), std::string::npos)
      << orphan.status().message();
  EXPECT_EQ(p->without(3).status().code(), StatusCode::kInvalidArgument);
}

// In a running deployment the workers keep their numbers: emptied(1) gives
// worker 1's shares to the other replicas as without(1) does, and worker 1
// holds nothing; a second death that would leave an expert on nobody is named.
TEST(PlacementWithoutTest, EmptiedKeepsTheWorkersNumbers) {
  auto p = Placement::from_json(
      Json::parse(R"({"expert_workers": 3, "experts": [[[0, 0.5], [1, 0.5]], [[1, 0.2], [2, 0.6],
                  [0, 0.2]], [[2, 0.5], [1, 0.5]], [[2, 0.5], [0, 0.5]]]})"),
      4, "test");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto q = p->emptied(1);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->workers, 3);
  EXPECT_TRUE(q->experts_on(1).empty());
  EXPECT_EQ(q->experts_on(0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(q->experts_on(2), (std::vector<int>{1, 2, 3}));
  ASSERT_EQ(q->replicas[1].size(), 2u);
  EXPECT_EQ(q->replicas[1][0].first, 2);
  EXPECT_DOUBLE_EQ(q->replicas[1][0].second, 0.75);
  EXPECT_DOUBLE_EQ(q->replicas[2][0].second, 1.0);
  EXPECT_EQ(q->validate(4).code(), StatusCode::kInvalidArgument);  // worker 1 holds no expert
  // A replacement takes worker 1's shares back: the placement before, up to
  // the order of each expert's replicas.
  auto back = q->with_worker(1, p->shares_on(1));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->validate(4).ok());
  EXPECT_EQ(back->experts_on(1), (std::vector<int>{0, 1, 2}));
  for (int e = 0; e < 4; ++e) {
    std::map<int, double> want, got;
    for (auto [w, share] : p->replicas[e]) want[w] = share;
    for (auto [w, share] : back->replicas[e]) got[w] = share;
    ASSERT_EQ(got.size(), want.size()) << "expert " << e;
    for (auto [w, share] : want) EXPECT_NEAR(got[w], share, 1e-12) << "expert " << e;
  }
  EXPECT_EQ(q->with_worker(1, {{4, 0.5}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q->with_worker(1, {{0, 1.5}}).status().code(), StatusCode::kInvalidArgument);
  auto r = q->emptied(2);  // expert 2 would be left on nobody
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("expert(s) 2 have no replica"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace msinfer::runtime
