// The disaggregated deployment against the co-located engine, through the
// msinfer binary as a user runs it (router + worker processes on this host).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "msinfer/runtime/router.h"
#include "test_models.h"
#include "tp_checks.h"

namespace msinfer::runtime {
namespace {

const std::string kBinary = MSINFER_BINARY;

// generate's token ids; its stderr into *stderr_text when given.
std::vector<int32_t> tokens_of(const std::string& args, std::string* stderr_text = nullptr) {
  const std::string err =
      ::testing::TempDir() + "/disaggregated_test_stderr_" + std::to_string(::getpid()) + ".txt";
  const std::string out =
      msinfer::testing::run_capture(kBinary + " generate " + args + " --json 2>" + err);
  auto j = parse_json(out, "generate --json");
  std::stringstream e;
  e << std::ifstream(err).rdbuf();
  EXPECT_TRUE(j.ok()) << args << "\nstdout: " << out.substr(0, 300) << "\nstderr: " << e.str();
  if (stderr_text != nullptr) *stderr_text = e.str();
  return j.ok() ? (*j)["token_ids"].get<std::vector<int32_t>>() : std::vector<int32_t>{};
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string p = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(p) << text;
  return p;
}

class DisaggregatedTest : public ::testing::TestWithParam<std::string> {};

// Greedy tokens of (n_a, N, m) in {(1,1,1), (2,4,2), (2,3,3) uneven, (3,8,2)
// with replicated experts} equal the co-located engine's.
TEST_P(DisaggregatedTest, SameTokensAsTheColocatedEngine) {
  const std::string dir = testing::test_model_dir(GetParam());
  const std::string uneven = write_file(
      "placement_uneven.json", R"({"expert_workers": 3, "experts": [0, 0, 0, 0, 0, 1, 1, 2]})");
  const std::string replicated = write_file(
      "placement_replicated.json",
      R"({"expert_workers": 8, "experts": [[[0, 0.5], [1, 0.5]], 1, 2, 3, 4, 5, 6, [[7, 0.7], [0, 0.3]]]})");
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 16 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 16u);
  for (const std::string& d :
       {std::string("--attention-workers 1 --expert-workers 1 --micro-batches 1"),
        std::string("--attention-workers 2 --expert-workers 4 --micro-batches 2"),
        "--attention-workers 2 --expert-workers 3 --micro-batches 3 --placement " + uneven,
        "--attention-workers 3 --expert-workers 8 --micro-batches 2 --placement " + replicated}) {
    EXPECT_EQ(tokens_of(prompt + " " + d), ref) << GetParam() << " " << d;
  }
}

// --weights w8a8 reaches the workers (each quantises its own experts or
// attention weights at load: the expert workers report fewer bytes than
// bf16's, about half, printed to 0.1 MiB) and gives the co-located w8a8
// engine's tokens.
TEST_P(DisaggregatedTest, W8A8WeightsSameTokensAsTheColocatedW8A8Engine) {
  const std::string dir = testing::test_model_dir(GetParam());
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 16 --ignore-eos";
  const std::string d = " --attention-workers 2 --expert-workers 3 --micro-batches 2";
  const auto ref = tokens_of(prompt + " --weights w8a8");
  ASSERT_EQ(ref.size(), 16u);
  EXPECT_EQ(tokens_of(prompt + " --weights w8a8" + d), ref) << GetParam();
  // One expert worker with every expert: enough bytes to tell the formats apart.
  const std::string one = " --attention-workers 1 --expert-workers 1 --micro-batches 1";
  std::string err_w8a8, err_bf16;
  EXPECT_EQ(tokens_of(prompt + " --weights w8a8" + one, &err_w8a8), ref) << GetParam();
  tokens_of(prompt + one, &err_bf16);
  // "expert worker 0 ready (pid P): experts ...; RSS R MiB (expert weights W MiB)"
  auto expert_mib = [](const std::string& err) {
    const size_t at = err.find("(expert weights ");
    return at == std::string::npos ? -1.0 : std::stod(err.substr(at + 16));
  };
  const double w8 = expert_mib(err_w8a8), bf = expert_mib(err_bf16);
  ASSERT_GT(w8, 0) << err_w8a8;
  ASSERT_GT(bf, 0) << err_bf16;
  EXPECT_LT(w8, bf) << "w8a8 " << w8 << " MiB, bf16 " << bf << " MiB";
}

TEST_P(DisaggregatedTest, SeededSamplingIsReproducible) {
  const std::string dir = testing::test_model_dir(GetParam());
  const std::string args = "--model " + dir +
                           " --prompt-ids 5,9,22 --max-tokens 12 --ignore-eos "
                           "--temperature 0.9 --seed 5 --attention-workers 2 --expert-workers 2 "
                           "--micro-batches 2";
  const auto a = tokens_of(args), b = tokens_of(args);
  EXPECT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, DisaggregatedTest,
                         ::testing::Values("tiny-mixtral", "tiny-qwen3moe"));

// With stdin closed, fd 0 is free: the router's bootstrap listener takes it
// and the first pipe end becomes fd 3, the number a worker reads commands
// from. The workers must still get their pipes.
TEST(DisaggregatedStdioTest, RunsWithStdinClosed) {
  const std::string prompt = "--model " + testing::test_model_dir("tiny-mixtral") +
                             " --prompt-ids 5,9,22 --max-tokens 4 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 4u);
  EXPECT_EQ(tokens_of(prompt + " --attention-workers 1 --expert-workers 1 --micro-batches 1 <&-"),
            ref);
}

// A plan document decides n_a and m (one expert worker per expert); plans with
// tensor parallelism are refused with a clear message.
TEST(DisaggregatedPlanTest, PlanDocumentSetsTheDeployment) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string catalog = write_file("cpu_catalog.json", R"({
    "defaults": {"nic_util_curve": [[1024, 0.1], [1048576, 0.9]]},
    "gpus": [{"name": "CPU2", "bf16_tflops": 0.47, "memory_gb": 24, "memory_bandwidth_gb_s": 32,
              "nic_gbit_s": 80, "gpus_per_node": 1, "intra_node_gb_s": 32, "price": 1,
              "tdp_w": 100}]})");
  const std::string plan = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_plan.json";
  ASSERT_FALSE(
      msinfer::testing::run_capture(kBinary + " plan --model " + dir + " --catalog " + catalog +
                                    " --gpu CPU2 --max-gpus 10 --seq-len 256 --out " + plan)
          .empty());
  auto j = read_json_file(plan);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["plan"]["tp_attention"], 1);
  const std::string prompt = "--model " + dir + " --prompt-ids 5,9,22 --max-tokens 8 --ignore-eos";
  EXPECT_EQ(tokens_of(prompt + " --plan " + plan), tokens_of(prompt));
  // A placement (e.g. from `msinfer balance`) goes with the plan when it
  // places the experts on the plan's expert nodes, and is refused otherwise.
  const int nodes = (*j)["plan"]["expert_nodes"].get<int>();
  Json shifted{{"expert_workers", nodes}, {"experts", Json::array()}};
  for (int e = 0; e < 8; ++e) shifted["experts"].push_back((e + 3) % nodes);
  const std::string placement = write_file("plan_placement.json", shifted.dump());
  EXPECT_EQ(tokens_of(prompt + " --plan " + plan + " --placement " + placement), tokens_of(prompt));
  // Another worker count than the plan's expert nodes (the planner may put
  // several experts on a node, so the plan's count is read, not assumed).
  const int n_other = nodes < 8 ? nodes + 1 : nodes - 1;
  Json other{{"expert_workers", n_other}, {"experts", Json::array()}};
  for (int e = 0; e < 8; ++e) other["experts"].push_back(e % n_other);
  const std::string mismatched = write_file("other_workers.json", other.dump());
  const std::string refused =
      msinfer::testing::run_capture("sh -c '" + kBinary + " generate " + prompt + " --plan " +
                                    plan + " --placement " + mismatched + " 2>&1; echo exit=$?'");
  EXPECT_NE(refused.find("expert nodes is " + std::to_string(nodes)), std::string::npos) << refused;
  EXPECT_NE(refused.find("exit=2"), std::string::npos) << refused;
  // A plan with attention and expert tensor parallelism runs too (issue 14):
  // Mixtral-8x22B on A100s is 4 attention replicas x tp 2 and 8 expert
  // nodes x tp 2, 24 processes, here serving the tiny model.
  const std::string big = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_bigplan.json";
  msinfer::testing::run_capture(kBinary + " plan --model mixtral-8x22b --gpu A100 --out " + big);
  auto bj = read_json_file(big);
  ASSERT_TRUE(bj.ok());
  ASSERT_GT((*bj)["plan"]["tp_attention"].get<int>(), 1) << bj->dump();
  EXPECT_EQ(tokens_of(prompt + " --plan " + big), tokens_of(prompt));
}

