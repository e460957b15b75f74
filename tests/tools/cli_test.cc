// Runs the msinfer binary as a user would and checks its output and exit codes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"

namespace msinfer {
namespace {

using testing::CliRun;

CliRun run(const std::string& args) { return testing::run_cli(MSINFER_BINARY, args); }

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
      // 40000 is not a multiple of 2048: every byte labelled is still sent.
      ASSERT_TRUE(row.contains("row_bytes")) << row.dump();
      EXPECT_EQ(row["size"].get<int64_t>() % row["row_bytes"].get<int64_t>(), 0) << row.dump();
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
  for (const char* cmd : {"generate", "serve", "bench serve"}) {
    CliRun h = run(std::string(cmd) + " --help");
    EXPECT_EQ(h.code, 0) << cmd;
    EXPECT_NE(h.out.find("--shared-experts"), std::string::npos) << cmd;
    EXPECT_NE(h.out.find("always-selected expert"), std::string::npos) << cmd;
  }
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
  // The longest gap between tokens is at least the median one.
  EXPECT_GE(j["tbt_ms_max"].get<double>(), j["tbt_ms_p50"].get<double>());
  EXPECT_GT(j["tbt_ms_max"].get<double>(), 0);
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
    // Bad input, each of them: exit 2 (a prompt + --max-tokens beyond the
    // context was 1, a run-time failure, issue 43).
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << " -> " << r.err;
  }
}

}  // namespace
}  // namespace msinfer

