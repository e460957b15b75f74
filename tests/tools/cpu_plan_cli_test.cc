// msinfer plan --devices cpu end to end: profile a tiny model here, plan its
// CPU deployment, and run the plan under bench serve --offline --plan. No
// timing is asserted: only that the plan fits, runs as planned and carries
// its prediction beside the measurement.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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

class CpuPlanCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/cpu_plan_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(*dir_);
    CliRun m = run("make-model --preset tiny-mixtral --out " + model());
    ASSERT_EQ(m.code, 0) << m.err;
    // One thread, as each worker of the plans below runs; short points.
    CliRun p = run("profile --model " + model() + " --seq-len 20 --seconds 0.02 --threads 1 " +
                   "--kv-cache-mb 64 --json --out " + profile());
    ASSERT_EQ(p.code, 0) << p.err;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string model() { return *dir_ + "/model"; }
  static std::string profile() { return *dir_ + "/profile.json"; }
  static std::string* dir_;
};
std::string* CpuPlanCliTest::dir_ = nullptr;

TEST_F(CpuPlanCliTest, ProfileRecordsTheHeadTermAndTheMachine) {
  auto j = read_json_file(profile());
  ASSERT_TRUE(j.ok());
  for (const char* k : {"k1_ms_per_token", "k4_ms", "head_ms_per_token", "head_ms", "cores",
                        "memory_gb", "threads", "head_points_ms"}) {
    EXPECT_TRUE(j->contains(k)) << k;
  }
  EXPECT_EQ((*j)["threads"], 1);
}

TEST_F(CpuPlanCliTest, PlanFitsTheMachineAndBenchServeRunsItAsIs) {
  const std::string plan = *dir_ + "/plan.json";
  CliRun p = run("plan --devices cpu --profile " + profile() + " --model " + model() +
                 " --cores 2 --input-len 16 --output-len 8 --max-batch 8 --slo-ms 1000 --out " +
                 plan + " --json");
  ASSERT_EQ(p.code, 0) << p.err;
  Json j = parse(p.out);
  EXPECT_EQ(j["devices"], "cpu");
  const Json& d = j["plan"];
  // Feasible: the threads fit the cores (or every worker has one thread on
  // shared cores), the memory and the KV budget hold.
  const int threads = d["threads"].get<int>();
  EXPECT_TRUE(threads <= 2 || (d["attention_threads"] == 1 && d["expert_threads"] == 1))
      << d.dump();
  EXPECT_TRUE(j["constraints"]["holds"].get<bool>()) << j["constraints"].dump();
  EXPECT_LE(j["constraints"]["memory_gb"].get<double>(),
            j["constraints"]["memory_capacity_gb"].get<double>());
  EXPECT_LE(j["constraints"]["kv_mib_per_attention_worker"].get<double>(),
            j["constraints"]["kv_budget_mib"].get<double>());
  EXPECT_LE(d["global_batch"].get<int>(), 8);
  for (const char* k : {"throughput_tokens_per_s", "tbt_ms", "t_attention_ms", "t_expert_ms",
                        "t_comm_ms", "t_head_ms", "cpu_bound_ms"}) {
    ASSERT_TRUE(j["predicted"].contains(k)) << k;
    EXPECT_GT(j["predicted"][k].get<double>(), k == std::string("t_comm_ms") ? -1 : 0) << k;
  }
  // bench serve runs the document as written: its workers, batch and lengths.
  CliRun b = run("bench serve --offline --model " + model() + " --plan " + plan +
                 " --idle-seconds 0 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  Json r = parse(b.out);
  EXPECT_EQ(r["num_prompts"], d["global_batch"]);
  EXPECT_EQ(r["input_len"], 16);
  EXPECT_EQ(r["output_len"], 8);
  EXPECT_NE(r["deployment"].get<std::string>().find(
                std::to_string(d["attention_workers"].get<int>()) + " attention + " +
                std::to_string(d["expert_workers"].get<int>()) +
                " expert workers, m=" + std::to_string(d["micro_batches"].get<int>())),
            std::string::npos)
      << r["deployment"];
  for (const char* k : {"predicted_tokens_per_s", "measured_tokens_per_s", "tokens_per_s_error",
                        "predicted_tbt_ms", "measured_tbt_ms_p50", "tbt_error"}) {
    EXPECT_TRUE(r["plan_vs_measured"].contains(k)) << k;
  }
}

TEST_F(CpuPlanCliTest, AFixedShapeOnSharedCoresRuns) {
  const std::string plan = *dir_ + "/plan_shared.json";
  CliRun p =
      run("plan --devices cpu --profile " + profile() + " --model " + model() +
          " --cores 2 --attention-workers 2 --expert-workers 1 --micro-batches 2 " +
          "--tp-expert 1 --attention-threads 1 --expert-threads 1 " +
          "--input-len 16 --output-len 8 --max-batch 8 --slo-ms 1000 --out " + plan + " --json");
  ASSERT_EQ(p.code, 0) << p.err;
  Json j = parse(p.out);
  EXPECT_EQ(j["plan"]["attention_workers"], 2);
  EXPECT_EQ(j["plan"]["expert_workers"], 1);
  EXPECT_EQ(j["plan"]["micro_batches"], 2);
  EXPECT_EQ(j["plan"]["threads"], 3);
  EXPECT_TRUE(j["predicted"]["shares_cores"].get<bool>());
  CliRun b = run("bench serve --offline --model " + model() + " --plan " + plan +
                 " --idle-seconds 0 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_TRUE(parse(b.out).contains("plan_vs_measured"));
  // simulate models GPU deployments: a CPU plan is refused by name, not for a
  // missing field of a GPU plan.
  CliRun s = run("simulate --plan " + plan);
  EXPECT_EQ(s.code, 2);
  EXPECT_NE(s.err.find("a CPU plan"), std::string::npos) << s.err;
}

TEST_F(CpuPlanCliTest, BadCombinationsAreRefused) {
  const std::string m = " --model " + model();
  CliRun r = run("plan --devices cpu" + m);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile"), std::string::npos) << r.err;
  r = run("plan --devices cpu --gpu A100 --profile " + profile() + m);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--gpu"), std::string::npos) << r.err;
  r = run("plan --model mixtral-8x22b --gpu A100 --cores 4");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--devices cpu"), std::string::npos) << r.err;
  r = run("plan --devices tpu" + m);
  EXPECT_EQ(r.code, 2);
  // An SLO no deployment meets.
  r = run("plan --devices cpu --profile " + profile() + m + " --cores 2 --slo-ms 0.001");
  EXPECT_EQ(r.code, 2);
}

}  // namespace
}  // namespace msinfer
