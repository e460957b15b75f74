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
#include <sstream>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "test_models.h"

namespace msinfer::runtime {
namespace {

const std::string kBinary = MSINFER_BINARY;

std::vector<int32_t> tokens_of(const std::string& args) {
  const std::string err =
      ::testing::TempDir() + "/disaggregated_test_stderr_" + std::to_string(::getpid()) + ".txt";
  const std::string out =
      msinfer::testing::run_capture(kBinary + " generate " + args + " --json 2>" + err);
  auto j = parse_json(out, "generate --json");
  std::stringstream e;
  e << std::ifstream(err).rdbuf();
  EXPECT_TRUE(j.ok()) << args << "\nstdout: " << out.substr(0, 300) << "\nstderr: " << e.str();
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
  const std::string two = write_file(
      "two_workers.json", R"({"expert_workers": 2, "experts": [0, 1, 0, 1, 0, 1, 0, 1]})");
  const std::string refused =
      msinfer::testing::run_capture("sh -c '" + kBinary + " generate " + prompt + " --plan " +
                                    plan + " --placement " + two + " 2>&1; echo exit=$?'");
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

// Killing a worker of either kind mid-generation: the request ends with an
// error naming it, within the M2N timeout; every other process exits; nothing
// hangs.
class DisaggregatedKillTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DisaggregatedKillTest, AKilledWorkerIsNamedAndEverythingStops) {
  const std::string victim_role = GetParam();
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  pid_t victim = -1;
  std::chrono::steady_clock::time_point killed_at;
  const auto run = msinfer::testing::watch_router(
      {kBinary, "generate", "--model", dir, "--prompt-ids", "5,9,22", "--max-tokens", "3500",
       "--ignore-eos", "--attention-workers", "2", "--expert-workers", "2", "--micro-batches", "2",
       "--timeout-ms", "2000"},
      [&](const char* line, const std::map<std::string, pid_t>& pids) {
        if (victim < 0 && std::strstr(line, "msinfer: step 32") != nullptr &&
            pids.count(victim_role + "1")) {
          victim = pids.at(victim_role + "1");
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
  EXPECT_NE(all.find(victim_role + " worker 1"), std::string::npos) << all;
  EXPECT_NE(all.find("request 1"), std::string::npos) << all;
  EXPECT_LT(seconds, 2.0 + 10.0) << "not detected within the M2N timeout";
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

INSTANTIATE_TEST_SUITE_P(Roles, DisaggregatedKillTest, ::testing::Values("expert", "attention"));

// bench serve through a 1 + 2 deployment: every token accounted for, and the
// workers' counters agree with each other (each token of a decode step visits
// top_k experts in every layer, and every visit is one expert row).
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

  std::string ns_a_, ns_b_, agent_, hostfile_;
  bool created_ = false;
};

TEST_P(TwoHostTest, MpirunDeploymentBetweenNamespacesMatchesTheColocatedEngine) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string prompt =
      "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 12 --ignore-eos";
  const auto ref = tokens_of(prompt);
  ASSERT_EQ(ref.size(), 12u);
  // Both namespaces share this machine's hostname and /dev/shm, which confuses
  // Open MPI's shared-memory transport (only the rendezvous goes through MPI):
  // real hosts need no `--mca btl`.
  const std::string err = ::testing::TempDir() + "/two_host_stderr_" + std::to_string(::getpid());
  // Open MPI leaks at exit (MPI_Init's allocations, its plugins'); under
  // AddressSanitizer LeakSanitizer would fail every rank for them, so leak
  // checking is off for this job only (every other test keeps it).
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
      "timeout -s KILL 120 ip netns exec " +
      ns_a_ + " mpirun -x ASAN_OPTIONS --hostfile " + hostfile_ + " -np 5 --mca plm_rsh_agent " +
      agent_ +
      " --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl "
      "self,tcp " +
      kBinary + " generate " + prompt +
      " --attention-workers 2 --expert-workers 2 --micro-batches 2 --fabric-provider " +
      GetParam() + " --json 2>" + err;
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
  for (const std::string mode : {"attention-sum", "allreduce"}) {
    const std::string err =
        ::testing::TempDir() + "/two_host_tp_stderr_" + std::to_string(::getpid());
    const std::string cmd =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
        "timeout -s KILL 120 ip netns exec " +
        ns_a_ + " mpirun -x ASAN_OPTIONS --hostfile " + hosts + " -np 4 --mca plm_rsh_agent " +
        agent_ +
        " --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl "
        "self,tcp " +
        kBinary + " generate " + prompt +
        " --attention-workers 1 --expert-workers 1 --micro-batches 2 --tp-expert 2 "
        "--tp-expert-reduce " +
        mode + " --fabric-provider " + GetParam() + " --json 2>" + err;
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
  }
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
    const std::string cmd =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
        "timeout -s KILL 120 ip netns exec " +
        ns_a_ + " mpirun -x ASAN_OPTIONS --hostfile " + hosts + " -np " + c.np +
        " --mca plm_rsh_agent " + agent_ +
        " --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl "
        "self,tcp " +
        kBinary + " generate " + prompt +
        " --attention-workers 1 --expert-workers 1 --micro-batches 2 " + c.flags +
        " --fabric-provider " + GetParam() + " --json 2>" + err;
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

INSTANTIATE_TEST_SUITE_P(Transports, TwoHostTest, ::testing::Values("socket", "tcp"));

}  // namespace
}  // namespace msinfer::runtime
