// Expert tensor parallelism (issue 14): an expert worker served by tp_expert
// processes, each holding 1/tp of its experts' FFN (column-parallel w1/w3,
// row-parallel w2), with the partial outputs summed on the attention side
// (attention-sum) or by shard 0 (allreduce).
//
// "Equal up to a near-tie": the shards' partial sums add the down projection
// in another order than one GEMM over the whole FFN width, so an activation
// can round differently (one fp32 ulp, then now and then one bf16 ulp
// downstream). Greedy tokens must equal the co-located engine's; where they
// first differ, the token the tp run chose must be within kNearTie of the
// co-located engine's best logit at that step (the exactness test's max
// |dlogit| bar, tests/runtime/exactness_test.cc), and the comparison stops
// there (the contexts differ afterwards). Both modes add the partials in
// shard order, so their tokens must be identical to each other.
#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/expert_backend.h"
#include "msinfer/runtime/model_runner.h"
#include "test_models.h"
#include "tp_checks.h"

namespace msinfer::runtime {
namespace {

const std::string kBinary = MSINFER_BINARY;

// ---- weights: the shards add up to the whole expert ----

class ExpertShardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertShardTest, ShardOutputsSumToTheWholeExpertAndHoldItsShareOfTheWeights) {
  const std::string dir = testing::test_model_dir(GetParam());
  model::LoadOptions whole;
  whole.attention = false;
  auto full = model::ModelWeights::load(dir, whole);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  const ModelConfig& mc = (*full)->config();
  const int64_t h = mc.hidden, rows = 5;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(rows * h), want(rows * h), got(rows * h), part(rows * h);
  for (float& v : x) v = nd(rng);
  for (int tp : {2, 4}) {
    std::vector<std::unique_ptr<model::ModelWeights>> shards;
    for (int r = 0; r < tp; ++r) {
      model::LoadOptions lo = whole;
      lo.all_experts = false;
      lo.experts = {1, 6};
      lo.expert_tp_rank = r;
      lo.expert_tp_size = tp;
      auto w = model::ModelWeights::load(dir, lo);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      EXPECT_FALSE((*w)->has_expert(0, 0));
      EXPECT_EQ((*w)->layers()[0].experts[1].w2.k(), mc.expert_ffn / tp);
      shards.push_back(std::move(w).value());
    }
    // Each shard holds 1/tp of the two experts' packed weights. Packing pads
    // the reduction dimension of w2 (F/tp) to the level's panel depth (24 of
    // tiny-qwen3moe at tp 4 took 32 at avx512bf16), so the share is checked where
    // F/tp is a multiple of 32.
    if ((mc.expert_ffn / tp) % 32 == 0) {
      model::LoadOptions two = whole;
      two.all_experts = false;
      two.experts = {1, 6};
      auto both = model::ModelWeights::load(dir, two);
      ASSERT_TRUE(both.ok());
      for (const auto& s : shards) {
        const double ratio = static_cast<double>(s->packed_bytes()) * tp / (*both)->packed_bytes();
        EXPECT_NEAR(ratio, 1.0, 0.05) << GetParam() << " tp " << tp;
      }
    }
    for (int l = 0; l < mc.layers; ++l) {
      for (int e : {1, 6}) {
        ExpertRunner(**full).forward(l, e, x.data(), rows, want.data());
        std::fill(got.begin(), got.end(), 0.f);
        for (const auto& s : shards) {
          ExpertRunner(*s).forward(l, e, x.data(), rows, part.data());
          for (int64_t i = 0; i < rows * h; ++i) got[i] += part[i];
        }
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < rows * h; ++i) {
          worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
          scale = std::max(scale, std::fabs(double(want[i])));
        }
        // fp32 sums in another order: a few ulps of the largest output.
        EXPECT_LE(worst, 1e-5 * scale + 1e-7)
            << GetParam() << " tp " << tp << " layer " << l << " expert " << e;
      }
    }
  }
}