// Killing a worker mid-generation through the CLI: an expert worker, or the
// attention worker holding the request (worker 0: the other one would be
// dropped and generation would go on, see AttentionFailureTest). The request
// ends with an error naming it, within the M2N timeout; every other process
// exits; nothing hangs.
class DisaggregatedKillTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DisaggregatedKillTest, AKilledWorkerIsNamedAndEverythingStops) {
  const std::string victim_role = GetParam();
  const std::string victim_name = victim_role == "expert" ? "expert1" : "attention0";
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  pid_t victim = -1;
  std::chrono::steady_clock::time_point killed_at;
  const auto run = msinfer::testing::watch_router(
      {kBinary, "generate", "--model", dir, "--prompt-ids", "5,9,22", "--max-tokens", "3500",
       "--ignore-eos", "--attention-workers", "2", "--expert-workers", "2", "--micro-batches", "2",
       "--timeout-ms", "2000"},
      [&](const char* line, const std::map<std::string, pid_t>& pids) {
        if (victim < 0 && std::strstr(line, "msinfer: step 32") != nullptr &&
            pids.count(victim_name)) {
          victim = pids.at(victim_name);
          ::kill(victim, SIGKILL);
          killed_at = std::chrono::steady_clock::now();
        }
      });
  const std::string& all = run.stderr_text;
  const int status = run.status;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_GT(victim, 0) << "never saw the workers start and run:\n" << all;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << all;
  EXPECT_NE(all.find(victim_role + " worker " + victim_name.substr(victim_name.size() - 1)),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("request 1"), std::string::npos) << all;
  EXPECT_LT(seconds, 2.0 + 10.0) << "not detected within the M2N timeout";
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

INSTANTIATE_TEST_SUITE_P(Roles, DisaggregatedKillTest, ::testing::Values("expert", "attention"));

// ---- an attention worker dies (issue 13) ----
//
// Through the Router in this process (it forks the msinfer binary's workers):
// requests, a SIGKILL at a chosen step or after a seeded delay, and what every
// request got. The co-located engine gives the reference tokens.

struct FailureRun {
  std::map<int64_t, std::vector<int32_t>> tokens;  // per request, in order
  std::map<int64_t, std::string> errors;           // requests that ended with an error
  std::map<int64_t, int> ends;                     // finished events per request
  std::map<int64_t, int> events_after_end;         // events after the finished one
  std::map<std::string, pid_t> pids;
  Status status = ok_status();  // step()'s error, when the deployment stopped
  int live_attention = 0;
  int expert_workers = 0, restarts = 0;
  int lost_experts = 0, steps_rerun = 0;  // expert workers dropped in place
  int rebalances = 0;
  Placement placement;  // the router's at the end
  double seconds = 0;   // from the first step to idle (or the error)
};

WorkerConfig failure_config(const std::string& dir, int attention, int experts, bool resubmit) {
  WorkerConfig c;
  c.model_dir = dir;
  c.attention_workers = attention;
  c.expert_workers = experts;
  c.engine.micro_batches = 2;
  c.placement = Placement::round_robin(8, experts);
  c.timeout_ms = 2000;
  c.resubmit = resubmit;
  return c;
}

// Every expert e of the tiny models (8) on two workers, e % n and (e + 1) % n.
Placement two_replicas_each(int n) {
  Placement p;
  p.workers = n;
  for (int e = 0; e < 8; ++e) p.replicas.push_back({{e % n, 0.5}, {(e + 1) % n, 0.5}});
  return p;
}

std::vector<GenerationRequest> failure_requests(int n, int max_tokens) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = i + 1;
    r.prompt = {5 + i, 9, 22 + 3 * i, 40, 7 + i, 8};
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    out.push_back(r);
  }
  return out;
}

// A router for `c` (its workers configured with it, placement included).
StatusOr<std::unique_ptr<Router>> start_router(const WorkerConfig& c) {
  return Router::start(c, kBinary);
}

// `victim` ("attention" or "expert", index) is SIGKILLed after `kill_after`
// steps, or, with `kill_after_ms` >= 0, that long after the first step began
// (from another thread: mid-step, wherever the exchange is).
FailureRun run_with_kill(const WorkerConfig& c, const std::vector<GenerationRequest>& reqs,
                         const std::string& victim_role, int victim, int kill_after,
                         int kill_after_ms = -1) {
  FailureRun run;
  auto started = start_router(c);
  EXPECT_TRUE(started.ok()) << started.status().to_string();
  if (!started.ok()) return run;
  std::unique_ptr<Router> router = std::move(started).value();
  for (int a = 0; a < c.attention_workers; ++a) {
    run.pids["attention" + std::to_string(a)] = router->pid_of("attention", a);
  }
  for (int e = 0; e < c.expert_workers; ++e) {
    run.pids["expert" + std::to_string(e)] = router->pid_of("expert", e);
  }
  const pid_t target = router->pid_of(victim_role, victim);
  EXPECT_GT(target, 0);
  for (const auto& r : reqs) EXPECT_TRUE(router->add(r).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::thread killer;
  if (kill_after_ms >= 0) {
    killer = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
      ::kill(target, SIGKILL);
    });
  }
  int steps = 0;
  while (!router->idle()) {
    if (kill_after_ms < 0 && steps == kill_after) ::kill(target, SIGKILL);
    auto events = router->step();
    ++steps;
    if (!events.ok()) {
      run.status = events.status();
      break;
    }
    for (const auto& ev : *events) {
      if (run.ends[ev.request_id] > 0) {
        ++run.events_after_end[ev.request_id];
        continue;
      }
      if (ev.finish_reason == runtime::FinishReason::kError) {
        run.errors[ev.request_id] = ev.error;
      } else {
        run.tokens[ev.request_id].push_back(ev.token);
      }
      if (ev.finished) ++run.ends[ev.request_id];
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
      ADD_FAILURE() << "the deployment did not finish within 120 s";
      break;
    }
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (killer.joinable()) killer.join();
  run.live_attention = router->live_attention_workers();
  run.expert_workers = router->expert_workers();
  run.restarts = router->restarts();
  run.lost_experts = router->lost_expert_workers();
  run.steps_rerun = router->steps_rerun();
  run.rebalances = router->rebalances();
  run.placement = router->placement();
  // A restarted deployment's workers, to check they are gone too.
  for (int a = 0; a < c.attention_workers; ++a) {
    const pid_t p = router->pid_of("attention", a);
    if (p > 0) run.pids["attention" + std::to_string(a) + " (now)"] = p;
  }
  for (int e = 0; e < run.expert_workers; ++e) {
    const pid_t p = router->pid_of("expert", e);
    if (p > 0) run.pids["expert" + std::to_string(e) + " (now)"] = p;
  }
  router.reset();  // stops every worker
  return run;
}

// Every request of `run` finished once, with the co-located engine's greedy
// tokens (up to a near tie), nothing after its end.
void expect_all_finished_right(const FailureRun& run, const std::vector<GenerationRequest>& reqs,
                               const std::string& dir) {
  EXPECT_TRUE(run.status.ok()) << run.status.to_string();
  EXPECT_TRUE(run.errors.empty()) << run.errors.begin()->second;
  for (const auto& r : reqs) {
    EXPECT_EQ(run.ends.count(r.id) ? run.ends.at(r.id) : 0, 1) << "request " << r.id;
    EXPECT_EQ(run.events_after_end.count(r.id), 0u) << "request " << r.id;
    ASSERT_EQ(run.tokens.count(r.id), 1u) << "request " << r.id;
    testing::expect_equal_up_to_near_tie(testing::colocated_tokens(dir, r), run.tokens.at(r.id),
                                         dir, r.prompt, "request " + std::to_string(r.id));
  }
}

// Without --resubmit: the dead worker's requests end with an error naming it,
// the others finish with the co-located engine's tokens, and the deployment
// keeps serving (a request added afterwards runs on the survivor).
TEST(AttentionFailureTest, ADeadAttentionWorkerFailsOnlyItsRequests) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(4, 12);
  const WorkerConfig c = failure_config(dir, 2, 2, /*resubmit=*/false);
  // Equal loads: requests 1, 3 go to attention worker 0, 2 and 4 to worker 1.
  const FailureRun run = run_with_kill(c, reqs, "attention", 1, /*kill_after=*/4);
  EXPECT_TRUE(run.status.ok()) << run.status.to_string();
  EXPECT_EQ(run.live_attention, 1);
  for (const auto& r : reqs) {
    EXPECT_EQ(run.ends.count(r.id) ? run.ends.at(r.id) : 0, 1) << "request " << r.id;
    EXPECT_EQ(run.events_after_end.count(r.id), 0u) << "request " << r.id;
    if (r.id % 2 == 1) {
      EXPECT_EQ(run.errors.count(r.id), 0u) << run.errors.at(r.id);
      const auto ref = testing::colocated_tokens(dir, r);
      testing::expect_equal_up_to_near_tie(ref, run.tokens.at(r.id), dir, r.prompt,
                                           "request " + std::to_string(r.id));
    } else {
      ASSERT_EQ(run.errors.count(r.id), 1u) << "request " << r.id;
      EXPECT_NE(run.errors.at(r.id).find("attention worker 1"), std::string::npos)
          << run.errors.at(r.id);
      EXPECT_NE(run.errors.at(r.id).find("killed by signal 9"), std::string::npos)
          << run.errors.at(r.id);
      // What it delivered before the death was a prefix of the right answer.
      const auto ref = testing::colocated_tokens(dir, r);
      const auto& got = run.tokens.count(r.id) ? run.tokens.at(r.id) : std::vector<int32_t>{};
      EXPECT_LT(got.size(), ref.size());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), ref.begin())) << "request " << r.id;
    }
  }
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// With --resubmit: every request finishes, each token delivered once, and
// the greedy output equals the co-located engine's (the dead worker's
// requests continue on the survivor from prompt + delivered tokens).
TEST(AttentionFailureTest, ResubmittedRequestsFinishWithUnchangedGreedyOutput) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(4, 12);
  const WorkerConfig c = failure_config(dir, 2, 2, /*resubmit=*/true);
  const FailureRun run = run_with_kill(c, reqs, "attention", 1, /*kill_after=*/4);
  EXPECT_EQ(run.live_attention, 1);
  expect_all_finished_right(run, reqs, dir);
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// An expert worker dies and every expert it held has a replica on another
// worker: it is dropped in place. Killed between two steps, it is found dead
// while both attention workers wait for its answers in the next one; they
// finish that step without it, discard it and run it again with its experts
// on the replicas. No request fails, nothing restarts, the other workers are
// the same processes, and greedy output is unchanged.
// Over the direct (shared-memory) and the socket (TCP) transports: the
// socket transport forgets the dead peer's connection instead of failing.
class ExpertFailureTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertFailureTransportTest, ADeadExpertWorkersExpertsMoveToTheirReplicas) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(4, 12);
  WorkerConfig c = failure_config(dir, 2, 3, /*resubmit=*/false);
  c.placement = two_replicas_each(3);
  c.transport = *comm::parse_transport(GetParam());
  const FailureRun run = run_with_kill(c, reqs, "expert", 1, /*kill_after=*/4);
  expect_all_finished_right(run, reqs, dir);
  EXPECT_EQ(run.restarts, 0);
  EXPECT_EQ(run.lost_experts, 1);
  EXPECT_EQ(run.steps_rerun, 2);  // one per attention worker
  EXPECT_EQ(run.expert_workers, 3);
  EXPECT_TRUE(run.placement.experts_on(1).empty());
  for (int e = 0; e < 8; ++e) {  // experts that were on worker 1: the other replica takes all
    const bool was_on_1 = e % 3 == 1 || (e + 1) % 3 == 1;
    ASSERT_EQ(run.placement.replicas[e].size(), was_on_1 ? 1u : 2u) << "expert " << e;
    double sum = 0;
    for (const auto& [w, share] : run.placement.replicas[e]) {
      EXPECT_NE(w, 1) << "expert " << e;
      sum += share;
    }
    EXPECT_DOUBLE_EQ(sum, 1.0) << "expert " << e;
  }
  for (const char* who : {"attention0", "attention1", "expert0", "expert2"}) {
    EXPECT_EQ(run.pids.at(std::string(who) + " (now)"), run.pids.at(who)) << who;
  }
  EXPECT_EQ(run.pids.count("expert1 (now)"), 0u);
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// An attention worker's death over the socket transport: the expert
// workers' connections to it fail before the router's drop_attention
// arrives, and are forgotten; its requests are resubmitted.
TEST_P(ExpertFailureTransportTest, ADeadAttentionWorkersRequestsAreResubmitted) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(4, 12);
  WorkerConfig c = failure_config(dir, 2, 2, /*resubmit=*/true);
  c.transport = *comm::parse_transport(GetParam());
  const FailureRun run = run_with_kill(c, reqs, "attention", 1, /*kill_after=*/4);
  EXPECT_EQ(run.live_attention, 1);
  EXPECT_EQ(run.restarts, 0);
  expect_all_finished_right(run, reqs, dir);
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

