// Runs the msinfer binary as a user would and checks its output and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "msinfer/core/json.h"

namespace msinfer {
namespace {

struct CliRun {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

CliRun run(const std::string& args) {
  // Per process: ctest runs the tests of this file as parallel processes.
  std::string err_path = ::testing::TempDir() + "/cli_test_stderr_" + std::to_string(::getpid()) + ".txt";
  std::string cmd = std::string(MSINFER_BINARY) + " " + args + " 2>" + err_path;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::stringstream ss;
  ss << std::ifstream(err_path).rdbuf();
  r.err = ss.str();
  return r;
}

Json parse(const std::string& s) {
  auto j = parse_json(s, "stdout");
  EXPECT_TRUE(j.ok()) << j.status().to_string() << "\n" << s.substr(0, 400);
  return j.ok() ? *j : Json();
}

TEST(CliTest, PlanJsonHasSpecObjectAndFinishesFast) {
  auto t0 = std::chrono::steady_clock::now();
  CliRun r = run("plan --model mixtral-8x22b --gpu A100 --json");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = parse(r.out);
  EXPECT_EQ(j["plan"]["attention_gpu"], "A100-80G");
  EXPECT_GE(j["plan"]["attention_nodes"].get<int>(), 1);
  EXPECT_GT(j["predicted"]["throughput_per_cost"].get<double>(), 0);
  EXPECT_LE(j["predicted"]["tbt_ms"].get<double>(), 150.0);
  EXPECT_EQ(j["alternatives"].size(), 5u);
  EXPECT_EQ(j["baselines"].size(), 2u);
  EXPECT_TRUE(j["constraints"]["slo"]["holds"].get<bool>());
  // The default workload is the paper's trace: context 571 + 159/2.
  EXPECT_EQ(j["search"]["workload"]["name"], "paper-trace");
  EXPECT_DOUBLE_EQ(j["search"]["seq_len"].get<double>(), 650.5);
  // Not a timing assertion on the search (the issue's "under a second" is
  // reported in docs/BENCHMARKS.md); only a guard against a runaway search.
  EXPECT_LT(s, 30.0);
}

TEST(CliTest, HeteroPlanPicksFromTheGivenGpus) {
  CliRun r = run("plan --model mixtral-8x22b --hetero --gpus L20,L40S,H20,A800,H800 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = parse(r.out);
  EXPECT_EQ(j["search"]["gpu_pairs"], 25);
  for (const char* k : {"attention_gpu", "expert_gpu"}) {
    std::string g = j["plan"][k];
    EXPECT_TRUE(g == "L20" || g == "L40S" || g == "H20" || g == "A800" || g == "H800") << g;
  }
}

TEST(CliTest, ExplainShowsTheDecidingTermsAgainstTheRunnerUpPair) {
  CliRun r = run("plan --model mixtral-8x22b --hetero --gpus L40S,H20 --explain --top 1");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"runner-up GPU pair", "expert: weight streaming ms", "expert TP reduction",
                        "TBT ms / SLO ms", "ideal co-located bounds"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
}

TEST(CliTest, HumanOutputIsATable) {
  CliRun r = run("plan --model dbrx --gpu H20 --top 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Best plan:"), std::string::npos);
  EXPECT_NE(r.out.find("tok/s/cost"), std::string::npos);
  EXPECT_NE(r.out.find("tensor-parallel"), std::string::npos);
  EXPECT_NE(r.out.find("expert-parallel"), std::string::npos);
}

TEST(CliTest, PlanOutThenSimulatePlanAgrees) {
  std::string plan = ::testing::TempDir() + "/cli_test_plan.json";
  std::string gantt = ::testing::TempDir() + "/cli_test_gantt.svg";
  CliRun p = run("plan --model mixtral-8x22b --gpu A100 --out " + plan);
  ASSERT_EQ(p.code, 0) << p.err;
  CliRun s = run("simulate --plan " + plan + " --json --gantt " + gantt);
  ASSERT_EQ(s.code, 0) << s.err;
  Json j = parse(s.out);
  EXPECT_NEAR(j["predicted"]["tbt_ms"].get<double>() / j["closed_form"]["tbt_ms"].get<double>(),
              1.0, 0.01);
  EXPECT_GT(j["predicted"]["attention_busy"].get<double>(), 0.5);
  std::ifstream g(gantt);
  EXPECT_TRUE(g.good());
  std::remove(plan.c_str());
  std::remove(gantt.c_str());
}

TEST(CliTest, SweepJsonRowsCarryTheParameterAndPredictedFields) {
  CliRun r = run("simulate --model mixtral-8x22b --gpu A100 --sweep attention-nodes=1..4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = parse(r.out);
  ASSERT_EQ(j["sweep"].size(), 4u);
  int64_t b0 = j["sweep"][0]["global_batch"];
  for (int i = 0; i < 4; ++i) {
    const Json& row = j["sweep"][i];
    EXPECT_EQ(row["attention_nodes"], i + 1);
    EXPECT_EQ(row["global_batch"].get<int64_t>(), b0 * (i + 1));
    for (const char* k : {"throughput_tokens_per_s", "throughput_per_gpu", "throughput_per_cost",
                          "tbt_ms", "t_attention_ms", "t_expert_ms", "t_comm_ms"}) {
      EXPECT_TRUE(row.contains(k)) << k;
    }
  }
  CliRun m = run("simulate --model mixtral-8x22b --gpu A100 --sweep micro-batches=1..3 --json");
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(parse(m.out)["sweep"][2]["micro_batches"], 3);
}

TEST(CliTest, BadInputGetsOneLineErrorAndNonZeroExit) {
  struct Case {
    std::string args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {"plan --model mixtral-8x22b --gpu A100 --slo-ms abc", "--slo-ms"},
           {"plan --model mixtral-8x22b --gpu Z9000", "GPU 'Z9000'"},
           {"plan --model nope --gpu A100", "model 'nope'"},
           {"plan --gpu A100", "--model is required"},
           {"plan --model dbrx", "--gpu is required"},
           {"plan --model dbrx --gpu A100 --bogus 1", "unknown flag --bogus"},
           {"plan --model dbrx --gpu A100 --objective speed", "--objective"},
           {"plan --model dbrx --gpu A100 --catalog /nonexistent.json", "/nonexistent.json"},
           {"plan --model dbrx --gpu A100 --slo-ms 0.001", "no deployment of dbrx"},
           {"plan --model dbrx --gpu A100 --seq-len 700 --input-len 500", "--seq-len"},
           {"plan --model dbrx --gpu A100 --workload chat", "paper-trace"},
           {"simulate --plan /nonexistent/plan.json", "/nonexistent/plan.json"},
           {"simulate --model dbrx --gpu A100 --imbalance pareto:1", "--imbalance"},
           {"simulate --model dbrx --gpu A100 --sweep layers=1..3", "--sweep"},
           {"frobnicate", "unknown command"},
       }) {
    CliRun r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << " -> " << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1)
        << c.args << " -> " << r.err;
  }
}

// bench m2n re-launches itself under mpirun: every transport's rows come
// with the two MPI baselines, one-way latencies and throughput.
TEST(CliTest, BenchM2nComparesEachTransportWithMpi) {
  if (std::system("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "needs mpirun (openmpi-bin)";
  // Open MPI leaks at exit (MPI_Init's allocations); under AddressSanitizer
  // that would fail every rank, so the ranks run without leak checking.
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  for (const std::string provider : {"direct", "socket", "shm", "tcp"}) {
    CliRun r = run("bench m2n --senders 2 --receivers 1 --size 2k,40000 --iters 5 --provider " +
                   provider + " --json");
    ASSERT_EQ(r.code, 0) << provider << ": " << r.err;
    Json j = parse(r.out);
    ASSERT_TRUE(j.contains("results")) << r.out;
    ASSERT_EQ(j["results"].size(), 6u) << r.out;  // 2 sizes x (msinfer, mpi-p2p, mpi-alltoallv)
    std::vector<std::string> names;
    for (const auto& row : j["results"]) {
      names.push_back(row["name"].get<std::string>());
      EXPECT_EQ(row["senders"].get<int>(), 2);
      EXPECT_EQ(row["receivers"].get<int>(), 1);
      EXPECT_TRUE(row["size"].get<int64_t>() == 2048 || row["size"].get<int64_t>() == 40000) << row.dump();
      EXPECT_GT(row["p50_us"].get<double>(), 0) << row.dump();
      EXPECT_GE(row["p99_us"].get<double>(), row["p50_us"].get<double>()) << row.dump();
      EXPECT_GT(row["gbps"].get<double>(), 0) << row.dump();
      const std::string want = row["name"] == "msinfer"                              ? provider
                               : (provider == "tcp" || provider == "socket") ? "tcp"
                                                                             : "vader";
      EXPECT_EQ(row["provider"].get<std::string>(), want) << row.dump();
    }
    EXPECT_EQ(std::count(names.begin(), names.end(), "msinfer"), 2);
    EXPECT_EQ(std::count(names.begin(), names.end(), "mpi-p2p"), 2);
    EXPECT_EQ(std::count(names.begin(), names.end(), "mpi-alltoallv"), 2);
  }
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"bench m2n --provider ib", "--provider"},
           {"bench m2n --senders 0", "--senders"},
           {"bench m2n --size 12q", "12q"},
           {"bench m2n --imbalance zipf:0", "zipf"},
       }) {
    CliRun r = run(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << " -> " << r.err;
  }
}

TEST(CliTest, HelpExplainsFlags) {
  for (const char* cmd : {"plan", "simulate"}) {
    CliRun r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("--slo-ms"), std::string::npos) << cmd;
    EXPECT_NE(r.out.find("examples:"), std::string::npos) << cmd;
  }
  CliRun r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("simulate"), std::string::npos);
}