TEST(ExpertShardErrorsTest, AnUnevenSplitOrABadRankIsAnError) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");  // F = 128
  model::LoadOptions lo;
  lo.attention = false;
  lo.expert_tp_size = 3;
  auto w = model::ModelWeights::load(dir, lo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("not divisible by tp_expert 3"), std::string::npos)
      << w.status().to_string();
  lo.expert_tp_size = 2;
  lo.expert_tp_rank = 2;
  w = model::ModelWeights::load(dir, lo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("out of range"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ExpertShardTest,
                         ::testing::Values("tiny-mixtral", "tiny-qwen3moe"));

// ---- logits of the sharded experts against PyTorch ----

// The shards' arithmetic in one process: tp shard weights, each expert's rows
// through every shard's FFN, the partials added in shard order, as both
// reduction modes of the runtime do (the deployments' tokens are checked
// through the binary below; generate does not print logits).
class ShardedExperts : public ExpertBackend {
 public:
  explicit ShardedExperts(std::vector<std::unique_ptr<model::ModelWeights>> shards)
      : shards_(std::move(shards)), hidden_(shards_[0]->config().hidden) {}
  Status start(int k, int l, const kernels::cpu::RoutedBatch& r) override {
    if (static_cast<int>(out_.size()) <= k) out_.resize(k + 1);
    std::vector<float>& out = out_[k];
    out.assign(r.rows() * hidden_, 0.f);
    for (int64_t e = 0; e < r.experts; ++e) {
      const int64_t off = r.expert_offset[e], n = r.expert_rows(e);
      if (n == 0) continue;
      part_.resize(n * hidden_);
      for (const auto& s : shards_) {
        ExpertRunner(*s).forward(l, static_cast<int>(e), r.send.data() + off * hidden_, n,
                                 part_.data());
        float* dst = out.data() + off * hidden_;
        for (int64_t i = 0; i < n * hidden_; ++i) dst[i] += part_[i];
      }
    }
    return ok_status();
  }
  Status finish(int k, int, const kernels::cpu::RoutedBatch& r, float* results) override {
    std::copy(out_[k].begin(), out_[k].begin() + r.rows() * hidden_, results);
    return ok_status();
  }

 private:
  std::vector<std::unique_ptr<model::ModelWeights>> shards_;
  int64_t hidden_;
  std::vector<std::vector<float>> out_;
  std::vector<float> part_;
};

class ExpertTpTorchTest : public ::testing::TestWithParam<std::string> {};

// Prefill plus 16 greedy steps with tp 2 shards: logits within the exactness
// test's tolerance of the PyTorch reference (max |d| <= 1e-2, mean <= 1e-3)
// and the same greedy tokens.
TEST_P(ExpertTpTorchTest, ShardedLogitsMatchPyTorch) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  const std::string dir = testing::test_model_dir(GetParam());
  const std::vector<int32_t> prompt = {5, 9, 22, 40, 7, 8, 11, 3, 60};
  constexpr int kSteps = 17;
  const auto [ref_tokens, ref_logits] = testing::torch_reference(dir, prompt, kSteps);
  ASSERT_FALSE(ref_logits.empty());

  model::LoadOptions attention;
  attention.all_experts = false;
  auto w = model::ModelWeights::load(dir, attention);
  ASSERT_TRUE(w.ok());
  std::vector<std::unique_ptr<model::ModelWeights>> shards;
  for (int r = 0; r < 2; ++r) {
    model::LoadOptions lo;
    lo.attention = false;
    lo.expert_tp_rank = r;
    lo.expert_tp_size = 2;
    auto s = model::ModelWeights::load(dir, lo);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    shards.push_back(std::move(s).value());
  }
  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.block_size = 4;
  o.micro_batches = 2;
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(std::move(w).value()), o,
                          std::make_unique<ShardedExperts>(std::move(shards)));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const testing::GreedyRun run = testing::run_greedy(**e, prompt, kSteps);
  EXPECT_EQ(run.tokens, ref_tokens);
  const testing::LogitError err = testing::logit_error(run.logits, ref_logits);
  EXPECT_LE(err.max, testing::kMaxLogitError) << GetParam();
  EXPECT_LE(err.mean, testing::kMeanLogitError) << GetParam();
  std::printf("[ expert tp ] %s, tp 2 shards vs PyTorch: |dlogit| max %.3g, mean %.3g\n",
              GetParam().c_str(), err.max, err.mean);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ExpertTpTorchTest,
                         ::testing::Values("tiny-mixtral", "tiny-qwen3moe"));

// ---- deployments through the binary ----

using testing::colocated_logits;
using testing::expect_equal_up_to_near_tie;
using testing::generate;
using testing::Generated;
using testing::kNearTie;