INSTANTIATE_TEST_SUITE_P(Transports, ExpertFailureTransportTest,
                         ::testing::Values("direct", "socket"));

// Under mpirun on this host (1 router + 2 attention + 2 expert ranks, the
// socket transport, every expert on both expert workers), one rank
// SIGKILLed about a second into the run. With --enable-recovery Open MPI
// keeps the other ranks running; the router sees the rank's control
// connection close and drops it: an attention worker's requests are
// resubmitted, an expert worker's experts go to their replicas. Every token
// of every request arrives, the job ends with status 0, and no rank is left.
class MpirunFailureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MpirunFailureTest, ARankKilledMidRunCostsNoRequest) {
  if (std::system("command -v mpirun >/dev/null") != 0) {
    GTEST_SKIP() << "needs mpirun (openmpi-bin)";
  }
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string role = GetParam();
  const std::string base =
      ::testing::TempDir() + "/mpirun_kill_" + role + "_" + std::to_string(::getpid());
  Placement both;
  both.workers = 2;
  for (int e = 0; e < 8; ++e) both.replicas.push_back({{0, 0.5}, {1, 0.5}});
  std::ofstream(base + ".placement.json") << both.to_json().dump();
  // Open MPI leaks at exit: no leak checking for this job (as TwoHostTest).
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
      "timeout -k 10 120 mpirun -x ASAN_OPTIONS --oversubscribe --enable-recovery --mca btl "
      "self,tcp -np 5 " +
      kBinary + " bench serve --offline --model " + dir +
      " --attention-workers 2 --expert-workers 2 --placement " + base +
      ".placement.json --resubmit --num-prompts 6 --input-len 8 --output-len 100 "
      "--timeout-ms 5000 --json > " +
      base + ".out 2> " + base + ".err";
  int rc = -1;
  std::thread job([&] { rc = std::system(cmd.c_str()); });
  // The victim's pid from the router's list of ranks, then a second of steps.
  const std::string who = role + " worker 1: rank ";
  pid_t victim = -1;
  std::vector<pid_t> ranks;
  const auto t0 = std::chrono::steady_clock::now();
  while (victim < 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(90)) {
    std::stringstream e;
    e << std::ifstream(base + ".err").rdbuf();
    const std::string text = e.str();
    if (text.find("msinfer bench serve: disaggregated") != std::string::npos) {
      std::istringstream lines(text);
      std::string line;
      while (std::getline(lines, line)) {
        const size_t at = line.find(", pid ");
        if (line.find(": rank ") == std::string::npos || at == std::string::npos) continue;
        const pid_t p = static_cast<pid_t>(std::atol(line.c_str() + at + 6));
        ranks.push_back(p);
        if (line.rfind(who, 0) == 0) victim = p;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(victim, 0) << "no " << who << "line";
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ::kill(victim, SIGKILL);
  job.join();
  std::stringstream e, o;
  e << std::ifstream(base + ".err").rdbuf();
  o << std::ifstream(base + ".out").rdbuf();
  EXPECT_EQ(rc, 0) << e.str();
  auto j = parse_json(o.str(), "bench serve --json");
  ASSERT_TRUE(j.ok()) << o.str().substr(0, 300) << "\n" << e.str();
  EXPECT_EQ((*j)["generated_tokens"].get<int64_t>(), 600) << e.str();
  EXPECT_NE(e.str().find("closed its connection"), std::string::npos) << e.str();
  EXPECT_NE(e.str().find(role == "expert" ? "its experts' rows go to their replicas"
                                          : "its requests are resubmitted"),
            std::string::npos)
      << e.str();
  EXPECT_EQ(ranks.size(), 4u);
  for (pid_t p : ranks) {
    EXPECT_NE(::kill(p, 0), 0) << "rank pid " << p << " is still running";
    ::kill(p, SIGKILL);  // none is left behind, even when the test fails
  }
}

INSTANTIATE_TEST_SUITE_P(Roles, MpirunFailureTest, ::testing::Values("attention", "expert"));

// Two expert workers of four die one after the other, each dropped in place:
// the even experts live on workers 0 and 2, the odd ones on 1 and 3, so
// losing 3, then 0 leaves each expert on one replica (even on 2, odd on 1).
// A third death then has no replica to go to and stops the deployment.
TEST(ExpertFailureTest, TwoDeathsInPlaceLeaveEveryExpertOnOneReplica) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(4, 16);
  WorkerConfig c = failure_config(dir, 1, 4, /*resubmit=*/false);
  Placement p;
  p.workers = 4;
  for (int e = 0; e < 8; ++e) p.replicas.push_back({{e % 2, 0.5}, {e % 2 + 2, 0.5}});
  c.placement = p;
  FailureRun run;
  {
    auto router = start_router(c);
    ASSERT_TRUE(router.ok()) << router.status().to_string();
    for (const char* role : {"attention", "expert"}) {
      for (int i = 0; i < (std::string(role) == "expert" ? 4 : 1); ++i) {
        run.pids[role + std::to_string(i)] = (*router)->pid_of(role, i);
      }
    }
    for (const auto& r : reqs) ASSERT_TRUE((*router)->add(r).ok());
    for (int step = 0; !(*router)->idle() && step < 200; ++step) {
      if (step == 3) ::kill((*router)->pid_of("expert", 3), SIGKILL);
      if (step == 8) ::kill((*router)->pid_of("expert", 0), SIGKILL);
      auto events = (*router)->step();
      ASSERT_TRUE(events.ok()) << events.status().to_string();
      for (const auto& ev : *events) {
        if (ev.finish_reason == runtime::FinishReason::kError)
          run.errors[ev.request_id] = ev.error;
        else
          run.tokens[ev.request_id].push_back(ev.token);
        if (ev.finished) ++run.ends[ev.request_id];
      }
    }
    EXPECT_TRUE((*router)->idle());
    EXPECT_EQ((*router)->lost_expert_workers(), 2);
    EXPECT_EQ((*router)->restarts(), 0);
    const Placement& now = (*router)->placement();
    for (int e = 0; e < 8; ++e) {
      ASSERT_EQ(now.replicas[e].size(), 1u) << "expert " << e;
      EXPECT_EQ(now.replicas[e][0].first, e % 2 == 0 ? 2 : 1) << "expert " << e;
    }
    ASSERT_TRUE((*router)->add(failure_requests(1, 8)[0]).ok());
    ::kill((*router)->pid_of("expert", 2), SIGKILL);
    Status stopped = ok_status();
    for (int step = 0; step < 50 && stopped.ok() && !(*router)->idle(); ++step) {
      stopped = (*router)->step().status();
    }
    EXPECT_EQ(stopped.code(), StatusCode::kUnavailable);
    EXPECT_NE(stopped.message().find("expert worker 2"), std::string::npos) << stopped.message();
  }
  expect_all_finished_right(run, reqs, dir);
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// With --respawn, an expert worker dropped in place gets a replacement that
// joins the running deployment: it loads its experts while the others
// serve, gets the attention workers' cards and the units exchanged so far
// from the router, and from the next step on takes its experts' rows again.
// No restart: the other workers are the same processes throughout; every
// request, before, during and after the join, gets the co-located engine's
// tokens, and the replacement computes rows once it joined.
TEST(ExpertFailureTest, ARespawnedReplacementJoinsTheRunningDeployment) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto base = failure_requests(4, 16);
  std::vector<std::vector<int32_t>> ref;
  for (const auto& r : base) ref.push_back(testing::colocated_tokens(dir, r));
  WorkerConfig c = failure_config(dir, 2, 3, /*resubmit=*/false);
  c.placement = two_replicas_each(3);
  c.respawn = true;
  std::map<std::string, pid_t> pids;
  {
    auto started = start_router(c);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    Router& router = **started;
    for (int a = 0; a < 2; ++a)
      pids["attention" + std::to_string(a)] = router.pid_of("attention", a);
    for (int e = 0; e < 3; ++e) pids["expert" + std::to_string(e)] = router.pid_of("expert", e);
    int64_t next_id = 1;
    int rounds_after_join = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int round = 0; rounds_after_join < 2; ++round) {
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60))
          << "the replacement did not join";
      const bool joined = router.replacements_joined() == 1;
      std::map<int64_t, size_t> which;  // request id -> index in base
      for (size_t i = 0; i < base.size(); ++i) {
        GenerationRequest r = base[i];
        r.id = next_id++;
        which[r.id] = i;
        ASSERT_TRUE(router.add(r).ok());
      }
      std::map<int64_t, std::vector<int32_t>> got;
      for (int step = 0; !router.idle() && step < 500; ++step) {
        if (round == 0 && step == 4) ::kill(router.pid_of("expert", 1), SIGKILL);
        auto events = router.step();
        ASSERT_TRUE(events.ok()) << events.status().to_string();
        for (const auto& ev : *events) {
          ASSERT_NE(ev.finish_reason, runtime::FinishReason::kError) << ev.error;
          got[ev.request_id].push_back(ev.token);
        }
      }
      ASSERT_TRUE(router.idle());
      for (const auto& [id, i] : which) {
        testing::expect_equal_up_to_near_tie(
            ref[i], got[id], dir, base[i].prompt,
            "round " + std::to_string(round) + ", request " + std::to_string(id));
      }
      if (joined) ++rounds_after_join;
    }
    EXPECT_EQ(router.restarts(), 0);
    EXPECT_EQ(router.replacements(), 1);
    EXPECT_EQ(router.lost_expert_workers(), 0);
    // The placement is the starting one again (as sets of (worker, share)).
    for (int e = 0; e < 8; ++e) {
      std::map<int, double> want, now;
      for (auto [w, share] : c.placement.replicas[e]) want[w] = share;
      for (auto [w, share] : router.placement().replicas[e]) now[w] = share;
      ASSERT_EQ(now.size(), want.size()) << "expert " << e;
      for (auto [w, share] : want) EXPECT_NEAR(now[w], share, 1e-9) << "expert " << e;
    }
    for (const char* who : {"attention0", "attention1", "expert0", "expert2"}) {
      const std::string role = std::string(who).substr(0, std::string(who).size() - 1);
      const int index = who[std::strlen(who) - 1] - '0';
      EXPECT_EQ(router.pid_of(role, index), pids.at(who)) << who;
    }
    const pid_t replacement = router.pid_of("expert", 1);
    EXPECT_GT(replacement, 0);
    EXPECT_NE(replacement, pids.at("expert1"));
    pids["expert1 (replacement)"] = replacement;
    // The replacement computed rows after it joined.
    auto st = router.stats(/*reset=*/false);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    int64_t rows_on_1 = 0;
    for (const Json& w : *st) {
      if (w.value("role", std::string()) == "expert" && w.value("index", -1) == 1) {
        rows_on_1 = w.value("tokens", int64_t{0});
      }
    }
    EXPECT_GT(rows_on_1, 0);
  }
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/true);
}

