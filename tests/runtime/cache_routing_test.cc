// Cache-aware routing across attention replicas (issue 50), through the
// msinfer binary's workers: the router indexes each replica's prefix cache
// from its step answers and sends a request to the replica that holds its
// prefix, within a load slack; failover keeps working.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>

#include "../common/subprocess.h"
#include "msinfer/runtime/router.h"
#include "test_models.h"
#include "tp_checks.h"

namespace msinfer::runtime {
namespace {

const std::string kBinary = MSINFER_BINARY;

WorkerConfig two_replicas(const std::string& dir) {
  WorkerConfig c;
  c.model_dir = dir;
  c.attention_workers = 2;
  c.expert_workers = 2;
  c.engine.micro_batches = 2;
  c.placement = Placement::round_robin(8, 2);
  c.timeout_ms = 2000;
  return c;
}

// A router for `c` (its workers configured with it, placement included).
StatusOr<std::unique_ptr<Router>> start_router(const WorkerConfig& c) {
  return Router::start(c, kBinary);
}

// A chat's prompt: `n` tokens of a sequence of its own (`chat`), the first
// `n` of the same sequence for every n, so a longer one extends a shorter.
GenerationRequest chat_prompt(int64_t id, int chat, int n) {
  GenerationRequest r;
  r.id = id;
  for (int t = 0; t < n; ++t) r.prompt.push_back(3 + (t * (37 + 2 * chat) + 11 * chat) % 200);
  r.sampling.max_tokens = 4;
  r.sampling.ignore_eos = true;
  return r;
}

struct Delivered {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, int64_t> cached;  // the first event's cached_tokens
};

// Steps until idle, adding what the router delivers to `d`; `on_step(i)` runs
// before step i.
template <typename OnStep>
void run_to_idle(Router& router, Delivered* d, OnStep on_step) {
  for (int i = 0; !router.idle() && i < 5000; ++i) {
    on_step(i);
    auto events = router.step();
    ASSERT_TRUE(events.ok()) << events.status().to_string();
    for (const auto& ev : *events) {
      ASSERT_NE(ev.finish_reason, runtime::FinishReason::kError) << ev.error;
      if (d->tokens[ev.request_id].empty()) d->cached[ev.request_id] = ev.cached_tokens;
      d->tokens[ev.request_id].push_back(ev.token);
    }
  }
  ASSERT_TRUE(router.idle());
}
void run_to_idle(Router& router, Delivered* d) {
  run_to_idle(router, d, [](int) {});
}

struct Routed {
  int64_t indexed[2] = {0, 0};  // the router's index sizes after round 1
  int64_t follow_up_cached = -1;
  Delivered d;
};

// Round 1: chat 0's 300-token prompt goes to replica 0, chat 1's to replica 1
// (equal loads: the lowest index, then the idle one; every policy agrees).
// Round 2, both idle: optionally `filler` (chat 1 at 360 tokens, first), then
// chat 1's next turn at 340 tokens. Replica 1 holds chat 1's first 2 blocks
// (256 tokens); least-loaded and round-robin send the turn to replica 0.
Routed route_follow_up(const std::string& dir, RoutingPolicy policy, int64_t slack, bool filler) {
  Routed out;
  WorkerConfig c = two_replicas(dir);
  c.routing = policy;
  c.routing_load_slack = slack;
  auto started = start_router(c);
  EXPECT_TRUE(started.ok()) << started.status().to_string();
  if (!started.ok()) return out;
  std::unique_ptr<Router> router = std::move(started).value();
  std::map<std::string, pid_t> pids;
  for (int a = 0; a < 2; ++a)
    pids["attention" + std::to_string(a)] = router->pid_of("attention", a);
  for (int e = 0; e < 2; ++e) pids["expert" + std::to_string(e)] = router->pid_of("expert", e);
  EXPECT_TRUE(router->add(chat_prompt(1, 0, 300)).ok());
  EXPECT_TRUE(router->add(chat_prompt(2, 1, 300)).ok());
  run_to_idle(*router, &out.d);
  for (int a = 0; a < 2; ++a) out.indexed[a] = router->indexed_blocks(a);
  if (filler) {
    EXPECT_TRUE(router->add(chat_prompt(3, 1, 360)).ok());
  }
  EXPECT_TRUE(router->add(chat_prompt(4, 1, 340)).ok());
  run_to_idle(*router, &out.d);
  out.follow_up_cached = out.d.cached.count(4) ? out.d.cached.at(4) : -1;
  router.reset();  // stops every worker
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/true);
  return out;
}

void expect_greedy_unchanged(const std::string& dir, const Delivered& d) {
  const std::map<int64_t, std::pair<int, int>> reqs = {
      {1, {0, 300}}, {2, {1, 300}}, {3, {1, 360}}, {4, {1, 340}}};
  for (const auto& [id, got] : d.tokens) {
    const auto [chat, n] = reqs.at(id);
    const GenerationRequest r = chat_prompt(id, chat, n);
    testing::expect_equal_up_to_near_tie(testing::colocated_tokens(dir, r), got, dir, r.prompt,
                                         "request " + std::to_string(id));
  }
}

// The router's index follows each replica's registrations (300 prompt + 3
// computed answer tokens: 2 full blocks each), and the follow-up turn lands
// on the replica holding its prefix: 256 tokens reported cached, where
// least-loaded and round-robin send it to the other replica (0 cached).
// Greedy outputs are the co-located engine's under every policy.
TEST(CacheAwareRoutingTest, AFollowUpTurnGoesToTheReplicaHoldingItsPrefix) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const Routed aware = route_follow_up(dir, RoutingPolicy::kCacheAware,
                                       WorkerConfig::kDefaultRoutingLoadSlack, false);
  EXPECT_EQ(aware.indexed[0], 2);
  EXPECT_EQ(aware.indexed[1], 2);
  EXPECT_EQ(aware.follow_up_cached, 256);
  expect_greedy_unchanged(dir, aware.d);
  const Routed least = route_follow_up(dir, RoutingPolicy::kLeastLoaded,
                                       WorkerConfig::kDefaultRoutingLoadSlack, false);
  EXPECT_EQ(least.follow_up_cached, 0);
  expect_greedy_unchanged(dir, least.d);
  const Routed rr = route_follow_up(dir, RoutingPolicy::kRoundRobin,
                                    WorkerConfig::kDefaultRoutingLoadSlack, false);
  EXPECT_EQ(rr.follow_up_cached, 0);
  expect_greedy_unchanged(dir, rr.d);
}