// ---- Issue 12: every command refuses bad input before it works, reports
// failures truthfully (exit 2 bad input, 1 at run time), and says errors in JSON
// under --json.
namespace msinfer {
namespace {

// A tiny model written once per test process (a second or two).
const std::string& tiny_model() {
  static const std::string dir = [] {
    std::string d = ::testing::TempDir() + "/cli_test_tiny_" + std::to_string(::getpid());
    CliRun m = run("make-model --preset tiny-mixtral --out " + d);
    EXPECT_EQ(m.code, 0) << m.err;
    // Removed at exit (the path outlives the static it was copied from).
    static const std::string* path = new std::string(d);
    std::atexit([] { std::filesystem::remove_all(*path); });
    return d;
  }();
  return dir;
}

// --threads sets the kernels' thread count: generation runs and gives the same
// greedy tokens on 1 and 2 threads; a count out of range is refused.
TEST(CliEngineTest, ThreadsFlag) {
#ifdef __SANITIZE_THREAD__
  // Two OpenMP threads: libgomp is not instrumented, so TSan reports its pool
  // as races in every kernel (why .ci/run's TSan pass runs OMP_NUM_THREADS=1).
  GTEST_SKIP() << "OpenMP threads under ThreadSanitizer";
#endif
  const std::string g = "generate --model " + tiny_model() +
                        " --prompt-ids 5,9,22 --max-tokens 12 --ignore-eos --json";
  CliRun one = run(g + " --threads 1");
  CliRun two = run(g + " --threads 2");
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(two.code, 0) << two.err;
  const Json a = parse(one.out), b = parse(two.out);
  EXPECT_EQ(a["token_ids"].size(), 12u);
  EXPECT_EQ(a["token_ids"], b["token_ids"]);
}

// Runs `args` plain and with --json: both exit with `code`, stderr is one line
// holding `expect`, and under --json stdout is {"error": {"message", "code"}}.
// (`worker`, started by the router only, has no --json.)
void expect_refused(const std::string& args, const std::string& expect, int code = 2) {
  SCOPED_TRACE(args);
  CliRun r = run(args);
  EXPECT_EQ(r.code, code) << r.err;
  EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  if (args.rfind("worker ", 0) == 0) return;
  CliRun j = run(args + " --json");
  EXPECT_EQ(j.code, code) << j.err;
  auto doc = parse_json(j.out, "stdout");
  ASSERT_TRUE(doc.ok()) << "no JSON error on stdout: '" << j.out << "'";
  ASSERT_TRUE(doc->contains("error")) << j.out;
  EXPECT_NE((*doc)["error"]["message"].get<std::string>().find(expect), std::string::npos) << j.out;
  EXPECT_EQ((*doc)["error"]["exit_code"], code);
  EXPECT_TRUE((*doc)["error"]["code"].is_string());
}

// --block-size pages every engine of the deployment (the attention tp ranks'
// caches and block-table messages too) in blocks of that many tokens: the
// same greedy tokens at every size, and a prefix shorter than the default
// block is reused in smaller ones.
TEST(CliEngineTest, BlockSizeGivesTheSameTokensAndReusesShorterPrefixes) {
  const std::string g = "generate --model " + tiny_model() +
                        " --prompt-ids 5,9,22,7,1,40,3,8,9,10,11,12,13,14,15,16,17 --max-tokens 12"
                        " --ignore-eos --json";
  CliRun base = run(g);
  ASSERT_EQ(base.code, 0) << base.err;
  const Json want = parse(base.out)["token_ids"];
  EXPECT_EQ(want.size(), 12u);
  for (const std::string& deployment :
       {std::string(""), std::string(" --attention-workers 1 --expert-workers 1"),
        std::string(" --attention-workers 1 --expert-workers 1 --tp-attention 2")}) {
    for (const char* size : {"1", "5", "16"}) {
      // Attention tp sends each token's block table with the step: a
      // one-token block makes it as long as the context, beyond the message.
      const std::string budget =
          deployment.find("--tp-attention") != std::string::npos && size == std::string("1")
              ? " --max-num-batched-tokens 64"
              : "";
      CliRun r = run(g + deployment + " --block-size " + size + budget);
      ASSERT_EQ(r.code, 0) << deployment << " --block-size " << size << ": " << r.err;
      EXPECT_EQ(parse(r.out)["token_ids"], want) << deployment << " --block-size " << size;
    }
  }
  // Two chats of two turns behind a 40-token system prompt: in 128-token
  // blocks nothing is whole to reuse; in 16-token ones the system prompt's
  // first 32 tokens and more are.
  const std::string b = "bench serve --offline --model " + tiny_model() +
                        " --dataset multi-turn --users 2 --turns 2 --system-len 40 --input-len 8"
                        " --output-len 4 --json";
  CliRun big = run(b);
  CliRun small = run(b + " --block-size 16");
  ASSERT_EQ(big.code, 0) << big.err;
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_EQ(parse(big.out)["prefix_cache_hit_tokens"].get<int64_t>(), 0);
  EXPECT_GE(parse(small.out)["prefix_cache_hit_tokens"].get<int64_t>(), 3 * 32);
  expect_refused("generate --model " + tiny_model() + " --prompt hi --block-size 0",
                 "--block-size: 0 is out of range");
  expect_refused("generate --model " + tiny_model() +
                     " --prompt-ids 5 --attention-workers 1 --expert-workers 1 --tp-attention 2"
                     " --block-size 1",
                 "(--block-size) ids");
}

// --max-num-batched-tokens is the engine's step budget in generate, bench
// serve and a deployment's workers: a prompt goes in in chunks of it, with
// the same greedy tokens at every budget; bench serve takes more steps with
// a smaller one.
TEST(CliEngineTest, MaxNumBatchedTokensChunksPromptsWithTheSameOutput) {
  const std::string g = "generate --model " + tiny_model() +
                        " --prompt-ids 5,9,22,7,1,40,3,8,9,10,11,12,13,14,15,16,17 --max-tokens 6"
                        " --ignore-eos --json";
  CliRun base = run(g);
  ASSERT_EQ(base.code, 0) << base.err;
  const Json want = parse(base.out)["token_ids"];
  EXPECT_EQ(want.size(), 6u);
  for (const std::string& extra :
       {std::string(" --max-num-batched-tokens 1"), std::string(" --max-num-batched-tokens 5"),
        std::string(" --max-num-batched-tokens 5 --attention-workers 1 --expert-workers 1")}) {
    CliRun r = run(g + extra);
    ASSERT_EQ(r.code, 0) << extra << ": " << r.err;
    EXPECT_EQ(parse(r.out)["token_ids"], want) << extra;
  }
  const std::string b = "bench serve --offline --model " + tiny_model() +
                        " --num-prompts 4 --input-len 32 --output-len 4 --json";
  CliRun small = run(b + " --max-num-batched-tokens 8");
  CliRun large = run(b + " --max-num-batched-tokens 1024");
  ASSERT_EQ(small.code, 0) << small.err;
  ASSERT_EQ(large.code, 0) << large.err;
  // 128 prompt tokens: 16 steps of 8 before the last decode steps, against one.
  EXPECT_GE(parse(small.out)["steps"].get<int>(), 16 + 3);
  EXPECT_EQ(parse(large.out)["steps"].get<int>(), 1 + 3);
  expect_refused("generate --model " + tiny_model() + " --prompt hi --max-num-batched-tokens 0",
                 "--max-num-batched-tokens: 0 is out of range");
  expect_refused("generate --model " + tiny_model() +
                     " --prompt-ids 5 --attention-workers 1 --expert-workers 1"
                     " --max-num-batched-tokens 40000",
                 "--max-num-batched-tokens 40000 is more than this deployment's M2N messages");
}

TEST(CliHardeningTest, IntegerFlagsAreNotTruncatedTo32Bits) {
  expect_refused("plan --model dbrx --gpu H800 --max-gpus 4294967297",
                 "--max-gpus: 4294967297 is out of range");
  expect_refused("simulate --model dbrx --gpu H800 --attention-nodes 4294967297",
                 "--attention-nodes: 4294967297 is out of range");
  expect_refused("simulate --model dbrx --gpu H800 --micro-batches 4294967298",
                 "--micro-batches: 4294967298 is out of range");
  expect_refused("make-model --preset tiny-mixtral --out /tmp/x --shards 4294967298",
                 "--shards: 4294967298 is out of range");
  expect_refused(
      "generate --model /nonexistent --prompt hi --attention-workers 4294967297 "
      "--expert-workers 1",
      "--attention-workers: 4294967297 is out of range");
  expect_refused("plan --model dbrx --gpu H800 --max-gpus 0x10", "--max-gpus: expected an integer");
  expect_refused("plan --model dbrx --gpu H800 --top 1.5", "--top: expected an integer");
  expect_refused("plan --model dbrx --gpu H20 --gpu H800", "--gpu given twice");
  expect_refused("plan --model dbrx --gpu H800 --slo-ms inf", "--slo-ms: expected a number");
}

// Item 7: every flag is checked before the model loads; the model path here
// does not exist, so only a flag check that comes first names the flag.
TEST(CliHardeningTest, FlagsAreCheckedBeforeAnyExpensiveWork) {
  const std::string g = "generate --model /nonexistent/m --prompt hi ";
  expect_refused(g + "--top-p 2", "--top-p: 2 is out of range");
  expect_refused(g + "--top-p 0", "--top-p must be in (0, 1]");
  expect_refused(g + "--temperature -1", "--temperature: -1 is out of range");
  expect_refused(g + "--max-tokens -1", "--max-tokens: -1 is out of range");
  expect_refused("generate --model /nonexistent/m --prompt-ids a,b", "--prompt-ids");
  expect_refused(g + "--fabric-provider bogus --attention-workers 1 --expert-workers 1",
                 "unknown provider 'bogus'");
  expect_refused(g + "--attention-workers 2",
                 "needs both --attention-workers and --expert-workers");
  expect_refused(g + "--attention-workers 1 --expert-workers 1 --shared-experts both",
                 "--shared-experts: expected attention or expert, got 'both'");
  expect_refused(g + "--shared-experts expert",
                 "--shared-experts needs a disaggregated deployment");
  expect_refused(
      "bench serve --offline --model /nonexistent/m --attention-workers 1 "
      "--expert-workers 1 --shared-experts x",
      "--shared-experts: expected attention or expert");
  expect_refused(g, "--model /nonexistent/m: no such model directory");
  // int8 / w8a8 are CPU kernels: refused where every GEMM would run on a GPU
  // (a check of the flags alone: a machine without a GPU refuses it the same way).
  const std::string t = "generate --model " + tiny_model() + " --prompt hi ";
  expect_refused(t + "--weights w8a8 --device cuda", "--weights w8a8 is for the CPU engine");
  expect_refused(t + "--weights int8 --device cuda:0", "--weights int8 is for the CPU engine");
  expect_refused(t + "--weights w4", "--weights: unknown weight format 'w4'");
  const std::string p = "profile --model " + tiny_model() + " ";
  expect_refused(p + "--seconds -1", "--seconds: -1 is out of range");
  expect_refused(p + "--out /nonexistent/p.json", "directory /nonexistent does not exist");
  const std::string b = "bench serve --offline --model /nonexistent/m ";
  expect_refused(b + "--kv-cache-mb 0", "--kv-cache-mb: 0 is out of range");
  expect_refused(b + "--idle-seconds -1", "--idle-seconds: -1 is out of range");
  expect_refused(b + "--idle-seconds 1e9", "--idle-seconds: 1e9 is out of range");
  // Item 9: the cap is named, not "must be >= 1".
  expect_refused(b + "--num-prompts 1000000000", "(valid: 1..100000)");
  expect_refused("simulate --model dbrx --gpu A100 --gantt /nonexistent/g.svg",
                 "--gantt /nonexistent/g.svg: directory /nonexistent does not exist");
  expect_refused("plan --model dbrx --gpu A100 --out /", "--out /: is a directory");
}

// Every subcommand answers bad input with exit 2 and, under --json, a JSON error.
TEST(CliHardeningTest, EverySubcommandRefusesBadInput) {
  expect_refused("plan --model dbrx --gpu A100 --bogus 1", "unknown flag --bogus");
  expect_refused("simulate --plan /nonexistent/plan.json", "/nonexistent/plan.json");
  expect_refused("make-model --preset huge --out /tmp/x", "--preset 'huge'");
  expect_refused("make-model --preset tiny-mixtral", "--out is required");
  expect_refused("generate --model " + tiny_model(), "exactly one of --prompt and --prompt-ids");
  expect_refused("generate --model " + tiny_model() + " --prompt-ids 5 --threads -1", "--threads");
  expect_refused("bench kernels --bogus", "unknown flag --bogus");
  expect_refused("bench kernels --contexts 128,0", "--contexts: '0' is not an integer 1..1048576");
  expect_refused("bench kernels --tokens 1,x", "--tokens: 'x' is not an integer 1..65536");
  expect_refused("bench kernels --mla --mla-contexts 0", "--mla-contexts: '0' is not an integer");
  expect_refused("bench m2n --senders 0", "--senders: 0 is out of range");
  expect_refused("bench m2n --size 0x10", "--size: cannot read '0x10'");
  expect_refused("bench m2n --imbalance zipf:nan", "--imbalance zipf:S");
  expect_refused("bench serve --offline", "--model is required");
  expect_refused("bench frobnicate", "unknown benchmark 'frobnicate'");
  expect_refused("profile --seconds 1", "--model is required");
  // A worker's configuration comes from its router (control::Configure on
  // fd 3), never from flags.
  expect_refused("worker --role attention", "unknown flag --role");
  {
    CliRun w = run("worker");
    EXPECT_NE(w.code, 0);
    EXPECT_NE(w.err.find("started by a router, which configures it on fd 3"), std::string::npos)
        << w.err;
  }
  expect_refused("frobnicate", "unknown command 'frobnicate'");
  // Item 9: no talk of a "built-in model" for commands that need a directory.
  CliRun r = run("profile --model nosuchname");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.find("built-in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no such model directory"), std::string::npos) << r.err;
}

// Item 1: a file a command cannot write is an error, never "written".
TEST(CliHardeningTest, FailedWritesAreErrors) {
  CliRun m = run("bench m2n --senders 1 --receivers 1 --profile-into /nonexistent/x.json");
  EXPECT_EQ(m.code, 2) << m.err;
  EXPECT_EQ(m.err.find("written"), std::string::npos) << m.err;
  EXPECT_NE(m.err.find("--profile-into /nonexistent/x.json"), std::string::npos) << m.err;
  if (::access("/dev/full", W_OK) == 0) {
    CliRun p = run("plan --model dbrx --gpu A100 --out /dev/full");
    EXPECT_EQ(p.code, 1) << p.err;  // the disk was full: a runtime failure
    EXPECT_NE(p.err.find("/dev/full"), std::string::npos) << p.err;
    EXPECT_EQ(p.out.find("plan written"), std::string::npos) << p.out;
  }
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Items 3, 4, 5: numbers from files are range-checked; no NaN or negative figure.
TEST(CliHardeningTest, OutOfRangeFiguresFromFilesAreRefused) {
  const std::string dir = ::testing::TempDir() + "/cli_hardening_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  write_file(dir + "/prof.json", R"({"k1_ms_per_token": 0.01, "tp_attention": 2147483648})");
  expect_refused("plan --model dbrx --gpu H800 --profile " + dir + "/prof.json",
                 "--profile: " + dir + "/prof.json: field 'tp_attention' must be in 1..128");
  write_file(dir + "/prof2.json", R"({"k1_ms_per_token": -3})");
  expect_refused("plan --model dbrx --gpu H800 --profile " + dir + "/prof2.json",
                 "field 'k1_ms_per_token' must be in [0, ");
  // The catalogue, by flag and by environment: the error names which.
  const std::string cat = R"({"defaults": {"nic_util_curve": [[1024, 0.5]]},
    "gpus": [{"name": "G1", "bf16_tflops": 100, "memory_gb": 80, "memory_bandwidth_gb_s": 2000,
              "nic_gbit_s": 200, "gpus_per_node": 1e9, "intra_node_gb_s": 300, "price": 1,
              "tdp_w": 300}]})";
  write_file(dir + "/cat.json", cat);
  expect_refused(
      "plan --model dbrx --gpu G1 --catalog " + dir + "/cat.json",
      "--catalog: " + dir + "/cat.json: gpus[0] (G1): field 'gpus_per_node' must be in 1..128");
  CliRun e = run("plan --model dbrx --gpu G1 2>&1; MSINFER_CATALOG=" + dir +
                 "/cat.json " MSINFER_BINARY " plan --model dbrx --gpu G1");
  EXPECT_EQ(e.code, 2);
  EXPECT_NE(e.err.find("MSINFER_CATALOG (environment): " + dir + "/cat.json"), std::string::npos)
      << e.err;
  // Item 4.
  expect_refused("simulate --model dbrx --gpu A100 --imbalance zipf:1e4", "--imbalance");
  expect_refused("simulate --model dbrx --gpu A100 --imbalance zipf:nan", "--imbalance");
  CliRun z = run("simulate --model dbrx --gpu A100 --imbalance zipf:16 --iterations 2 --json");
  ASSERT_EQ(z.code, 0) << z.err;
  EXPECT_EQ(z.out.find("nan"), std::string::npos);
  EXPECT_EQ(z.out.find("inf"), std::string::npos);
  // Item 5: simulate --plan reads the fields that matter, and refuses edits that disagree.
  const std::string plan = dir + "/plan.json";
  ASSERT_EQ(run("plan --model mixtral-8x22b --gpu A100 --out " + plan).code, 0);
  auto original = read_json_file(plan);
  ASSERT_TRUE(original.ok());
  struct Edit {
    std::string pointer;
    Json value;
    std::string expect;
  };
  for (const Edit& x : std::vector<Edit>{
           {"/plan/batch_per_micro_batch", Json(0), "field 'batch_per_micro_batch' is 0"},
           {"/plan/batch_per_micro_batch", Json(1e15), "field 'batch_per_micro_batch'"},
           {"/plan/expert_nodes", Json(0), "field 'expert_nodes' is 0"},
           {"/plan/attention_gpu", Json("NOPE"), "field 'attention_gpu' is 'NOPE'"},
           {"/model/hidden", Json(1e12), "hidden must be in 0..262144"},
           {"/model/hidden", Json(4096), "do not match model.hidden 4096"},
           {"/plan/tp_attention", Json(2147483648LL), "field 'tp_attention' must be in 1..128"},
           {"/plan/micro_batches", Json(4294967298LL), "field 'micro_batches' must be in 1..64"},
       }) {
    Json j = *original;
    j[Json::json_pointer(x.pointer)] = x.value;
    write_file(plan, j.dump());
    expect_refused("simulate --plan " + plan, x.expect);
  }
  std::filesystem::remove_all(dir);
}