// With --respawn an attention worker that dies is replaced in the running
// deployment (with --resubmit its requests go on on the other one): the
// replacement loads the attention weights while the other serves, gets the
// expert processes' cards and the units exchanged so far from the router, and
// every expert process then serves it. No restart: the other workers are the
// same processes throughout; every request, before, during and after the
// join, gets the co-located engine's tokens; the replacement takes requests
// once it joined; Router::health() counts the death and the restart.
TEST(AttentionFailureTest, ARespawnedAttentionWorkerJoinsTheRunningDeployment) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto base = failure_requests(4, 16);
  std::vector<std::vector<int32_t>> ref;
  for (const auto& r : base) ref.push_back(testing::colocated_tokens(dir, r));
  WorkerConfig c = failure_config(dir, 2, 2, /*resubmit=*/true);
  c.respawn = true;
  std::map<std::string, pid_t> pids;
  {
    auto started = start_router(c);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    Router& router = **started;
    for (int a = 0; a < 2; ++a)
      pids["attention" + std::to_string(a)] = router.pid_of("attention", a);
    for (int e = 0; e < 2; ++e) pids["expert" + std::to_string(e)] = router.pid_of("expert", e);
    int64_t next_id = 1;
    int rounds_after_join = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int round = 0; rounds_after_join < 2; ++round) {
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60))
          << "the replacement did not join";
      const bool joined = router.replacements_joined() == 1;
      std::map<int64_t, size_t> which;  // request id -> index in base
      for (size_t i = 0; i < base.size(); ++i) {
        GenerationRequest r = base[i];
        r.id = next_id++;
        which[r.id] = i;
        ASSERT_TRUE(router.add(r).ok());
      }
      std::map<int64_t, std::vector<int32_t>> got;
      for (int step = 0; !router.idle() && step < 500; ++step) {
        if (round == 0 && step == 4) ::kill(router.pid_of("attention", 1), SIGKILL);
        auto events = router.step();
        ASSERT_TRUE(events.ok()) << events.status().to_string();
        for (const auto& ev : *events) {
          ASSERT_NE(ev.finish_reason, runtime::FinishReason::kError) << ev.error;
          got[ev.request_id].push_back(ev.token);
        }
      }
      ASSERT_TRUE(router.idle());
      for (const auto& [id, i] : which) {
        testing::expect_equal_up_to_near_tie(
            ref[i], got[id], dir, base[i].prompt,
            "round " + std::to_string(round) + ", request " + std::to_string(id));
      }
      if (joined) ++rounds_after_join;
    }
    EXPECT_EQ(router.restarts(), 0);
    EXPECT_EQ(router.replacements(), 1);
    EXPECT_EQ(router.live_attention_workers(), 2);
    for (const char* who : {"attention0", "expert0", "expert1"}) {
      const std::string role = std::string(who).substr(0, std::string(who).size() - 1);
      const int index = who[std::strlen(who) - 1] - '0';
      EXPECT_EQ(router.pid_of(role, index), pids.at(who)) << who;
    }
    const pid_t replacement = router.pid_of("attention", 1);
    EXPECT_GT(replacement, 0);
    EXPECT_NE(replacement, pids.at("attention1"));
    pids["attention1 (replacement)"] = replacement;
    const DeploymentHealth h = router.health();
    EXPECT_EQ(h.attention.live, 2);
    EXPECT_EQ(h.attention.expected, 2);
    EXPECT_EQ(h.attention.deaths, 1);
    EXPECT_EQ(h.attention.restarts, 1);
    EXPECT_EQ(h.expert.live, 2);
    EXPECT_EQ(h.expert.deaths, 0);
    EXPECT_FALSE(h.recovering);
    EXPECT_FALSE(h.stopped);
    // The replacement computed tokens of the requests after it joined.
    auto st = router.stats(/*reset=*/false);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    int64_t tokens_on_1 = 0;
    for (const Json& w : *st) {
      if (w.value("role", std::string()) == "attention" && w.value("index", -1) == 1) {
        tokens_on_1 = w.value("tokens", int64_t{0});
      }
    }
    EXPECT_GT(tokens_on_1, 0);
  }
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/true);
}