// The check can fail: a token that is far from the best is not a near-tie.
TEST(NearTieCheckTest, AClearDivergenceIsAFailure) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::vector<int32_t> prompt = {5, 9, 22};
  const auto logits = colocated_logits(dir, prompt, 2);
  ASSERT_EQ(logits.size(), 2u);
  std::vector<int32_t> ref(2), got(2);
  for (int s = 0; s < 2; ++s) {
    ref[s] = static_cast<int32_t>(std::max_element(logits[s].begin(), logits[s].end()) -
                                  logits[s].begin());
  }
  got = ref;
  got[1] = static_cast<int32_t>(std::min_element(logits[1].begin(), logits[1].end()) -
                                logits[1].begin());
  expect_equal_up_to_near_tie(ref, ref, dir, prompt, "identical");
  EXPECT_NONFATAL_FAILURE(expect_equal_up_to_near_tie(ref, got, dir, prompt, "far"),
                          "not a near-tie");
}

// The log-probability check passes on the co-located engine's own answer
// (generate --logprobs) and fails when a value is off by 0.025 or when the
// listed top tokens leave out one the reference ranks clearly above them.
TEST(LogprobCheckTest, PassesOnTheEngineAndFailsOnAWrongValueOrAMissingTopToken) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const Generated g =
      generate("--model " + dir + " --prompt-ids 5,9,22 --max-tokens 3 --ignore-eos --logprobs 4");
  const testing::TorchReference pt = testing::torch_reference(dir, {5, 9, 22}, 3);
  ASSERT_EQ(g.tokens, pt.tokens);
  testing::expect_logprobs_match_reference(g.doc, pt, 4, "co-located");
  Json off = g.doc;
  off["logprobs"][1]["top"][2][1] = off["logprobs"][1]["top"][2][1].get<double>() + 0.025;
  EXPECT_NONFATAL_FAILURE(testing::expect_logprobs_match_reference(off, pt, 4, "off"), "worst");
  // The 4th best replaced by the least likely token, with its right value.
  Json missing = g.doc;
  const std::vector<float>& l = pt.logits[2];
  const auto least = std::min_element(l.begin(), l.end()) - l.begin();
  const double shift = missing["logprobs"][2]["top"][0][1].get<double>() -
                       *std::max_element(l.begin(), l.end());
  missing["logprobs"][2]["top"][3] = Json::array({least, l[least] + shift});
  EXPECT_NONFATAL_FAILURE(testing::expect_logprobs_match_reference(missing, pt, 4, "missing"),
                          "step 2");
}

class ExpertTpTest : public ::testing::TestWithParam<std::string> {};

// (n_a, N, m) in {(1, 2, 1), (2, 2, 2)} with tp_expert 2 in both reduction
// modes, and (2, 3, 2) with tp_expert 4 and an uneven placement.
TEST_P(ExpertTpTest, SameTokensAsTheColocatedEngine) {
  const testing::DeploymentReference ref(GetParam());
  ASSERT_EQ(ref.tokens.size(), 16u);
  for (const std::string shape : {"--attention-workers 1 --expert-workers 2 --micro-batches 1",
                                  "--attention-workers 2 --expert-workers 2 --micro-batches 2"}) {
    std::map<std::string, std::vector<int32_t>> by_mode;
    for (const std::string mode : {"attention-sum", "allreduce"}) {
      const std::string d = shape + " --tp-expert 2 --tp-expert-reduce " + mode;
      const Generated g = ref.check(d);
      by_mode[mode] = g.tokens;
      // Four expert processes, each named with its shard.
      EXPECT_NE(g.err.find("expert worker 1 tp rank 1: pid"), std::string::npos) << g.err;
      EXPECT_EQ(g.err.find("expert worker 2"), std::string::npos) << g.err;
      // Rows are counted once per expert worker (by shard 0), not per shard,
      // and the placement in effect says tp and the mode.
      const Json& routing = g.doc["routing"];
      ASSERT_TRUE(routing.contains("worker_tokens")) << routing.dump();
      for (size_t l = 0; l < routing["expert_tokens"].size(); ++l) {
        int64_t by_expert = 0, by_worker = 0;
        for (const auto& n : routing["expert_tokens"][l]) by_expert += n.get<int64_t>();
        for (const auto& n : routing["worker_tokens"][l]) by_worker += n.get<int64_t>();
        EXPECT_EQ(by_worker, by_expert) << routing.dump();
      }
      EXPECT_EQ(routing["placement"]["tp_expert"], 2) << routing.dump();
      EXPECT_EQ(routing["placement"]["tp_expert_reduce"], mode) << routing.dump();
    }
    EXPECT_EQ(by_mode["attention-sum"], by_mode["allreduce"]) << GetParam() << " " << shape;
  }
  // General tp: four shards per worker, three workers with uneven expert
  // counts, through a placement file that carries tp and the mode itself.
  const std::string placement =
      ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_tp4_placement.json";
  std::ofstream(placement) << R"({"expert_workers": 3, "experts": [0, 0, 0, 0, 0, 1, 1, 2],
                                  "tp_expert": 4, "tp_expert_reduce": "allreduce"})";
  const std::string d =
      "--attention-workers 2 --expert-workers 3 --micro-batches 2 --placement " + placement;
  const Generated g = ref.check(d);
  EXPECT_NE(g.err.find("tp_expert 4 (4 processes per expert worker), reduce: allreduce"),
            std::string::npos)
      << g.err;
  EXPECT_NE(g.err.find("expert worker 2 tp rank 3: pid"), std::string::npos) << g.err;
  EXPECT_EQ(g.err.find("the planner's model"), std::string::npos) << g.err;  // the file chose
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ExpertTpTest,
                         ::testing::Values("tiny-mixtral", "tiny-qwen3moe"));