// The load bound overrides the match: a 360-token turn of the same chat
// (load 364) goes first to replica 1; with a slack of 100 tokens the
// follow-up then goes to idle replica 0 (nothing cached), with the default
// slack it joins replica 1 (256 cached).
TEST(CacheAwareRoutingTest, TheLoadSlackOverridesTheMatch) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const Routed tight = route_follow_up(dir, RoutingPolicy::kCacheAware, 100, true);
  EXPECT_EQ(tight.follow_up_cached, 0);
  EXPECT_EQ(tight.d.cached.count(3) ? tight.d.cached.at(3) : -1, 256);  // the filler hit
  expect_greedy_unchanged(dir, tight.d);
  const Routed loose = route_follow_up(dir, RoutingPolicy::kCacheAware,
                                       WorkerConfig::kDefaultRoutingLoadSlack, true);
  EXPECT_EQ(loose.follow_up_cached, 256);
  expect_greedy_unchanged(dir, loose.d);
}

// The replica that holds a chat's prefix is SIGKILLed mid-turn (--resubmit,
// --respawn): its index is dropped with it, the turn finishes on the other
// replica with the co-located engine's tokens, a replacement joins, and
// routing goes on: the chat's next turn finds its prefix on the replica that
// finished the resubmitted turn, and a new chat goes to the idle replacement.
TEST(CacheAwareRoutingTest, AKilledReplicaDoesNotBreakRouting) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  WorkerConfig c = two_replicas(dir);
  c.resubmit = true;
  c.respawn = true;
  std::map<std::string, pid_t> pids;
  {
    auto started = start_router(c);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    Router& router = **started;
    for (int a = 0; a < 2; ++a)
      pids["attention" + std::to_string(a)] = router.pid_of("attention", a);
    for (int e = 0; e < 2; ++e) pids["expert" + std::to_string(e)] = router.pid_of("expert", e);
    Delivered d;
    ASSERT_TRUE(router.add(chat_prompt(1, 0, 300)).ok());
    ASSERT_TRUE(router.add(chat_prompt(2, 1, 300)).ok());
    run_to_idle(router, &d);
    ASSERT_EQ(router.indexed_blocks(1), 2);
    // Chat 1's next turn goes to replica 1 (its prefix), which dies in it.
    GenerationRequest turn = chat_prompt(4, 1, 340);
    turn.sampling.max_tokens = 12;
    ASSERT_TRUE(router.add(turn).ok());
    bool dropped_seen = false;
    run_to_idle(router, &d, [&](int i) {
      if (i == 2) ::kill(router.pid_of("attention", 1), SIGKILL);
      if (i > 2 && router.live_attention_workers() == 1) {
        dropped_seen = true;
        EXPECT_EQ(router.indexed_blocks(1), 0);
      }
    });
    EXPECT_TRUE(dropped_seen || router.replacements_joined() == 1);
    EXPECT_EQ(d.cached.at(4), 256);  // it started on replica 1
    testing::expect_equal_up_to_near_tie(testing::colocated_tokens(dir, turn), d.tokens.at(4), dir,
                                         turn.prompt, "request 4");
    // The replacement joins between steps (an idle deployment steps too).
    const auto t0 = std::chrono::steady_clock::now();
    while (router.replacements_joined() < 1) {
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60))
          << "the replacement did not join";
      auto events = router.step();
      ASSERT_TRUE(events.ok()) << events.status().to_string();
    }
    pids["attention1 (replacement)"] = router.pid_of("attention", 1);
    EXPECT_EQ(router.indexed_blocks(1), 0);
    EXPECT_GT(router.indexed_blocks(0), 2);  // chat 0's, and chat 1's resubmitted turn
    // Chat 1's turn after that: on replica 0, which computed the resubmitted
    // one (prompt 340 + 3 delivered tokens, at least 2 blocks); then a new chat:
    // the least-loaded replica, the replacement.
    GenerationRequest next = chat_prompt(5, 1, 360);
    ASSERT_TRUE(router.add(next).ok());
    GenerationRequest fresh = chat_prompt(6, 2, 200);
    ASSERT_TRUE(router.add(fresh).ok());
    run_to_idle(router, &d);
    EXPECT_GE(d.cached.at(5), 256);
    EXPECT_EQ(d.cached.at(6), 0);
    for (const GenerationRequest& r : {next, fresh}) {
      testing::expect_equal_up_to_near_tie(testing::colocated_tokens(dir, r), d.tokens.at(r.id),
                                           dir, r.prompt, "request " + std::to_string(r.id));
    }
    EXPECT_GT(router.indexed_blocks(1), 0);  // the replacement reported chat 2's block
    EXPECT_EQ(router.restarts(), 0);
  }
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/true);
}

}  // namespace
}  // namespace msinfer::runtime