// Without replicas, --respawn: serving pauses while a replacement loads the
// dead worker's experts and joins; the step it was in runs again. No
// restart: the attention workers and the other expert worker are the same
// processes, their KV caches intact, and no request fails.
TEST(ExpertFailureTest, RespawnReplacesAnExpertWorkerWithoutReplicas) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(4, 12);
  WorkerConfig c = failure_config(dir, 2, 2, /*resubmit=*/false);
  c.respawn = true;
  const FailureRun run = run_with_kill(c, reqs, "expert", 0, /*kill_after=*/4);
  expect_all_finished_right(run, reqs, dir);
  EXPECT_EQ(run.expert_workers, 2);
  EXPECT_EQ(run.restarts, 0);
  EXPECT_EQ(run.lost_experts, 0);  // back
  EXPECT_EQ(run.steps_rerun, 2);
  EXPECT_EQ(run.placement.to_json(), c.placement.to_json());
  for (const char* who : {"attention0", "attention1", "expert1"}) {
    EXPECT_EQ(run.pids.at(std::string(who) + " (now)"), run.pids.at(who)) << who;
  }
  ASSERT_EQ(run.pids.count("expert0 (now)"), 1u);
  EXPECT_NE(run.pids.at("expert0 (now)"), run.pids.at("expert0"));
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// What cannot be dropped or replaced in place is restarted under --respawn:
// here the only attention worker dies. Every worker starts again (from the
// router's own placement file), every request in flight is resubmitted from
// prompt + delivered tokens, and none fails.
TEST(ExpertFailureTest, TheLastAttentionWorkerIsRestartedWithTheDeployment) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(3, 12);
  WorkerConfig c = failure_config(dir, 1, 2, /*resubmit=*/false);
  c.respawn = true;
  const FailureRun run = run_with_kill(c, reqs, "attention", 0, /*kill_after=*/4);
  expect_all_finished_right(run, reqs, dir);
  EXPECT_EQ(run.restarts, 1);
  EXPECT_EQ(run.expert_workers, 2);
  ASSERT_EQ(run.pids.count("attention0 (now)"), 1u);
  EXPECT_NE(run.pids.at("attention0 (now)"), run.pids.at("attention0"));
  EXPECT_NE(run.pids.at("expert0 (now)"), run.pids.at("expert0"));  // restarted too
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// Seeded SIGKILLs at random moments (mid-step, from another thread) of a random
// worker, over many runs, on 3 attention + 3 expert workers with every expert
// on two of them: an attention worker's death costs only its requests (none
// with resubmit), an expert worker's none (dropped in place, the step it was
// in run again; no restart, respawn or not). Never a hang, a lost or
// duplicated token, a leftover process or shared-memory object.
TEST(WorkerFailureTest, SeededKillsNeverHangLoseOrDuplicate) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const auto reqs = failure_requests(5, 120);
  std::map<int64_t, std::vector<int32_t>> ref;
  for (const auto& r : reqs) ref[r.id] = testing::colocated_tokens(dir, r);
  WorkerConfig base = failure_config(dir, 3, 3, false);
  base.placement = two_replicas_each(3);
  // A run without a kill says how long the steps take, so that the kills
  // land while requests are in flight.
  const FailureRun clean = run_with_kill(base, reqs, "attention", 0, /*kill_after=*/-1);
  ASSERT_TRUE(clean.status.ok()) << clean.status.to_string();
  ASSERT_TRUE(clean.errors.empty());
  const int span_ms = std::max(1, static_cast<int>(clean.seconds * 1e3 * 0.8));
  std::printf("[ kill ] a run without a kill: %.2f s\n", clean.seconds);
  std::mt19937 rng(20261201);
  for (int i = 0; i < 10; ++i) {
    const bool expert = i % 2 == 1;
    WorkerConfig c = base;
    c.resubmit = i % 2 == 0;
    c.respawn = i == 5 || i == 8;
    const int victim = static_cast<int>(rng() % 3);
    const int delay_ms = static_cast<int>(rng() % static_cast<unsigned>(span_ms));
    const std::string what = std::string(expert ? "expert" : "attention") + " worker " +
                             std::to_string(victim) + " killed after " + std::to_string(delay_ms) +
                             " ms" + (c.resubmit ? ", resubmit" : "") +
                             (c.respawn ? ", respawn" : "");
    SCOPED_TRACE(what);
    const FailureRun run =
        run_with_kill(c, reqs, expert ? "expert" : "attention", victim, -1, delay_ms);
    std::printf(
        "[ kill ] %s: %.2f s, %zu errors, %d restarts, %d expert worker(s) dropped, "
        "%d step(s) run again, %s\n",
        what.c_str(), run.seconds, run.errors.size(), run.restarts, run.lost_experts,
        run.steps_rerun, run.status.ok() ? "ok" : run.status.message().c_str());
    EXPECT_LT(run.seconds, 60.0);
    if (expert) {
      EXPECT_EQ(run.restarts, 0);
    }
    EXPECT_TRUE(run.status.ok()) << run.status.to_string();
    for (const auto& r : reqs) {
      EXPECT_EQ(run.ends.count(r.id) ? run.ends.at(r.id) : 0, 1) << "request " << r.id;
      EXPECT_EQ(run.events_after_end.count(r.id), 0u) << "request " << r.id;
      const auto& got = run.tokens.count(r.id) ? run.tokens.at(r.id) : std::vector<int32_t>{};
      const auto& want = ref[r.id];
      if (run.errors.count(r.id)) {
        // Failed (an attention worker's, without resubmit): what it delivered
        // is a prefix of the right answer.
        EXPECT_FALSE(c.resubmit || expert) << run.errors.at(r.id);
        EXPECT_LT(got.size(), want.size());
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "request " << r.id;
      } else {
        // Finished: every token once, the right ones (up to a near tie).
        testing::expect_equal_up_to_near_tie(want, got, dir, reqs[r.id - 1].prompt,
                                             "request " + std::to_string(r.id));
      }
    }
    msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
  }
}

// ---- Online rebalancing (issue 13) ----

// tiny-mixtral with a Zipf(1.5) router skew; with `flip_half`, tokens of the
// upper half of the vocabulary carry the skew channel negated (the sign bit
// of column 0 of their embedding rows flipped: make_model's RouterSkew), so
// their rows prefer the experts the lower half avoids. Also the experts by
// popularity (for the lower half).
struct SkewedModel {
  std::string dir;
  std::vector<int> by_popularity;
  int64_t vocab = 0;
};

SkewedModel skewed_model(bool flip_half) {
  SkewedModel m;
  m.dir = ::testing::TempDir() + "/rebalance_model_" + std::to_string(::getpid()) +
          (flip_half ? "_flipped" : "");
  model::MakeModelOptions o;
  o.preset = "tiny-mixtral";
  o.out_dir = m.dir;
  o.router_skew_zipf = 1.5;
  Status s = model::make_model(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  auto config = read_json_file(m.dir + "/config.json");
  EXPECT_TRUE(config.ok());
  if (!config.ok()) return m;
  m.by_popularity =
      (*config)["msinfer_router_skew"]["experts_by_popularity"].get<std::vector<int>>();
  m.vocab = (*config)["vocab_size"].get<int64_t>();
  const int64_t h = (*config)["hidden_size"].get<int64_t>();
  if (!flip_half) return m;
  // The safetensors header: 8 bytes of length, then JSON with each tensor's
  // dtype, shape and data_offsets (from the end of the header).
  const std::string file = m.dir + "/model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t len = 0;
  f.read(reinterpret_cast<char*>(&len), 8);
  std::string header(len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(len));
  auto j = parse_json(header, file);
  EXPECT_TRUE(j.ok());
  if (!j.ok()) return m;
  const Json& t = (*j)["model.embed_tokens.weight"];
  EXPECT_EQ(t["dtype"].get<std::string>(), "BF16");
  EXPECT_EQ(t["shape"][0].get<int64_t>(), m.vocab);
  const int64_t base = 8 + static_cast<int64_t>(len) + t["data_offsets"][0].get<int64_t>();
  for (int64_t r = m.vocab / 2; r < m.vocab; ++r) {
    const int64_t at = base + r * h * 2 + 1;  // the high byte of element (r, 0)
    char b = 0;
    f.seekg(at);
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x80);
    f.seekp(at);
    f.write(&b, 1);
  }
  EXPECT_TRUE(f.good());
  return m;
}

WorkerConfig rebalance_config(const std::string& dir, const Placement& p) {
  WorkerConfig c;
  c.model_dir = dir;
  c.attention_workers = 1;
  c.expert_workers = 2;
  c.engine.micro_batches = 2;
  c.placement = p;
  c.timeout_ms = 5000;
  c.rebalance_every = 2;
  c.rebalance_slots = 5;  // 10 slots for 8 experts: two replicas to give out
  c.rebalance_gain = 1.05;
  return c;
}

int replicas_of(const Placement& p, int expert) {
  return static_cast<int>(p.replicas[static_cast<size_t>(expert)].size());
}

// The four most popular experts on worker 0: the router moves and replicates
// experts while eight requests decode (a decision needs 256 rows per layer,
// here ~14 steps; the expert workers load their new experts meanwhile, and
// the switch waits for them, not the steps: 160 tokens leave ~145 steps for
// the load; with 32, a CI run whose cores were busy once ended first),
// and every greedy token is the one the same deployment makes without
// rebalancing (an expert row's output does not depend on its batch, so
// moving rows between replicas changes no bit).
// With expert tp 2 (allreduce) every shard loads its slices of the experts its
// worker gains, and shard 0 alone counts the rows.
class RebalanceTest : public ::testing::TestWithParam<int> {};

TEST_P(RebalanceTest, ASkewedPlacementIsRebalancedWithIdenticalTokens) {
  static const SkewedModel m = skewed_model(/*flip_half=*/false);
  Placement hot;  // ranks 1-4 on worker 0, ranks 5-8 on worker 1
  hot.workers = 2;
  hot.replicas.resize(8);
  for (int r = 0; r < 8; ++r) hot.replicas[m.by_popularity[r]] = {{r < 4 ? 0 : 1, 1.0}};
  const auto reqs = failure_requests(8, 160);
  WorkerConfig rebalancing = rebalance_config(m.dir, hot);
  rebalancing.tp_expert = GetParam();
  if (GetParam() > 1) rebalancing.tp_expert_reduce = ExpertReduce::kAllReduce;
  WorkerConfig fixed = rebalancing;
  fixed.rebalance_every = 0;
  const FailureRun without = run_with_kill(fixed, reqs, "expert", 0, /*kill_after=*/-1);
  const FailureRun with = run_with_kill(rebalancing, reqs, "expert", 0, -1);
  ASSERT_TRUE(without.status.ok()) << without.status.to_string();
  ASSERT_TRUE(with.status.ok()) << with.status.to_string();
  EXPECT_EQ(without.rebalances, 0);
  EXPECT_GE(with.rebalances, 1);
  // The most popular expert (~0.97 of the tokens pick it) got a replica on
  // each worker; the placement is one balance_placement can make.
  EXPECT_EQ(replicas_of(with.placement, m.by_popularity[0]), 2) << with.placement.describe();
  EXPECT_TRUE(with.placement.validate(8).ok());
  for (int w = 0; w < 2; ++w) EXPECT_LE(with.placement.experts_on(w).size(), 5u);
  for (const auto& r : reqs) {
    ASSERT_EQ(with.tokens.count(r.id), 1u);
    EXPECT_EQ(with.tokens.at(r.id), without.tokens.at(r.id)) << "request " << r.id;
  }
  EXPECT_TRUE(with.errors.empty());
  msinfer::testing::expect_workers_gone(with.pids, /*no_shm=*/true);
}

INSTANTIATE_TEST_SUITE_P(TpExpert, RebalanceTest, ::testing::Values(1, 2));