// Nothing chooses the reduction: the planner's model does, for this machine
// (issue 14: "default to the one the planner's model prefers for the hardware
// at hand"), says so with its two step times, and the deployment runs in the
// mode it names.
TEST(ExpertTpDefaultTest, WithoutAModeThePlannersModelChooses) {
  const testing::DeploymentReference ref("tiny-mixtral");
  const Generated g = ref.check(
      "--attention-workers 1 --expert-workers 2 --micro-batches 2 "
      "--tp-expert 2");
  const std::string line = "the planner's model on this machine";
  const size_t at = g.err.find(line);
  ASSERT_NE(at, std::string::npos) << g.err;
  const size_t start = g.err.rfind("msinfer: reduce ", at);
  ASSERT_NE(start, std::string::npos) << g.err;
  const std::string mode = g.err.substr(start + 16, g.err.find(':', start + 16) - (start + 16));
  ASSERT_TRUE(mode == "attention-sum" || mode == "allreduce") << g.err;
  EXPECT_NE(g.err.find("ms with attention-sum, "), std::string::npos) << g.err;
  EXPECT_NE(g.err.find("tp_expert 2 (2 processes per expert worker), reduce: " + mode),
            std::string::npos)
      << g.err;
  EXPECT_EQ(g.doc["routing"]["placement"]["tp_expert_reduce"], mode) << g.doc.dump();
}

// A plan document with tp_expert 2 runs: 2 shards per expert node, with the
// plan's reduction (n2m-partial-sums is attention-sum) unless
// --tp-expert-reduce says otherwise; --tp-expert conflicts with --plan. The
// planner picks tp_expert 1 for this CPU catalogue, so its plan is edited to
// tp_expert 2 (and 1 attention node, 2 micro-batches) with the derived
// fields the plan reader checks made consistent.
TEST(ExpertTpPlanTest, APlanWithTpExpertRuns) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string base = ::testing::TempDir() + "/" + std::to_string(::getpid());
  std::ofstream(base + "_tp_catalog.json") << R"({
    "defaults": {"nic_util_curve": [[1024, 0.1], [1048576, 0.9]]},
    "gpus": [{"name": "CPU2", "bf16_tflops": 0.47, "memory_gb": 24, "memory_bandwidth_gb_s": 32,
              "nic_gbit_s": 80, "gpus_per_node": 1, "intra_node_gb_s": 32, "price": 1,
              "tdp_w": 100}]})";
  ASSERT_FALSE(msinfer::testing::run_capture(kBinary + " plan --model " + dir + " --catalog " +
                                             base + "_tp_catalog.json --gpu CPU2 --max-gpus 10 " +
                                             "--seq-len 256 --out " + base + "_tp_plan.json")
                   .empty());
  auto j = read_json_file(base + "_tp_plan.json");
  ASSERT_TRUE(j.ok());
  Json& p = (*j)["plan"];
  const int64_t b = p["batch_per_micro_batch"].get<int64_t>();
  const int64_t nodes = p["expert_nodes"].get<int64_t>();
  p["tp_expert"] = 2;
  p["expert_tp_reduction"] = "n2m-partial-sums";
  p["attention_nodes"] = 1;
  p["attention_gpus"] = 1;
  p["micro_batches"] = 2;
  p["global_batch"] = 2 * b;
  p["expert_gpus"] = 2 * nodes;
  p["gpus"] = 1 + 2 * nodes;
  Json& sm = (*j)["stage_model"];
  sm["expert_bytes_per_token"] = sm["expert_bytes_per_token"].get<double>() / 2;
  const std::string plan = base + "_tp2_plan.json";
  std::ofstream(plan) << j->dump();
  const std::string args = "--model " + dir + " --prompt-ids 5,9,22,40 --max-tokens 8 --ignore-eos";
  const auto ref = generate(args).tokens;
  ASSERT_EQ(ref.size(), 8u);
  Generated g = generate(args + " --plan " + plan);
  EXPECT_EQ(g.tokens, ref);
  EXPECT_NE(g.err.find("tp_expert 2 (2 processes per expert worker), reduce: attention-sum"),
            std::string::npos)
      << g.err;
  EXPECT_NE(g.err.find("expert worker " + std::to_string(nodes - 1) + " tp rank 1: pid"),
            std::string::npos)
      << g.err;
  g = generate(args + " --plan " + plan + " --tp-expert-reduce allreduce");
  EXPECT_EQ(g.tokens, ref);
  EXPECT_NE(g.err.find("reduce: allreduce"), std::string::npos) << g.err;
  const std::string out =
      msinfer::testing::run_capture("sh -c '" + kBinary + " generate " + args + " --plan " + plan +
                                    " --tp-expert 2 2>&1; echo exit=$?'");
  EXPECT_NE(out.find("--tp-expert conflicts with --plan"), std::string::npos) << out;
}