// Item 8: a sweep's total work is bounded before it starts.
TEST(CliHardeningTest, SweepWorkIsGuarded) {
  expect_refused("simulate --model mixtral-8x22b --gpu A100 --sweep micro-batches=1..256",
                 "--sweep too large");
}

// Item 10: a damaged model is the same bad-input error co-located and disaggregated.
TEST(CliHardeningTest, LoadErrorsExitTheSameEverywhere) {
  const std::string dir = ::testing::TempDir() + "/cli_broken_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::copy(tiny_model(), dir);
  {
    std::ofstream f(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
    f << std::string(8, '\xff');
  }
  const std::string want = dir + "/model.safetensors: header length";
  expect_refused("generate --model " + dir + " --prompt-ids 1,2", want);
  expect_refused("generate --model " + dir +
                     " --prompt-ids 1,2 --attention-workers 1 "
                     "--expert-workers 1",
                 want);
  expect_refused(
      "bench serve --offline --model " + dir + " --attention-workers 1 --expert-workers 1", want);
  expect_refused("profile --model " + dir, want);
  // A tensor of the wrong shape is found only by the worker that loads it:
  // its exit 2 is still bad input, not a runtime failure.
  std::filesystem::remove_all(dir);
  std::filesystem::copy(tiny_model(), dir);
  const std::string st = dir + "/model.safetensors";
  std::string bytes;
  {
    std::ifstream in(st, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = parse_json(bytes.substr(8, n), "header");
  ASSERT_TRUE(header.ok());
  const std::string name = "model.layers.0.block_sparse_moe.experts.3.w1.weight";
  ASSERT_TRUE(header->contains(name));
  Json& shape = (*header)[name]["shape"];
  shape = Json::array({shape[1], shape[0]});
  std::string text = header->dump();
  ASSERT_LE(text.size(), n);
  text.resize(n, ' ');
  bytes.replace(8, n, text);
  std::ofstream(st, std::ios::binary | std::ios::trunc) << bytes;
  const std::string shape_err = "has shape [64, 128], expected [128, 64]";
  expect_refused("generate --model " + dir + " --prompt-ids 1,2", shape_err);
  CliRun r = run("generate --model " + dir +
                 " --prompt-ids 1,2 --attention-workers 1 "
                 "--expert-workers 2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(shape_err), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace msinfer

// ---- Issue 12 item 6: a signal leaves no msinfer shared-memory objects behind.
namespace msinfer {
namespace {

// Owners (pids) of the msinfer-<pid>-* objects in /dev/shm.
std::set<long> shm_owners() {
  std::set<long> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("msinfer-", 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(n.c_str() + 8, &end, 10);
    if (pid > 0 && *end == '-') out.insert(pid);
  }
  return out;
}

long parent_pid(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  const size_t r = s.rfind(')');
  if (r == std::string::npos || r + 4 >= s.size()) return -1;
  return std::strtol(s.c_str() + r + 4, nullptr, 10);
}

// A child running msinfer with `args`, stdout to /dev/null, stderr to a pipe.
// Stopped with SIGTERM (and reaped) unless the test reaped it.
struct Child {
  pid_t pid = -1;
  FILE* err = nullptr;
  bool reaped = false;
  int status = 0;

  // `program` (looked up in PATH without a slash) runs instead of msinfer.
  explicit Child(const std::vector<std::string>& args, const char* program = MSINFER_BINARY) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 2);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      std::vector<char*> argv{const_cast<char*>(program)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(program, argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    err = ::fdopen(fds[0], "r");
  }
  int wait() {
    if (!reaped && pid > 0) ::waitpid(pid, &status, 0);
    reaped = true;
    return status;
  }
  ~Child() {
    if (!reaped && pid > 0) {
      ::kill(pid, SIGTERM);
      wait();
    }
    if (err != nullptr) std::fclose(err);
  }
};

TEST(CliSignalTest, SigintOfADeploymentRemovesItsSharedMemory) {
  Child router({"generate", "--model", tiny_model(), "--prompt-ids", "5,9", "--max-tokens", "3000",
                "--ignore-eos", "--attention-workers", "1", "--expert-workers", "2"});
  ASSERT_GT(router.pid, 0);
  std::set<long> workers;
  std::string all;
  char line[4096];
  bool running = false;
  while (!running && std::fgets(line, sizeof(line), router.err) != nullptr) {
    all += line;
    char role[32];
    int idx = 0, pid = 0;
    if (std::sscanf(line, "%31s worker %d: pid %d", role, &idx, &pid) == 3) workers.insert(pid);
    running = std::strstr(line, "msinfer: step 16") != nullptr;
  }
  ASSERT_TRUE(running) << all;
  ASSERT_EQ(workers.size(), 3u) << all;
  const std::set<long> before = shm_owners();
  for (long w : workers)
    ASSERT_TRUE(before.count(w)) << "worker " << w << " owns no object\n" << all;
  ASSERT_EQ(::kill(router.pid, SIGINT), 0);
  const int st = router.wait();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << st;
  const std::set<long> after = shm_owners();
  for (long w : workers)
    EXPECT_FALSE(after.count(w)) << "objects of worker " << w << " left behind";
}

TEST(CliSignalTest, SigintOfBenchM2nRemovesTheRanksSharedMemory) {
  if (std::system("command -v mpirun >/dev/null") != 0)
    GTEST_SKIP() << "needs mpirun (openmpi-bin)";
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  Child bench({"bench", "m2n", "--senders", "1", "--receivers", "1", "--size", "64k", "--iters",
               "1000000", "--baseline", "none"});
  ASSERT_GT(bench.pid, 0);
  // The ranks are the children of mpirun, the child of `bench`: wait (on
  // /dev/shm's creations, with a deadline) until both own their objects.
  const int in = ::inotify_init1(IN_CLOEXEC);
  ASSERT_GE(in, 0);
  ::inotify_add_watch(in, "/dev/shm", IN_CREATE);
  std::set<long> ranks;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ranks.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    ranks.clear();
    for (long p : shm_owners()) {
      const long mpirun = parent_pid(p);
      if (mpirun > 0 && parent_pid(mpirun) == bench.pid) ranks.insert(p);
    }
    if (ranks.size() >= 2) break;
    pollfd pfd{in, POLLIN, 0};
    if (::poll(&pfd, 1, 1000) > 0) {
      char buf[4096];
      (void)!::read(in, buf, sizeof(buf));
    }
  }
  ::close(in);
  ASSERT_EQ(ranks.size(), 2u) << "the ranks never created their objects";
  ASSERT_EQ(::kill(bench.pid, SIGINT), 0);
  const int st = bench.wait();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << st;
  const std::set<long> after = shm_owners();
  for (long r : ranks) EXPECT_FALSE(after.count(r)) << "objects of rank " << r << " left behind";
}

}  // namespace
}  // namespace msinfer

// ---- Issue 13: routing statistics, a skewed router, and msinfer balance.
namespace msinfer {
namespace {

// A tiny-mixtral written once per test process, with a Zipf(1.2) router skew.
const std::string& skewed_model() {
  static const std::string dir = [] {
    std::string d = ::testing::TempDir() + "/cli_test_skewed_" + std::to_string(::getpid());
    CliRun m = run("make-model --preset tiny-mixtral --router-skew zipf:1.2 --out " + d);
    EXPECT_EQ(m.code, 0) << m.err;
    static const std::string* path = new std::string(d);
    std::atexit([] { std::filesystem::remove_all(*path); });
    return d;
  }();
  return dir;
}

TEST(CliBalanceTest, RouterSkewShowsInTheRoutingStatistics) {
  const std::string args = " --prompt-ids 5,9,22 --max-tokens 96 --ignore-eos --json";
  Json plain = parse(run("generate --model " + tiny_model() + args).out);
  Json skewed = parse(run("generate --model " + skewed_model() + args).out);
  ASSERT_TRUE(plain.contains("routing") && skewed.contains("routing")) << skewed.dump();
  auto config = read_json_file(skewed_model() + "/config.json");
  ASSERT_TRUE(config.ok());
  const Json& skew = (*config)["msinfer_router_skew"];
  ASSERT_EQ(skew["s"], 1.2);
  for (const Json* j : {&plain, &skewed}) {
    const Json& r = (*j)["routing"];
    ASSERT_EQ(r["layers"], 2);
    ASSERT_EQ(r["experts"], 8);
    for (const auto& layer : r["expert_tokens"]) {
      // 3 prompt tokens + 95 decode tokens fed, top-2 experts each.
      int64_t rows = 0;
      for (const auto& n : layer) rows += n.get<int64_t>();
      EXPECT_EQ(rows, (3 + 95) * 2);
    }
  }
  const double plain_ratio = plain["routing"]["expert_balance"].get<double>();
  const double skewed_ratio = skewed["routing"]["expert_balance"].get<double>();
  EXPECT_GT(skewed_ratio, 2.5);  // Zipf(1.2) over 8: the hottest expert takes 43% of the picks
  EXPECT_GT(skewed_ratio, plain_ratio + 1.0) << plain_ratio;
  // The expert make-model ranked first is the busiest one in every layer.
  const int hottest = skew["experts_by_popularity"][0].get<int>();
  for (const auto& layer : skewed["routing"]["expert_tokens"]) {
    const auto counts = layer.get<std::vector<int64_t>>();
    EXPECT_EQ(std::max_element(counts.begin(), counts.end()) - counts.begin(), hottest);
  }
  // The human output says it too.
  CliRun human = run("generate --model " + skewed_model() + " --prompt-ids 5,9 --max-tokens 4");
  EXPECT_NE(human.out.find("experts max/mean"), std::string::npos) << human.out;
}

TEST(CliBalanceTest, BadRouterSkewIsRefused) {
  const std::string out = " --out " + ::testing::TempDir() + "/cli_test_never_written";
  for (const char* v :
       {"zipf:0", "zipf:-1", "zipf:abc", "uniform", "zipf:9", "zipf:nan", "zipf:", "zipf:1.2x"}) {
    expect_refused(std::string("make-model --preset tiny-mixtral --router-skew ") + v + out,
                   "--router-skew");
  }
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/cli_test_never_written"));
}

// --rebalance-every through the CLI: bench serve's deployment (16 streams,
// 32 rows per step and layer, so a decision every ~8 steps) ends with a
// placement the router computed online from the skew, which the routing
// document reports; the flags are refused where they cannot apply. The
// expert processes load their new experts while serving and the switch
// waits for them: 128 tokens leave ~120 steps for that (with 32, a CI
// machine running other tests beside it once ended the run first).
TEST(CliBalanceTest, RebalanceEveryMovesExpertsWhileServing) {
  CliRun b = run("bench serve --offline --model " + skewed_model() +
                 " --attention-workers 1 --expert-workers 2 --num-prompts 16 --input-len 8"
                 " --output-len 128 --rebalance-every 2 --rebalance-slots 5 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.err.find("msinfer: router: rebalanced"), std::string::npos) << b.err;
  EXPECT_GE(parse(b.out)["routing"]["placement_switches"].get<int>(), 1);
  const Json placement = parse(b.out)["routing"]["placement"];
  EXPECT_EQ(placement["expert_workers"], 2);
  // 10 slots for 8 experts: the two hottest got a replica on each worker.
  int replicated = 0;
  for (const auto& e : placement["experts"]) replicated += e.size() == 2 ? 1 : 0;
  EXPECT_EQ(replicated, 2) << placement.dump();
  const std::string d = "generate --model " + skewed_model() + " --prompt-ids 5,6 --max-tokens 2 ";
  expect_refused(d + "--rebalance-every 4", "--rebalance-every needs a disaggregated deployment");
  const std::string dep = d + "--attention-workers 1 --expert-workers 2 ";
  expect_refused(dep + "--rebalance-slots 5", "need --rebalance-every");
  expect_refused(dep + "--rebalance-every 2 --rebalance-slots 3",
                 "--rebalance-slots 3 x 2 expert workers hold fewer than the 8 experts");
  expect_refused(dep + "--rebalance-every 2 --rebalance-gain 0.5", "--rebalance-gain");
  expect_refused(dep + "--rebalance-every -1", "--rebalance-every");
}

TEST(CliBalanceTest, BalanceWritesAPlacementTheDeploymentRuns) {
  const std::string tmp = ::testing::TempDir() + "/cli_test_balance_" + std::to_string(::getpid());
  std::filesystem::create_directories(tmp);
  const std::string prompt =
      "--model " + skewed_model() + " --prompt-ids 5,9,22 --max-tokens 48 --ignore-eos";
  CliRun g = run("generate " + prompt + " --json");
  ASSERT_EQ(g.code, 0) << g.err;
  std::ofstream(tmp + "/stats.json") << g.out;
  CliRun b = run("balance --stats " + tmp +
                 "/stats.json --expert-workers 2 --slots-per-worker 5 "
                 "--out " +
                 tmp + "/placement.json --json");
  ASSERT_EQ(b.code, 0) << b.err;
  Json j = parse(b.out);
  // Predicted on the measured rows: balanced beats round robin.
  EXPECT_LT(j["after"]["worker_balance_all_layers"].get<double>(),
            j["before"]["worker_balance_all_layers"].get<double>());
  EXPECT_LT(j["after"]["worker_balance_all_layers"].get<double>(), 1.1);
  auto placement = read_json_file(tmp + "/placement.json");
  ASSERT_TRUE(placement.ok()) << placement.status().to_string();
  EXPECT_EQ((*placement)["expert_workers"], 2);
  // 10 slots for 8 experts: the two hottest get a replica on each worker.
  int replicated = 0;
  for (const auto& e : (*placement)["experts"]) replicated += e.size() == 2 ? 1 : 0;
  EXPECT_EQ(replicated, 2);
  // The deployment takes it, routes through it and produces the same tokens.
  CliRun d = run("generate " + prompt + " --attention-workers 1 --expert-workers 2 --placement " +
                 tmp + "/placement.json --json");
  ASSERT_EQ(d.code, 0) << d.err;
  Json dj = parse(d.out);
  EXPECT_EQ(dj["token_ids"], parse(g.out)["token_ids"]);
  EXPECT_EQ(dj["routing"]["placement"], *placement);
  EXPECT_EQ(dj["routing"]["expert_tokens"], parse(g.out)["routing"]["expert_tokens"]);
  // Measured: the replicated experts' rows go to the less-loaded worker, so the
  // expert workers are more even than under round robin.
  CliRun rr = run("generate " + prompt + " --attention-workers 1 --expert-workers 2 --json");
  ASSERT_EQ(rr.code, 0) << rr.err;
  const double measured = dj["routing"]["worker_balance"].get<double>();
  EXPECT_LT(measured, parse(rr.out)["routing"]["worker_balance"].get<double>());
  EXPECT_LT(measured, 1.1) << dj["routing"].dump();
  // A fixed cost per replica far above any expert's rows: no replica pays.
  CliRun f = run("balance --stats " + tmp + "/stats.json --expert-workers 2 --slots-per-worker 5 "
                 "--expert-fixed-rows 1000 --json");
  ASSERT_EQ(f.code, 0) << f.err;
  const Json fixed = parse(f.out);  // named: a temporary's member would dangle in the loop
  for (const auto& e : fixed["after"]["placement"]["experts"]) EXPECT_EQ(e.size(), 1u);
  // The human table.
  CliRun h = run("balance --stats " + tmp + "/stats.json --expert-workers 2");
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_NE(h.out.find("round robin (before)"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("expert worker 1: experts"), std::string::npos) << h.out;
  // Bad input: exit 2, one line naming the flag or file.
  expect_refused("balance --expert-workers 2", "--stats is required");
  expect_refused("balance --stats " + tmp + "/stats.json", "--expert-workers is required");
  expect_refused("balance --stats " + tmp + "/nonexistent.json --expert-workers 2",
                 "nonexistent.json");
  expect_refused("balance --stats " + skewed_model() + "/config.json --expert-workers 2",
                 "field 'layers'");
  expect_refused("balance --stats " + tmp + "/stats.json --expert-workers 3 --slots-per-worker 2",
                 "6 slots for 8 experts");
  expect_refused("balance --stats " + tmp + "/stats.json --expert-workers 2 --slots-per-worker 0",
                 "--slots-per-worker must be >= 1");
  expect_refused("balance --stats " + tmp + "/stats.json --expert-workers 2 --expert-fixed-rows -1",
                 "--expert-fixed-rows");
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace msinfer

// ---- Issue 43 items 2 and 3: the signal path removes only objects whose lock
// this process (or a child) holds; fds 0-2 and what a worker inherits.
namespace msinfer {
namespace {

bool shm_exists(const std::string& name) {
  return ::access(("/dev/shm/" + name).c_str(), F_OK) == 0;
}

std::vector<std::string> shm_names_starting(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  return out;
}

// The live endpoint of another owner whose name carries `pid`, as a process of
// another PID namespace sharing /dev/shm names its objects: a mailbox, a
// region and the lock, which this test holds while it lives (as that process
// would). Removed at the end.
struct ForeignEndpoint {
  std::string token;
  int lock_fd = -1;
  explicit ForeignEndpoint(long pid) {
    std::random_device rd;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%08x%08x", rd(), rd());
    token = "msinfer-" + std::to_string(pid) + "-" + hex;
    lock_fd = ::open(("/dev/shm/" + token + ".live").c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC,
                     0600);
    if (lock_fd >= 0 && ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(lock_fd);
      lock_fd = -1;
    }
    for (const char* suffix : {"", "-r1"}) {
      const int fd = ::open(("/dev/shm/" + token + suffix).c_str(),
                            O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd >= 0) ::close(fd);
    }
  }
  std::vector<std::string> names() const { return {token, token + "-r1", token + ".live"}; }
  // Every object still there.
  bool intact() const {
    for (const auto& n : names()) {
      if (!shm_exists(n)) return false;
    }
    return lock_fd >= 0;
  }
  ~ForeignEndpoint() {
    for (const auto& n : names()) ::unlink(("/dev/shm/" + n).c_str());
    if (lock_fd >= 0) ::close(lock_fd);
  }
};

// Waits up to `timeout` for process `pid` (a child or not) to exit.
bool exits_within(pid_t pid, std::chrono::milliseconds timeout) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  const bool gone = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
  ::close(fd);
  return gone;
}

// Reads `child`'s stderr until generate's step 16; the worker pids it
// printed (in the deployment's PID namespace) go to *workers.
bool wait_for_steps(Child& child, std::set<long>* workers, std::string* all) {
  char line[4096];
  while (std::fgets(line, sizeof(line), child.err) != nullptr) {
    *all += line;
    char role[32];
    int idx = 0, pid = 0;
    if (std::sscanf(line, "%31s worker %d: pid %d", role, &idx, &pid) == 3) workers->insert(pid);
    if (std::strstr(line, "msinfer: step 16") != nullptr) return true;
  }
  return false;
}

std::vector<std::string> deployment_args() {
  return {"generate",         "--model", tiny_model(),   "--prompt-ids",        "5,9",
          "--max-tokens",     "3000",    "--ignore-eos", "--attention-workers", "1",
          "--expert-workers", "2"};
}

// Objects whose names carry the router's or a worker's pid, of a live owner
// that is not them, survive the router's SIGHUP; the workers' own go. (The
// signal path used to remove every "msinfer-<pid>-..." of its own pid and its
// children's pids.)
TEST(CliSignalTest, SighupRemovesOnlyObjectsWhoseLockTheDeploymentHolds) {
  Child router(deployment_args());
  ASSERT_GT(router.pid, 0);
  std::set<long> workers;
  std::string all;
  ASSERT_TRUE(wait_for_steps(router, &workers, &all)) << all;
  ASSERT_EQ(workers.size(), 3u) << all;
  std::vector<std::string> own;
  for (long w : workers) {
    for (const auto& n : shm_names_starting("msinfer-" + std::to_string(w) + "-")) own.push_back(n);
  }
  ASSERT_GE(own.size(), 3u) << "the workers own no objects\n" << all;
  ForeignEndpoint as_router(router.pid), as_worker(*workers.begin());
  ASSERT_TRUE(as_router.intact() && as_worker.intact());

  ASSERT_EQ(::kill(router.pid, SIGHUP), 0);
  const int st = router.wait();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGHUP) << st;
  for (const auto& n : own) EXPECT_FALSE(shm_exists(n)) << n << " of a worker left behind";
  EXPECT_TRUE(as_router.intact()) << "another owner's objects named with the router's pid removed";
  EXPECT_TRUE(as_worker.intact()) << "another owner's objects named with a worker's pid removed";
}

// The reported case: `msinfer` as pid 1 of its own PID namespace gets SIGHUP
// while an endpoint of this namespace is named "msinfer-1-...". That endpoint
// survives, the deployment's objects go, and the router exits (pid 1 ignores
// the default action of a signal it sends itself).
TEST(CliSignalTest, SighupToPid1OfAPidNamespaceSparesPid1OfAnother) {
  if (std::system("unshare --pid --fork --mount-proc true >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no PID namespace here (unshare --pid needs CAP_SYS_ADMIN)";
  }
  std::vector<std::string> args = {"--pid", "--fork", "--mount-proc", "--kill-child",
                                   MSINFER_BINARY};
  for (const auto& a : deployment_args()) args.push_back(a);
  Child ns(args, "unshare");
  ASSERT_GT(ns.pid, 0);
  std::set<long> workers;  // pids in the new namespace
  std::string all;
  ASSERT_TRUE(wait_for_steps(ns, &workers, &all)) << all;
  ASSERT_EQ(workers.size(), 3u) << all;
  // The router is unshare's child: pid 1 in there.
  long router = -1;
  {
    std::ifstream in("/proc/" + std::to_string(ns.pid) + "/task/" + std::to_string(ns.pid) +
                     "/children");
    in >> router;
  }
  ASSERT_GT(router, 0) << "no child of unshare";
  std::vector<std::string> own;
  for (long w : workers) {
    for (const auto& n : shm_names_starting("msinfer-" + std::to_string(w) + "-")) own.push_back(n);
  }
  ASSERT_GE(own.size(), 3u) << "the workers own no objects\n" << all;
  ForeignEndpoint pid1(1), same_as_worker(*workers.begin());
  ASSERT_TRUE(pid1.intact() && same_as_worker.intact());

  ASSERT_EQ(::kill(static_cast<pid_t>(router), SIGHUP), 0);
  ASSERT_TRUE(exits_within(ns.pid, std::chrono::seconds(60))) << "pid 1 did not exit";
  // At the signal, not at the end of its 3000 tokens; unshare passes the status on.
  const int st = ns.wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGHUP) << "status " << st;
  for (const auto& n : own) EXPECT_FALSE(shm_exists(n)) << n << " of a worker left behind";
  EXPECT_TRUE(pid1.intact()) << "objects of this namespace's pid 1 removed by another's";
  EXPECT_TRUE(same_as_worker.intact()) << "objects of a same-numbered pid removed";
}

// fd number -> link target ("socket:[123]", "pipe:[45]", "/dev/null") of `pid`.
std::map<int, std::string> fds_of(long pid) {
  std::map<int, std::string> out;
  std::error_code ec;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec) out[std::atoi(e.path().filename().c_str())] = target.string();
  }
  return out;
}

// The `msinfer worker` children of `pid` (of any of its threads).
std::vector<long> worker_children(long pid) {
  std::vector<long> out;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(t.path() / "children");
    for (long c; in >> c;) {
      std::ifstream cmd("/proc/" + std::to_string(c) + "/cmdline");
      std::string argv((std::istreambuf_iterator<char>(cmd)), {});
      if (argv.find(std::string("\0worker\0", 8)) != std::string::npos) out.push_back(c);
    }
  }
  return out;
}

// `msinfer serve` of a deployment (1 attention, 2 expert workers) on a free
// port of 127.0.0.1. With `closed_std`, started with fds 1 and 2 closed; else
// stdout is a pipe (`out`) and stderr /dev/null. Stopped (SIGTERM, then
// SIGKILL) and reaped at the end of the test.
struct Serve {
  pid_t pid = -1;
  FILE* out = nullptr;
  explicit Serve(bool closed_std) {
    const std::string model = tiny_model();
    int fds[2] = {-1, -1};
    if (!closed_std && ::pipe(fds) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      if (closed_std) {
        ::close(1);
        ::close(2);
      } else {
        ::dup2(fds[1], 1);
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, 2);
      }
      const char* argv[] = {
          MSINFER_BINARY,     "serve",  "--model", model.c_str(),         "--host",
          "127.0.0.1",        "--port", "0",       "--attention-workers", "1",
          "--expert-workers", "2",      nullptr};
      ::execv(MSINFER_BINARY, const_cast<char**>(argv));
      ::_exit(127);
    }
    if (!closed_std) {
      ::close(fds[1]);
      out = ::fdopen(fds[0], "r");
    }
  }
  ~Serve() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      if (!exits_within(pid, std::chrono::seconds(30))) ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out != nullptr) std::fclose(out);
  }
};

// The three workers of `serve`, once each holds its /dev/shm lock (its
// transport is open); woken by /dev/shm's creations, with a deadline. Empty
// if they did not get there.
std::vector<long> running_workers(pid_t serve) {
  const int in = ::inotify_init1(IN_CLOEXEC);
  if (in < 0) return {};
  ::inotify_add_watch(in, "/dev/shm", IN_CREATE);
  std::vector<long> workers;
  bool ready = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    if (::kill(serve, 0) != 0) break;
    workers = worker_children(serve);
    ready = workers.size() == 3;
    for (long w : workers) {
      bool locked = false;
      for (const auto& [fd, target] : fds_of(w)) {
        // Its lock file, opened under a temporary name (ShmOwner::create).
        locked = locked || (target.rfind("/dev/shm/", 0) == 0 &&
                            target.find("msinfer-") != std::string::npos);
      }
      ready = ready && locked;
    }
    if (ready) break;
    pollfd p{in, POLLIN, 0};
    if (::poll(&p, 1, 500) > 0) {
      char buf[4096];
      (void)!::read(in, buf, sizeof(buf));
    }
  }
  ::close(in);
  return ready ? workers : std::vector<long>{};
}

// A worker holds no socket or pipe of the router's beyond fd 4 (fds 3 and 4
// are its command pipes, whose other ends the router holds).
void expect_nothing_inherited(pid_t router, const std::vector<long>& workers) {
  std::set<std::string> router_ends;  // sockets and pipes: their targets name their inodes
  for (const auto& [fd, target] : fds_of(router)) {
    if (target.rfind("socket:", 0) == 0 || target.rfind("pipe:", 0) == 0) {
      router_ends.insert(target);
    }
  }
  for (long w : workers) {
    const std::map<int, std::string> f = fds_of(w);
    for (int fd : {3, 4}) {
      EXPECT_EQ((f.count(fd) ? f.at(fd) : "closed").rfind("pipe:", 0), 0u)
          << "worker " << w << " fd " << fd;
    }
    for (const auto& [fd, target] : f) {
      if (fd < 5) continue;
      EXPECT_EQ(router_ends.count(target), 0u)
          << "worker " << w << " inherited fd " << fd << ": " << target;
    }
  }
}

// Started with stdout and stderr closed, `msinfer` has them on /dev/null, in
// the router and in its workers: no eventfd, epoll or lock file took their
// numbers (and got the workers' output, or became their stdout and stderr).
TEST(CliFdTest, ClosedStdoutAndStderrAreDevNullInRouterAndWorkers) {
  Serve serve(/*closed_std=*/true);
  ASSERT_GT(serve.pid, 0);
  const std::vector<long> workers = running_workers(serve.pid);
  ASSERT_EQ(workers.size(), 3u) << "the workers did not start";
  const std::map<int, std::string> router = fds_of(serve.pid);
  EXPECT_EQ(router.count(1) ? router.at(1) : "closed", "/dev/null") << "the router's stdout";
  EXPECT_EQ(router.count(2) ? router.at(2) : "closed", "/dev/null") << "the router's stderr";
  for (long w : workers) {
    const std::map<int, std::string> f = fds_of(w);
    EXPECT_EQ(f.count(1) ? f.at(1) : "closed", "/dev/null") << "worker " << w << "'s stdout";
    EXPECT_EQ(f.count(2) ? f.at(2) : "closed", "/dev/null") << "worker " << w << "'s stderr";
  }
  expect_nothing_inherited(serve.pid, workers);
}

// The inode of the TCP socket listening on 127.0.0.1:`port` (/proc/net/tcp),
// or "".
std::string listener_inode(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  char want[16];
  std::snprintf(want, sizeof want, "0100007F:%04X", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (local == want && state == "0A") return inode;
  }
  return "";
}

// A worker does not hold `serve`'s HTTP listener (nor any other socket or
// pipe of the router's): the port is the router's alone.
TEST(CliFdTest, WorkersDoNotHoldTheHttpListener) {
  Serve serve(/*closed_std=*/false);
  ASSERT_GT(serve.pid, 0);
  char line[512] = {};
  ASSERT_NE(std::fgets(line, sizeof line, serve.out), nullptr) << "serve printed nothing";
  int port = 0;
  const char* at = std::strstr(line, "http://127.0.0.1:");
  ASSERT_TRUE(at != nullptr && std::sscanf(at, "http://127.0.0.1:%d", &port) == 1) << line;
  const std::string inode = listener_inode(port);
  ASSERT_FALSE(inode.empty()) << "no listener on port " << port;
  const std::string listener = "socket:[" + inode + "]";
  bool router_holds = false;
  for (const auto& [fd, target] : fds_of(serve.pid))
    router_holds = router_holds || target == listener;
  ASSERT_TRUE(router_holds) << listener << " is not the router's";
  const std::vector<long> workers = running_workers(serve.pid);
  ASSERT_EQ(workers.size(), 3u) << "the workers did not start";
  for (long w : workers) {
    for (const auto& [fd, target] : fds_of(w)) {
      EXPECT_NE(target, listener) << "worker " << w << " holds the HTTP listener as fd " << fd;
    }
  }
  expect_nothing_inherited(serve.pid, workers);
}

}  // namespace
}  // namespace msinfer