// The skew changes halfway: prompts from the lower half of the vocabulary,
// then from the upper half (whose rows prefer the other end of the ranking).
// The placement follows: first the most popular expert of the lower half is
// replicated, then the least popular one (the upper half's favourite) is.
TEST(RebalanceSkewTest, ThePlacementFollowsASkewThatChanges) {
  const SkewedModel m = skewed_model(/*flip_half=*/true);
  auto started = Router::start(rebalance_config(m.dir, Placement::round_robin(8, 2)), kBinary);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<Router> router = std::move(started).value();
  std::map<std::string, pid_t> pids{{"attention", router->pid_of("attention", 0)},
                                    {"expert0", router->pid_of("expert", 0)},
                                    {"expert1", router->pid_of("expert", 1)}};
  std::mt19937 rng(7);
  int64_t next_id = 1;
  // Rounds of two 24-token prompts from [lo, hi), each answered by one token
  // (prefill only: one step), until the router's placement replicates
  // `expert`; the router looks every 2 steps and decides on every 4. The
  // upper half's skew is the ranking reversed, which is flatter than the
  // Zipf head: the gain predicted from one 4-step window of it straddles the
  // 1.05 threshold, and about one window in four passes it (measured: 4.2
  // decisions to the switch on average over 39 runs). So the bound is 400
  // rounds (~100 decisions), not 60: with 60, 1 run in ~40 ended without the
  // second switch. A run that follows the skew stops at its switch.
  auto phase = [&](int64_t lo, int64_t hi, int expert) {
    for (int round = 0; round < 400 && replicas_of(router->placement(), expert) < 2; ++round) {
      for (int i = 0; i < 2; ++i) {
        GenerationRequest r;
        r.id = next_id++;
        for (int t = 0; t < 24; ++t)
          r.prompt.push_back(static_cast<int32_t>(lo + rng() % (hi - lo)));
        r.sampling.max_tokens = 1;
        r.sampling.ignore_eos = true;
        ASSERT_TRUE(router->add(r).ok());
      }
      while (!router->idle()) {
        auto ev = router->step();
        ASSERT_TRUE(ev.ok()) << ev.status().to_string();
      }
    }
  };
  phase(3, m.vocab / 2, m.by_popularity[0]);
  const int switched = router->rebalances();
  EXPECT_GE(switched, 1);
  const Placement first = router->placement();
  EXPECT_EQ(replicas_of(first, m.by_popularity[0]), 2) << first.describe();
  EXPECT_EQ(replicas_of(first, m.by_popularity[7]), 1) << first.describe();
  phase(m.vocab / 2, m.vocab, m.by_popularity[7]);
  EXPECT_GT(router->rebalances(), switched);
  const Placement second = router->placement();
  EXPECT_EQ(replicas_of(second, m.by_popularity[7]), 2) << second.describe();
  EXPECT_EQ(replicas_of(second, m.by_popularity[0]), 1) << second.describe();
  router.reset();
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/true);
}

// bench serve through a 1 + 2 deployment: every token accounted for, and the
// workers' counters agree with each other (each token of a decode step visits
// top_k experts in every layer, and every visit is one expert row).
// Prefix caching in a disaggregated deployment (issue 50): each attention
// worker's engine keeps its own cache. Two rounds of the same four 200-token
// prompts that share their first 160 tokens, over 2 attention workers: the
// second round finds at least the shared first block (128 tokens) on
// whichever worker it lands, the router sums both workers' counters, and
// every answer is the co-located engine's.
TEST(PrefixCacheDisaggregatedTest, RepeatedPromptsHitEachWorkersCache) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  WorkerConfig c = failure_config(dir, /*attention=*/2, /*experts=*/2, /*resubmit=*/false);
  auto started = start_router(c);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<Router> router = std::move(started).value();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.id = i + 1;
    for (int t = 0; t < 200; ++t) {
      r.prompt.push_back(3 + ((t < 160 ? t : t + 31 * i) * 37) % 200);
    }
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  std::map<int64_t, std::vector<int32_t>> got;
  for (int round = 0; round < 2; ++round) {
    for (GenerationRequest r : reqs) {
      r.id += 10 * round;
      ASSERT_TRUE(router->add(r).ok());
    }
    for (int g = 0; !router->idle() && g < 10000; ++g) {
      auto events = router->step();
      ASSERT_TRUE(events.ok()) << events.status().to_string();
      for (const auto& ev : *events) {
        ASSERT_NE(ev.finish_reason, runtime::FinishReason::kError) << ev.error;
        got[ev.request_id].push_back(ev.token);
      }
    }
    if (round == 0) {
      EXPECT_EQ(router->counters().prefix_queries, 4 * 200);
    }
  }
  EXPECT_EQ(router->counters().prefix_queries, 8 * 200);
  EXPECT_GE(router->counters().prefix_hits, 4 * 128);
  for (const auto& r : reqs) {
    const auto ref = testing::colocated_tokens(dir, r);
    testing::expect_equal_up_to_near_tie(ref, got[r.id], dir, r.prompt,
                                         "request " + std::to_string(r.id));
    testing::expect_equal_up_to_near_tie(ref, got[r.id + 10], dir, r.prompt,
                                         "request " + std::to_string(r.id + 10));
  }
}

// bench serve's multi-turn chats (issue 50): every turn's prompt is the
// system prompt and the chat so far, so later turns find it in the prefix
// cache, co-located and on a disaggregated deployment's attention worker;
// --no-prefix-caching (passed on to the workers) computes every token.
TEST(BenchServeTest, MultiTurnChatsHitThePrefixCache) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  for (const std::string& d :
       {std::string(""), std::string(" --attention-workers 1 --expert-workers 1")}) {
    for (const bool off : {false, true}) {
      const std::string out = msinfer::testing::run_capture(
          kBinary + " bench serve --offline --model " + dir +
          " --dataset multi-turn --users 3 --turns 3 --system-len 150 --input-len 20 "
          "--output-len 8 --idle-seconds 0 --json" +
          (off ? " --no-prefix-caching" : "") + d + " 2>/dev/null");
      auto j = parse_json(out, "bench serve --json");
      ASSERT_TRUE(j.ok()) << d << (off ? " off" : " on") << ": " << out.substr(0, 300);
      EXPECT_EQ((*j)["generated_tokens"].get<int64_t>(), 9 * 8);
      const int64_t queries = (*j)["prefix_cache_query_tokens"].get<int64_t>();
      const int64_t hits = (*j)["prefix_cache_hit_tokens"].get<int64_t>();
      // Every prompt token is looked up (and, off, computed): 9 prompts, the
      // chat growing by 28 tokens a turn.
      EXPECT_EQ(queries, 3 * (3 * 170 + 28 * (1 + 2))) << d;
      EXPECT_EQ((*j)["prefill_tokens_computed"].get<int64_t>(), queries - hits);
      if (off) {
        EXPECT_EQ(hits, 0) << d;
      } else {
        // Turns 1 and 2 of each chat find at least the first block of 128
        // (the first turns start together: nothing is cached yet).
        EXPECT_GE(hits, 3 * 2 * 128) << d;
        EXPECT_GT(queries, hits);
      }
    }
  }
}

// The mixed workload: decoding requests, then long prompts sent among them
// once each has its first token; both kinds reported apart, every token
// accounted for, co-located and disaggregated.
TEST(BenchServeTest, AMixedWorkloadSendsLongPromptsAmongDecodingRequests) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  for (const std::string& d :
       {std::string(""), std::string(" --attention-workers 1 --expert-workers 1")}) {
    const std::string out = msinfer::testing::run_capture(
        kBinary + " bench serve --offline --model " + dir +
        " --dataset mixed --num-prompts 5 --input-len 12 --output-len 20 --long-prompts 2"
        " --long-input-len 300 --long-output-len 3 --long-interval 4"
        " --max-num-batched-tokens 64 --idle-seconds 0 --json" +
        d + " 2>/dev/null");
    auto j = parse_json(out, "bench serve --json");
    ASSERT_TRUE(j.ok()) << d << ": " << out.substr(0, 300);
    EXPECT_EQ((*j)["dataset"], "mixed");
    EXPECT_EQ((*j)["num_prompts"].get<int64_t>(), 7) << d;
    EXPECT_EQ((*j)["generated_tokens"].get<int64_t>(), 5 * 20 + 2 * 3) << d;
    EXPECT_EQ((*j)["input_tokens"].get<int64_t>(), 5 * 12 + 2 * 300) << d;
    EXPECT_EQ((*j)["prefix_cache_query_tokens"].get<int64_t>(), 5 * 12 + 2 * 300) << d;
    // A 300-token prompt at 64 tokens a step takes 5 steps to its first
    // token, and the decoding requests step meanwhile.
    EXPECT_GT((*j)["long_ttft_ms_p50"].get<double>(), 0) << d;
    EXPECT_GT((*j)["decoding_tbt_ms_p50"].get<double>(), 0) << d;
    EXPECT_GE((*j)["decoding_tbt_ms_max"].get<double>(), (*j)["decoding_tbt_ms_p50"].get<double>())
        << d;
    EXPECT_GE((*j)["steps"].get<int64_t>(), 20) << d;
  }
}