TEST(CliTest, MalformedCatalogNamesEntryAndField) {
  std::string path = ::testing::TempDir() + "/cli_test_catalog.json";
  std::ofstream(path) << R"({"defaults": {"nic_util_curve": [[1024, 0.5]]},
    "gpus": [{"name": "G1", "bf16_tflops": 100, "memory_gb": 80, "memory_bandwidth_gb_s": 2000,
              "nic_gbit_s": 200, "gpus_per_node": 8, "intra_node_gb_s": 300, "price": 1}]})";
  CliRun r = run("plan --model dbrx --gpu G1 --catalog " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("gpus[0] (G1): field 'tdp_w' is missing"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace msinfer

namespace msinfer {
namespace {

TEST(CliEngineTest, MakeModelThenGenerateStreamsAndReports) {
  const std::string dir = ::testing::TempDir() + "/cli_test_model";
  CliRun m = run("make-model --preset tiny-qwen3moe --out " + dir);
  ASSERT_EQ(m.code, 0) << m.err;
  CliRun g = run("generate --model " + dir + " --prompt \"Hello world\" --max-tokens 5 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  Json j = parse(g.out);
  EXPECT_EQ(j["token_ids"].size(), 5u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_TRUE(j.contains("ttft_ms"));
  EXPECT_TRUE(j.contains("decode_tokens_per_s"));
  // Seeded sampling is reproducible.
  const std::string s = "generate --model " + dir + " --prompt-ids 5,6,7 --max-tokens 8 "
                        "--temperature 0.9 --seed 11 --json";
  EXPECT_EQ(parse(run(s).out)["token_ids"], parse(run(s).out)["token_ids"]);
  CliRun human = run("generate --model " + dir + " --prompt Hello --max-tokens 4");
  ASSERT_EQ(human.code, 0);
  EXPECT_NE(human.out.find("TTFT"), std::string::npos);
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"generate --model " + dir + " --prompt-ids 1,x", "--prompt-ids"},
           {"generate --model " + dir, "exactly one of --prompt and --prompt-ids"},
           {"generate --model /nonexistent --prompt hi", "/nonexistent"},
           {"generate --model " + dir + " --prompt hi --max-tokens 100000", "exceeds"},
           {"make-model --preset huge --out /tmp/x", "--preset 'huge'"},
       }) {
    CliRun r = run(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << " -> " << r.err;
  }
}

}  // namespace
}  // namespace msinfer