// bench serve's worker counters through a 1 + (2 workers x 2 shards)
// deployment: every expert row is computed by both shards and counted once
// (by shard 0); the bytes each mode moves are the rows' bytes, tp times
// towards the attention worker (attention-sum) or once towards it plus once
// between the shards (allreduce); the attention worker sends every shard the
// whole row (so at least tp times each row).
TEST(ExpertTpBenchTest, CountersAccountForEveryRowAndByte) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto cfg = read_json_file(dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  const int64_t row_bytes = (*cfg)["hidden_size"].get<int64_t>() * 4;
  const int64_t layers = (*cfg)["num_hidden_layers"].get<int64_t>();
  const int64_t top_k = (*cfg)["num_experts_per_tok"].get<int64_t>();
  for (const std::string mode : {"attention-sum", "allreduce"}) {
    const std::string out = msinfer::testing::run_capture(
        kBinary + " bench serve --offline --model " + dir +
        " --num-prompts 4 --input-len 9 --output-len 6 --attention-workers 1 --expert-workers 2"
        " --micro-batches 2 --tp-expert 2 --tp-expert-reduce " +
        mode + " --json 2>/dev/null");
    auto j = parse_json(out, "bench serve --json");
    ASSERT_TRUE(j.ok()) << mode << ": " << out.substr(0, 300);
    const auto& workers = (*j)["workers"];
    ASSERT_EQ(workers.size(), 5u) << mode;
    int64_t rows = 0, answer_bytes = 0, reduce_bytes = 0;
    for (size_t i = 1; i < workers.size(); ++i) {
      const auto& w = workers[i];
      EXPECT_EQ(w["role"], "expert");
      EXPECT_EQ(w["tp_rank"], static_cast<int>((i - 1) % 2)) << w.dump();
      if (w["tp_rank"] != 0) {
        EXPECT_EQ(w["tokens"], 0) << w.dump();
      }
      rows += w["tokens"].get<int64_t>();
      answer_bytes += w["m2n_bytes_sent"].get<int64_t>();
      reduce_bytes += w["tp_reduce_bytes_sent"].get<int64_t>();
    }
    // Decode phase: 4 requests x 5 more tokens, top_k rows each per layer.
    EXPECT_EQ(rows, 4 * 5 * top_k * layers) << mode;
    const bool sum = mode == "attention-sum";
    EXPECT_EQ(answer_bytes, (sum ? 2 : 1) * rows * row_bytes) << mode;
    EXPECT_EQ(reduce_bytes, (sum ? 0 : 1) * rows * row_bytes) << mode;
    EXPECT_GE(workers[0]["m2n_bytes_sent"].get<int64_t>(), 2 * rows * row_bytes) << mode;
  }
}