TEST(BenchServeTest, WorkerCountersAccountForEveryToken) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string err =
      ::testing::TempDir() + "/bench_serve_stderr_" + std::to_string(::getpid());
  const std::string out = msinfer::testing::run_capture(
      kBinary + " bench serve --offline --model " + dir +
      " --num-prompts 6 --input-len 9 --output-len 7 --attention-workers 1 --expert-workers 2"
      " --micro-batches 2 --json 2>" +
      err);
  std::stringstream e;
  e << std::ifstream(err).rdbuf();
  auto j = parse_json(out, "bench serve --json");
  ASSERT_TRUE(j.ok()) << out.substr(0, 300) << "\n" << e.str();
  EXPECT_EQ((*j)["generated_tokens"].get<int64_t>(), 6 * 7);
  EXPECT_GT((*j)["decode_tokens_per_s"].get<double>(), 0);
  EXPECT_LE((*j)["ttft_ms_p50"].get<double>(), (*j)["ttft_ms_p99"].get<double>());
  const auto& workers = (*j)["workers"];
  ASSERT_EQ(workers.size(), 3u);
  auto cfg = read_json_file(dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  const int64_t layers = (*cfg)["num_hidden_layers"].get<int64_t>();
  const int64_t top_k = (*cfg)["num_experts_per_tok"].get<int64_t>();
  // Decode phase: 6 requests x 6 more tokens, one row each per step.
  EXPECT_EQ(workers[0]["role"], "attention");
  EXPECT_EQ(workers[0]["tokens"].get<int64_t>(), 6 * 6);
  int64_t expert_rows = 0;
  for (size_t i = 1; i < workers.size(); ++i) {
    const auto& w = workers[i];
    EXPECT_EQ(w["role"], "expert");
    expert_rows += w["tokens"].get<int64_t>();
    ASSERT_TRUE(w.contains("t_e_s")) << w.dump();
    EXPECT_EQ(w["t_e_s"].size(), 2u);  // micro-batch slots
    EXPECT_EQ(w["t_e_s"][0].size(), static_cast<size_t>(layers));
    EXPECT_GT(w["t_e_mean_s"].get<double>(), 0);
    // Tiny experts are idle when most messages arrive: T_c gets samples.
    ASSERT_TRUE(w.contains("t_c_mean_s")) << w.dump();
    EXPECT_GE(w["t_c_mean_s"].get<double>(), 0);
  }
  EXPECT_EQ(expert_rows, 6 * 6 * top_k * layers);
  // The routing statistics say the same per (layer, expert) and per worker.
  const auto& routing = (*j)["routing"];
  ASSERT_EQ(routing["expert_workers"], 2) << routing.dump();
  ASSERT_EQ(routing["expert_tokens"].size(), static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    int64_t by_expert = 0, by_worker = 0;
    for (const auto& n : routing["expert_tokens"][l]) by_expert += n.get<int64_t>();
    for (const auto& n : routing["worker_tokens"][l]) by_worker += n.get<int64_t>();
    EXPECT_EQ(by_expert, 6 * 6 * top_k) << l;
    EXPECT_EQ(by_worker, 6 * 6 * top_k) << l;
  }
  EXPECT_GE(routing["expert_balance"].get<double>(), 1.0);
  EXPECT_GE(routing["worker_balance"].get<double>(), 1.0);
  for (const auto& w : workers) {
    const double busy = w["busy_fraction"].get<double>(), wait = w["wait_fraction"].get<double>();
    EXPECT_GT(busy, 0) << w.dump();
    EXPECT_LE(busy + wait, 1.0 + 1e-6) << w.dump();
    EXPECT_GT(w["gemm_gflops_per_s"].get<double>(), 0) << w.dump();
  }
  EXPECT_GT(workers[0]["t_a_mean_s"].get<double>(), 0);
}

// Two "hosts": network namespaces joined by a veth pair, created and removed
// here. mpirun (in host a) reaches host b through a plm_rsh_agent script that
// runs `ip netns exec`; the router, both attention workers (host a) and both
// expert workers (host b) are ranks of one job, and the M2N data goes across
// the veth over msinfer's socket transport (the default under mpirun) or
// libfabric's tcp provider.
class TwoHostTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(::getpid());
    ns_a_ = "msi" + id + "a";
    ns_b_ = "msi" + id + "b";
    if (std::system("command -v mpirun >/dev/null && command -v ip >/dev/null") != 0) {
      GTEST_SKIP() << "needs mpirun (openmpi-bin) and ip (iproute2)";
    }
    if (!sh("ip netns add " + ns_a_)) {
      GTEST_SKIP() << "cannot create network namespaces here (needs root / CAP_NET_ADMIN)";
    }
    created_ = true;
    const std::string va = "mva" + id, vb = "mvb" + id;
    ASSERT_TRUE(sh("ip netns add " + ns_b_));
    ASSERT_TRUE(sh("ip link add " + va + " type veth peer name " + vb));
    ASSERT_TRUE(
        sh("ip link set " + va + " netns " + ns_a_ + " && ip link set " + vb + " netns " + ns_b_));
    ASSERT_TRUE(sh("ip -n " + ns_a_ + " addr add 10.77.0.1/24 dev " + va + " && ip -n " + ns_b_ +
                   " addr add 10.77.0.2/24 dev " + vb));
    for (const auto& [ns, dev] : {std::pair{ns_a_, va}, std::pair{ns_b_, vb}}) {
      ASSERT_TRUE(
          sh("ip -n " + ns + " link set lo up && ip -n " + ns + " link set " + dev + " up"));
    }
    agent_ =
        write_file("netns_agent.sh",
                   "#!/bin/sh\n"
                   "# mpirun's remote launcher: AGENT [options] HOST COMMAND...\n"
                   "while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n"
                   "host=$1; shift\n"
                   "case \"$host\" in 10.77.0.1) ns=" +
                       ns_a_ + " ;; 10.77.0.2) ns=" + ns_b_ +
                       " ;; *) echo \"unknown host $host\" >&2; exit 1 ;; esac\n"
                       "exec ip netns exec \"$ns\" sh -c \"$*\"\n");
    ::chmod(agent_.c_str(), 0755);
    hostfile_ = write_file("netns_hosts", "10.77.0.1 slots=3\n10.77.0.2 slots=2\n");
  }
  void TearDown() override {
    if (!created_) return;
    // Anything still running in the namespaces goes first; deleting a
    // namespace removes its end of the veth pair and so the pair.
    for (const std::string& ns : {ns_a_, ns_b_}) {
      sh("ip netns pids " + ns + " 2>/dev/null | xargs -r kill -9");
      sh("ip netns del " + ns + " 2>/dev/null");
    }
  }
  static bool sh(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

  // `mpirun` started in namespace a over `hosts`, up to the rank counts and
  // commands (`ranks`: "-np 4 <command>" or an MPMD list). Both namespaces
  // share this machine's hostname and /dev/shm, which confuses Open MPI's
  // shared-memory transport (only the rendezvous goes through MPI), so the
  // BTLs are self and tcp: real hosts need no `--mca btl`. Open MPI leaks at
  // exit (MPI_Init's allocations, its plugins'); under AddressSanitizer
  // LeakSanitizer would fail every rank for them, so leak checking is off for
  // this job only (every other test keeps it).
  std::string mpirun(const std::string& hosts, const std::string& ranks) const {
    return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
           "timeout -s KILL 120 ip netns exec " +
           ns_a_ + " mpirun -x ASAN_OPTIONS --hostfile " + hosts + " --mca plm_rsh_agent " +
           agent_ +
           " --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca "
           "btl self,tcp " +
           ranks;
  }

  std::string ns_a_, ns_b_, agent_, hostfile_;
  bool created_ = false;
};

TEST_P(TwoHostTest, MpirunDeploymentBetweenNamespacesMatchesTheColocatedEngine) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 12u);
  const std::string err = ::testing::TempDir() + "/two_host_stderr_" + std::to_string(::getpid());
  const std::string cmd =
      mpirun(hostfile_, "-np 5 " + kBinary + " generate " + prompt +
                            " --attention-workers 2 --expert-workers 2 --micro-batches 2 "
                            "--fabric-provider " +
                            GetParam() + " --json 2>" + err);
  const std::string out = msinfer::testing::run_capture(cmd);
  std::stringstream e;
  e << std::ifstream(err).rdbuf();
  auto j = parse_json(out, "mpirun generate --json");
  ASSERT_TRUE(j.ok()) << "stdout: " << out.substr(0, 300) << "\nstderr: " << e.str();
  EXPECT_EQ((*j)["token_ids"].get<std::vector<int32_t>>(), ref) << e.str();
  // The expert workers really were on the other host.
  EXPECT_NE(e.str().find("expert worker 0: rank 3 on"), std::string::npos) << e.str();
  EXPECT_NE(e.str().find("(10.77.0.2, pid"), std::string::npos) << e.str();
  EXPECT_NE(e.str().find("ready"), std::string::npos) << e.str();
}

// Prefill/decode disaggregation across hosts (issue 50): the router, the
// attention worker and the expert worker on host a, the prefill worker (the
// launcher's last rank) on host b. Greedy tokens are the co-located
// engine's, and every sequence's K/V crosses the veth into the attention
// worker's staging region over the transport under test, none prefilled
// again on the attention worker.
TEST_P(TwoHostTest, PrefillWorkerOnTheOtherHostMovesEverySequencesKv) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 12u);
  const std::string hosts = write_file("netns_hosts_pd", "10.77.0.1 slots=3\n10.77.0.2 slots=1\n");
  const std::string deployment =
      " --attention-workers 1 --expert-workers 1 --prefill-workers 1 --fabric-provider " +
      GetParam() + " --json";
  const std::string err =
      ::testing::TempDir() + "/two_host_pd_stderr_" + std::to_string(::getpid());
  const std::string out = msinfer::testing::run_capture(
      mpirun(hosts, "-np 4 " + kBinary + " generate " + prompt + deployment + " 2>" + err));
  std::stringstream e;
  e << std::ifstream(err).rdbuf();
  auto j = parse_json(out, "mpirun generate --json");
  ASSERT_TRUE(j.ok()) << "stdout: " << out.substr(0, 300) << "\nstderr: " << e.str();
  EXPECT_EQ((*j)["token_ids"].get<std::vector<int32_t>>(), ref) << e.str();
  EXPECT_NE(e.str().find("prefill worker 0: rank 3 on"), std::string::npos) << e.str();
  EXPECT_NE(e.str().find("(10.77.0.2, pid"), std::string::npos) << e.str();
  // Four prompts through bench serve, which reports the transfers.
  const std::string bench = msinfer::testing::run_capture(mpirun(
      hosts, "-np 4 " + kBinary + " bench serve --offline --model " + dir +
                 " --num-prompts 4 --input-len 40 --output-len 4" + deployment + " 2>/dev/null"));
  auto b = parse_json(bench, "mpirun bench serve --json");
  ASSERT_TRUE(b.ok()) << "stdout: " << bench.substr(0, 300);
  const auto& kv = (*b)["kv_transfers"];
  EXPECT_EQ(kv["sequences"], 4) << b->dump();
  EXPECT_GT(kv["bytes"].get<int64_t>(), 0) << b->dump();
  EXPECT_EQ(kv["fallbacks"], 0) << b->dump();
}

// Expert tensor parallelism across hosts (issue 14): the router and one
// attention worker on host a, one expert worker (all experts) of two shards
// on host b; dispatch and answers cross the veth, allreduce's partials go between the
// shards on host b, both over the transport under test.
TEST_P(TwoHostTest, TpExpertShardsOnTheOtherHostMatchTheColocatedEngine) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 12u);
  const std::string hosts = write_file("netns_hosts_tp", "10.77.0.1 slots=2\n10.77.0.2 slots=2\n");
  // "": no mode given; rank 0 takes the planner model's choice for its machine
  // and the ranks on host b take rank 0's.
  for (const std::string mode : {"attention-sum", "allreduce", ""}) {
    const std::string err =
        ::testing::TempDir() + "/two_host_tp_stderr_" + std::to_string(::getpid());
    const std::string cmd =
        mpirun(hosts, "-np 4 " + kBinary + " generate " + prompt) +
        " --attention-workers 1 --expert-workers 1 --micro-batches 2 --tp-expert 2 " +
        (mode.empty() ? "" : "--tp-expert-reduce " + mode) + " --fabric-provider " + GetParam() +
        " --json 2>" + err;
    const std::string out = msinfer::testing::run_capture(cmd);
    std::stringstream e;
    e << std::ifstream(err).rdbuf();
    auto j = parse_json(out, "mpirun generate --json");
    ASSERT_TRUE(j.ok()) << mode << "\nstdout: " << out.substr(0, 300) << "\nstderr: " << e.str();
    // Shards sum the down projection in another order than one GEMM; on the
    // tiny presets the tokens are still identical (expert_tp_test allows a
    // near-tie and documents it).
    EXPECT_EQ((*j)["token_ids"].get<std::vector<int32_t>>(), ref) << mode << e.str();
    EXPECT_NE(e.str().find("expert worker 0 tp rank 1: rank 3 on"), std::string::npos) << e.str();
    EXPECT_NE(e.str().find("(10.77.0.2, pid"), std::string::npos) << e.str();
    EXPECT_EQ(e.str().find("the planner's model on this machine") != std::string::npos,
              mode.empty())
        << e.str();
  }
  // The ranks run rank 0's mode whatever their own flags say (rank 0 may have
  // chosen by probing its machine): rank 0 says allreduce, ranks 1-3 are
  // started with attention-sum, and the shards still reduce to shard 0.
  const std::string common =
      " bench serve --offline --model " + dir +
      " --num-prompts 2 --input-len 7 --output-len 4 --attention-workers 1 --expert-workers 1"
      " --micro-batches 2 --tp-expert 2 --fabric-provider " +
      GetParam() + " --json --tp-expert-reduce ";
  const std::string out = msinfer::testing::run_capture(
      mpirun(hosts, "-np 1 " + kBinary + common + "allreduce : -np 3 " + kBinary + common +
                        "attention-sum 2>/dev/null"));
  auto j = parse_json(out, "mpirun bench serve --json");
  ASSERT_TRUE(j.ok()) << "stdout: " << out.substr(0, 300);
  const auto& workers = (*j)["workers"];
  ASSERT_EQ(workers.size(), 3u) << j->dump();
  EXPECT_EQ(workers[2]["tp_rank"], 1) << j->dump();
  EXPECT_GT(workers[2]["tp_reduce_bytes_sent"].get<int64_t>(), 0) << j->dump();
  EXPECT_EQ(workers[2]["m2n_bytes_sent"], 0) << j->dump();
}

// Attention tensor parallelism across hosts (issue 14): an attention replica
// of two ranks split over the two hosts (rank 0 with the router on host a,
// rank 1 and the expert worker on host b), so the replica's per-layer
// exchange crosses the veth; then (tp_a, tp_e) = (2, 2) with the replica on
// host a and the expert worker's two shards (allreduce) on host b.
TEST_P(TwoHostTest, TpAttentionRanksAcrossHostsMatchTheColocatedEngine) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 12u);
  struct Case {
    std::string hosts, np, flags, where;
  };
  const Case cases[] = {{"10.77.0.1 slots=2\n10.77.0.2 slots=2\n", "4", "--tp-attention 2",
                         "attention worker 0 tp rank 1: rank 2 on"},
                        {"10.77.0.1 slots=3\n10.77.0.2 slots=2\n", "5",
                         "--tp-attention 2 --tp-expert 2 --tp-expert-reduce allreduce",
                         "expert worker 0 tp rank 1: rank 4 on"}};
  for (const Case& c : cases) {
    const std::string hosts = write_file("netns_hosts_atp", c.hosts);
    const std::string err =
        ::testing::TempDir() + "/two_host_atp_stderr_" + std::to_string(::getpid());
    const std::string cmd = mpirun(hosts, "-np " + c.np + " " + kBinary + " generate " + prompt) +
                            " --attention-workers 1 --expert-workers 1 --micro-batches 2 " +
                            c.flags + " --fabric-provider " + GetParam() + " --json 2>" + err;
    const std::string out = msinfer::testing::run_capture(cmd);
    std::stringstream e;
    e << std::ifstream(err).rdbuf();
    auto j = parse_json(out, "mpirun generate --json");
    ASSERT_TRUE(j.ok()) << c.flags << "\nstdout: " << out.substr(0, 300) << "\nstderr: " << e.str();
    // The ranks' o_proj partials add in another order than one GEMM; on the
    // tiny preset the tokens are still identical (attention_tp_test allows a
    // near-tie and documents it).
    EXPECT_EQ((*j)["token_ids"].get<std::vector<int32_t>>(), ref) << c.flags << e.str();
    EXPECT_NE(e.str().find(c.where), std::string::npos) << e.str();
    EXPECT_NE(e.str().find("(10.77.0.2, pid"), std::string::npos) << e.str();
  }
}

// Issue 14's matrix across the two hosts: (tp_a, tp_e) in {(2, 1), (1, 2),
// (2, 2)}, both expert reductions, m in {1, 2}, both tiny presets; the tests
// above cover tiny-mixtral at m = 2 over both transports, this covers the rest
// over the socket transport (the tcp provider takes the same runtime paths).
// Every tp group spans the hosts or sits across from its peers: with 2 + 2
// slots, an attention replica's rank 1 is on host b; with 3 + 2, the expert
// worker's shards are.
TEST_P(TwoHostTest, TpMatrixAcrossHostsMatchesTheColocatedEngine) {
  if (GetParam() != "socket") GTEST_SKIP() << "covered over the socket transport";
  struct Case {
    std::string flags;
    int processes;  // attention ranks + expert ranks
  };
  const Case cases[] = {{"--tp-attention 2", 3},
                        {"--tp-expert 2 --tp-expert-reduce attention-sum", 3},
                        {"--tp-expert 2 --tp-expert-reduce allreduce", 3},
                        {"--tp-attention 2 --tp-expert 2 --tp-expert-reduce attention-sum", 4},
                        {"--tp-attention 2 --tp-expert 2 --tp-expert-reduce allreduce", 4}};
  for (const std::string preset : {"tiny-mixtral", "tiny-qwen3moe"}) {
    const std::string dir = testing::test_model_dir(preset);
    const std::vector<int32_t> prompt_ids = {5, 9, 22, 40, 7, 8, 11};
    const std::string prompt =
        "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
    const auto ref = tokens_of(prompt);
    ASSERT_EQ(ref.size(), 12u) << preset;
    for (const int m : {1, 2}) {
      for (const Case& c : cases) {
        // Covered by the tests above: all but (2, 2) with attention-sum.
        const bool covered =
            preset == "tiny-mixtral" && m == 2 &&
            !(c.processes == 4 && c.flags.find("attention-sum") != std::string::npos);
        if (covered) continue;
        const std::string what = preset + " m " + std::to_string(m) + " " + c.flags;
        const std::string hosts = write_file(
            "netns_hosts_matrix", c.processes == 4 ? "10.77.0.1 slots=3\n10.77.0.2 slots=2\n"
                                                   : "10.77.0.1 slots=2\n10.77.0.2 slots=2\n");
        const std::string err =
            ::testing::TempDir() + "/two_host_matrix_stderr_" + std::to_string(::getpid());
        const std::string out = msinfer::testing::run_capture(mpirun(
            hosts, "-np " + std::to_string(c.processes + 1) + " " + kBinary + " generate " +
                       prompt + " --attention-workers 1 --expert-workers 1 --micro-batches " +
                       std::to_string(m) + " " + c.flags + " --fabric-provider socket --json 2>" +
                       err));
        std::stringstream e;
        e << std::ifstream(err).rdbuf();
        auto j = parse_json(out, "mpirun generate --json");
        ASSERT_TRUE(j.ok()) << what << "\nstdout: " << out.substr(0, 300)
                            << "\nstderr: " << e.str();
        testing::expect_equal_up_to_near_tie(ref, (*j)["token_ids"].get<std::vector<int32_t>>(),
                                             dir, prompt_ids, what);
        EXPECT_NE(e.str().find("(10.77.0.2, pid"), std::string::npos) << what << e.str();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, TwoHostTest, ::testing::Values("socket", "tcp"));

}  // namespace
}  // namespace msinfer::runtime