TEST(ExpertTpFlagsTest, BadValuesAreRefused) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto run = [&](const std::string& extra) {
    return msinfer::testing::run_capture("sh -c '" + kBinary + " generate --model " + dir +
                                         " --prompt-ids 5,9 --max-tokens 2 " + extra +
                                         " 2>&1; echo exit=$?'");
  };
  std::string out = run("--attention-workers 1 --expert-workers 2 --tp-expert 3");
  EXPECT_NE(out.find("does not divide the experts' FFN width 128"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
  out = run("--attention-workers 1 --expert-workers 2 --tp-expert 2 --tp-expert-reduce sum");
  EXPECT_NE(out.find("expected attention-sum or allreduce"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
  out = run("--tp-expert 2");
  EXPECT_NE(out.find("need --attention-workers"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
}

// ---- a killed shard ----

class ExpertTpKillTest : public ::testing::TestWithParam<std::string> {};

// Killing shard 1 of expert worker 1 mid-generation: the request ends with an
// error naming that shard, every other process exits, nothing hangs and no
// shared memory is left behind.
TEST_P(ExpertTpKillTest, AKilledShardIsNamedAndEverythingStops) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string mode = GetParam();
  pid_t victim = -1;
  std::chrono::steady_clock::time_point killed_at;
  const auto run = msinfer::testing::watch_router(
      {kBinary,
       "generate",
       "--model",
       dir,
       "--prompt-ids",
       "5,9,22",
       "--max-tokens",
       "3500",
       "--ignore-eos",
       "--attention-workers",
       "2",
       "--expert-workers",
       "2",
       "--micro-batches",
       "2",
       "--tp-expert",
       "2",
       "--tp-expert-reduce",
       mode,
       "--timeout-ms",
       "2000"},
      [&](const char* line, const std::map<std::string, pid_t>& pids) {
        if (victim < 0 && std::strstr(line, "msinfer: step 32") != nullptr &&
            pids.count("expert1.1")) {
          victim = pids.at("expert1.1");
          ::kill(victim, SIGKILL);
          killed_at = std::chrono::steady_clock::now();
        }
      });
  const std::string& all = run.stderr_text;
  const int status = run.status;
  const auto& pids = run.pids;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_GT(victim, 0) << "never saw the workers start and run:\n" << all;
  EXPECT_EQ(pids.size(), 6u) << all;  // 2 attention workers, 2 x 2 shards
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << all;
  EXPECT_NE(all.find("expert worker 1 tp rank 1 (pid " + std::to_string(victim) +
                     ") was killed by signal 9"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("request 1"), std::string::npos) << all;
  EXPECT_LT(seconds, 2.0 + 10.0) << "not detected within the M2N timeout";
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/true);
}

// A shard that hangs (SIGSTOP) instead of dying: nobody sees it exit, so the
// M2N timeouts must name it — the attention worker waiting for its answer
// (attention-sum) or shard 0 waiting for its partials (allreduce). The
// router then stops everything, the stopped shard included.
TEST_P(ExpertTpKillTest, AHungShardIsNamedByTheTimeout) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string mode = GetParam();
  pid_t victim = -1;
  const auto run = msinfer::testing::watch_router(
      {kBinary,
       "generate",
       "--model",
       dir,
       "--prompt-ids",
       "5,9,22",
       "--max-tokens",
       "3500",
       "--ignore-eos",
       "--attention-workers",
       "1",
       "--expert-workers",
       "2",
       "--micro-batches",
       "2",
       "--tp-expert",
       "2",
       "--tp-expert-reduce",
       mode,
       "--timeout-ms",
       "1000"},
      [&](const char* line, const std::map<std::string, pid_t>& pids) {
        if (victim < 0 && std::strstr(line, "msinfer: step 32") != nullptr &&
            pids.count("expert1.1")) {
          victim = pids.at("expert1.1");
          ::kill(victim, SIGSTOP);
        }
      });
  const std::string& all = run.stderr_text;
  const int status = run.status;
  const auto& pids = run.pids;
  ASSERT_GT(victim, 0) << "never saw the workers start and run:\n" << all;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << all;
  const std::string named = mode == "allreduce" ? "no partial output from expert worker 1 tp rank 1"
                                                : "no answer from expert worker 1 tp rank 1";
  EXPECT_NE(all.find(named), std::string::npos) << all;
  // Reaped by the router, or gone: a stopped child left behind would be a zombie of
  // the router's, already reaped when the router exits.
  msinfer::testing::expect_workers_gone(pids, /*no_shm=*/false);
}

INSTANTIATE_TEST_SUITE_P(Modes, ExpertTpKillTest, ::testing::Values("attention-sum", "allreduce"),
                         [](const auto& info) {
                           std::string n = info.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

}  // namespace
}  // namespace msinfer::runtime
