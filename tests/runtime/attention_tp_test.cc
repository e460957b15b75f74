// Attention tensor parallelism (issue 14): an attention replica served by
// tp_attention processes, rank r holding query heads [r H/tp, (r+1) H/tp) and
// the KV heads they read (a share of them, or one head replicated when tp is a
// multiple of the KV heads: tp 4 on the tiny presets' 4 / 2 heads), with
// column-parallel q/k/v, row-parallel o_proj and its own KV pool; rank 0 adds
// the ranks' partial o_proj outputs in rank order.
//
// "Equal up to a near-tie" as in expert_tp_test.cc: the ranks' partial sums
// add the o_proj reduction in another order than one GEMM over all heads, so
// an activation can round differently. Greedy tokens must equal the
// co-located engine's; where they first differ, the tp run's token must be
// within kNearTie of the co-located engine's best logit at that step (the
// exactness test's max |dlogit| bar), and the comparison stops there.
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
#include <tuple>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/model_runner.h"
#include "test_models.h"
#include "tp_checks.h"

namespace msinfer::runtime {
namespace {

const std::string kBinary = MSINFER_BINARY;

std::unique_ptr<model::ModelWeights> load_rank(const std::string& dir, int rank, int tp,
                                               bool experts = false) {
  model::LoadOptions lo;
  lo.all_experts = experts;
  lo.attention_tp_rank = rank;
  lo.attention_tp_size = tp;
  auto w = model::ModelWeights::load(dir, lo);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::move(w).value() : nullptr;
}

size_t attention_bytes(const model::ModelWeights& w) {
  size_t b = 0;
  for (const auto& L : w.layers()) b += L.qkv.bytes() + L.o.bytes();
  return b;
}

// ---- weights and arithmetic: the ranks' partials add up to the whole layer ----

// (preset, tp): tp 2 splits the KV heads, tp 4 replicates them.
using PresetTp = std::tuple<std::string, int>;
std::string preset_tp_name(const ::testing::TestParamInfo<PresetTp>& i) {
  std::string n = std::get<0>(i.param) + "_tp" + std::to_string(std::get<1>(i.param));
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

class AttentionShardTest : public ::testing::TestWithParam<PresetTp> {};

// A prefill of T tokens through layer l, once with all heads and once per
// rank of tp (each with its own KV pool of its KV heads): the ranks' o_proj
// outputs sum to the whole layer's (fp32, another summation order), each rank
// holds its heads' q/k/v/o weights (half of them at tp 2), and ranks > 0 hold
// nothing else.
TEST_P(AttentionShardTest, RankPartialsSumToTheWholeLayerAndHoldTheirHeads) {
  const auto [preset, tp] = GetParam();
  const std::string name = preset + " tp " + std::to_string(tp);
  const std::string dir = testing::test_model_dir(preset);
  auto full = load_rank(dir, 0, 1);
  ASSERT_NE(full, nullptr);
  const ModelConfig& mc = full->config();
  const int kv_per_rank = tp <= mc.kv_heads ? mc.kv_heads / tp : 1;
  std::vector<std::unique_ptr<model::ModelWeights>> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.push_back(load_rank(dir, r, tp));
    ASSERT_NE(ranks[r], nullptr);
  }
  for (int r = 0; r < tp; ++r) {
    const model::LayerWeights& L = ranks[r]->layers()[0];
    EXPECT_EQ(L.qkv.n(), (mc.heads / tp + 2 * kv_per_rank) * mc.head_dim) << name;
    EXPECT_EQ(L.o.k(), mc.heads * mc.head_dim / tp) << name;
    if (tp == 2) {  // an even split: half the packed bytes (panels padded alike)
      const double ratio =
          static_cast<double>(attention_bytes(*ranks[r])) * tp / attention_bytes(*full);
      EXPECT_NEAR(ratio, 1.0, 0.05) << name << " rank " << r;
    }
    // Ranks > 0: no embedding, LM head or router, so their packed bytes are
    // their attention slices; rank 0 keeps the LM head and the routers.
    if (r > 0) {
      EXPECT_EQ(ranks[r]->packed_bytes(), attention_bytes(*ranks[r])) << name;
    }
  }
  EXPECT_GT(ranks[0]->packed_bytes(), attention_bytes(*ranks[0]));

  const int64_t T = 7, h = mc.hidden;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(T * h), want(T * h), got(T * h), part(T * h);
  for (float& v : x) v = nd(rng);
  TokenBatch b;
  for (int64_t t = 0; t < T; ++t) {
    b.ids.push_back(static_cast<int32_t>(t));
    b.positions.push_back(static_cast<int32_t>(t));
  }
  auto make_kv = [&](const model::ModelWeights& w) {
    auto kv = KvCache::create(attention_tp_config(w), 1 << 20, 4);
    EXPECT_TRUE(kv.ok());
    EXPECT_TRUE(kv->reserve(1, T).ok());
    return std::move(kv).value();
  };
  for (int l = 0; l < mc.layers; ++l) {
    KvCache kv_full = make_kv(*full);
    b.block_tables.assign(T, kv_full.block_table(1));
    AttentionRunner whole(*full);
    ASSERT_TRUE(whole.attention_partial(l, b, kv_full, x.data(), want.data()).ok());
    std::fill(got.begin(), got.end(), 0.f);
    for (int r = 0; r < tp; ++r) {
      KvCache kv = make_kv(*ranks[r]);
      // Its KV heads' bytes per token: 1/tp of them, or one replicated head.
      EXPECT_EQ(kv.total_blocks(), kv_full.total_blocks() * mc.kv_heads / kv_per_rank);
      b.block_tables.assign(T, kv.block_table(1));
      AttentionRunner runner(*ranks[r]);
      ASSERT_TRUE(runner.attention_partial(l, b, kv, x.data(), part.data()).ok());
      for (int64_t i = 0; i < T * h; ++i) got[i] += part[i];
    }
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < T * h; ++i) {
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(double(want[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale + 1e-7) << name << " layer " << l;
  }
}

TEST(AttentionShardErrorsTest, AnUnevenSplitOrABadRankIsAnError) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");  // 4 heads, 2 KV heads
  model::LoadOptions lo;
  lo.all_experts = false;
  lo.attention_tp_size = 3;  // divides neither
  auto w = model::ModelWeights::load(dir, lo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("tp_attention 3 must divide the query heads (4) and divide "
                                      "or be a multiple of the KV heads (2)"),
            std::string::npos)
      << w.status().to_string();
  lo.attention_tp_size = 8;  // a multiple of the KV heads, but more ranks than query heads
  w = model::ModelWeights::load(dir, lo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("tp_attention 8 must divide the query heads (4)"),
            std::string::npos)
      << w.status().to_string();
  lo.attention_tp_size = 2;
  lo.attention_tp_rank = 2;
  w = model::ModelWeights::load(dir, lo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("out of range"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, AttentionShardTest,
                         ::testing::Combine(::testing::Values("tiny-mixtral", "tiny-qwen3moe"),
                                            ::testing::Values(2, 4)),
                         preset_tp_name);

// ---- logits of the tp engine against PyTorch ----

// Ranks 1..tp-1 of a replica in this process: the engine (rank 0) hands them
// each layer's normed input and batch; each computes its heads over its own
// KV pool (same block ids as rank 0's), and their partials are added as the
// runtime adds them (rank order, after rank 0's).
class InProcessPeers : public AttentionPeers {
 public:
  InProcessPeers(const std::string& dir, int tp, int64_t kv_bytes, int64_t block_size) {
    for (int r = 1; r < tp; ++r) {
      Rank& k = ranks_.emplace_back();
      k.w = load_rank(dir, r, tp);
      k.runner = std::make_unique<AttentionRunner>(*k.w);
      k.kv = std::make_unique<KvCache>(
          KvCache::create(attention_tp_config(*k.w), kv_bytes, block_size).value());
    }
  }
  Status start(int l, const TokenBatch& b, const int32_t* const*, const float* h) override {
    ++calls_;
    for (Rank& k : ranks_) {
      k.part.resize(b.size() * k.w->config().hidden);
      MSI_RETURN_IF_ERROR(k.runner->attention_partial(l, b, *k.kv, h, k.part.data()));
    }
    return ok_status();
  }
  Status add_partials(int, int64_t T, float* o) override {
    for (const Rank& k : ranks_) {
      for (int64_t i = 0; i < T * k.w->config().hidden; ++i) o[i] += k.part[i];
    }
    return ok_status();
  }
  int64_t calls() const { return calls_; }

 private:
  struct Rank {
    std::unique_ptr<model::ModelWeights> w;
    std::unique_ptr<AttentionRunner> runner;
    std::unique_ptr<KvCache> kv;
    std::vector<float> part;
  };
  std::vector<Rank> ranks_;
  int64_t calls_ = 0;
};

class AttentionTpTorchTest : public ::testing::TestWithParam<PresetTp> {};

// Prefill plus 16 greedy steps through the engine with tp-2 or tp-4 attention
// (rank 0's weights with its peers, m = 2): logits within the exactness
// test's tolerance of the PyTorch reference (max |d| <= 1e-2, mean <= 1e-3)
// and the same greedy tokens.
TEST_P(AttentionTpTorchTest, TpLogitsMatchPyTorch) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found";
  const auto [preset, tp] = GetParam();
  const std::string dir = testing::test_model_dir(preset);
  const std::vector<int32_t> prompt = {5, 9, 22, 40, 7, 8, 11, 3, 60};
  constexpr int kSteps = 17;
  const auto [ref_tokens, ref_logits] = testing::torch_reference(dir, prompt, kSteps);
  ASSERT_FALSE(ref_logits.empty());

  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.block_size = 4;
  o.micro_batches = 2;
  InProcessPeers peers(dir, tp, o.kv_cache_bytes, o.block_size);
  o.attention_peers = &peers;
  auto e =
      Engine::create(std::shared_ptr<const model::ModelWeights>(load_rank(dir, 0, tp, true)), o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const testing::GreedyRun run = testing::run_greedy(**e, prompt, kSteps);
  EXPECT_GT(peers.calls(), 0);
  EXPECT_EQ(run.tokens, ref_tokens);
  const testing::LogitError err = testing::logit_error(run.logits, ref_logits);
  EXPECT_LE(err.max, testing::kMaxLogitError) << preset << " tp " << tp;
  EXPECT_LE(err.mean, testing::kMeanLogitError) << preset << " tp " << tp;
  std::printf("[ attention tp ] %s, tp %d vs PyTorch: |dlogit| max %.3g, mean %.3g\n",
              preset.c_str(), tp, err.max, err.mean);
}

// Without its peers the engine refuses tp weights (it would compute half the heads).
TEST(AttentionTpEngineTest, TpWeightsWithoutPeersAreRefused) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(load_rank(dir, 0, 2, true)),
                          EngineOptions{});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented);
}

// n > 1 with attention tp: a forked sequence does not get a copy of the
// prompt's partly filled last block (the peers hold their heads' K/V of it,
// which a copy on rank 0 would leave behind); it shares the full blocks and
// recomputes the rest on every rank. Greedy n = 2 equals n = 1, and right
// after the fork the two sequences hold 2 shared blocks + the parent's last.
TEST(AttentionTpEngineTest, NSamplesRecomputeTheLastBlockOnEveryRank) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  std::map<int32_t, std::vector<int32_t>> by_n[3];
  std::vector<std::vector<float>> logits[3];  // per sampled token, in sampling order
  int64_t used_after_fork = -1;
  for (int n : {1, 2}) {
    EngineOptions o;
    o.kv_cache_bytes = 8 << 20;
    o.block_size = 4;
    InProcessPeers peers(dir, 2, o.kv_cache_bytes, o.block_size);
    o.attention_peers = &peers;
    auto e =
        Engine::create(std::shared_ptr<const model::ModelWeights>(load_rank(dir, 0, 2, true)), o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    (*e)->set_logits_observer([&, n](int64_t, const float* lg, int64_t vocab) {
      logits[n].emplace_back(lg, lg + vocab);
    });
    GenerationRequest r{1, {5, 9, 22, 40, 7, 8, 11, 3, 60}, {}};  // 2 blocks of 4 and 1
    r.sampling.max_tokens = 8;
    r.sampling.ignore_eos = true;
    r.n = n;
    ASSERT_TRUE((*e)->add(r).ok());
    for (int step = 0; !(*e)->idle() && step < 100; ++step) {
      for (const auto& ev : (*e)->step().value()) by_n[n][ev.index].push_back(ev.token);
      if (n == 2 && step == 0) {
        used_after_fork = (*e)->kv_cache().total_blocks() - (*e)->kv_cache().free_blocks();
      }
    }
    EXPECT_EQ((*e)->kv_usage(), 0.0);
  }
  ASSERT_EQ(by_n[1][0].size(), 8u);
  ASSERT_EQ(by_n[2].size(), 2u);
  EXPECT_EQ(by_n[2][0], by_n[1][0]);
  EXPECT_EQ(by_n[2][1], by_n[1][0]);
  EXPECT_EQ(used_after_fork, 3);
  // Each step samples sequence 0 then 1 (one micro-batch: the parent's
  // decode row, then the child's): the child's logits are the n = 1 run's,
  // up to the rounding of another batch shape. (A copy of rank 0's part of
  // the block only, the peers' left unwritten, moved them by 0.59.)
  ASSERT_EQ(logits[2].size(), 2 * logits[1].size());
  double max_d = 0;
  for (size_t t = 0; t < logits[1].size(); ++t) {
    for (size_t v = 0; v < logits[1][t].size(); ++v) {
      max_d = std::max<double>(max_d, std::fabs(logits[2][2 * t + 1][v] - logits[1][t][v]));
    }
  }
  std::printf("[ attention tp ] n = 2: the forked sequence's logits within %.3g of n = 1's\n",
              max_d);
  EXPECT_LE(max_d, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, AttentionTpTorchTest,
                         ::testing::Combine(::testing::Values("tiny-mixtral", "tiny-qwen3moe"),
                                            ::testing::Values(2, 4)),
                         preset_tp_name);

// ---- deployments through the binary ----

using testing::colocated_logits;
using testing::expect_equal_up_to_near_tie;
using testing::generate;
using testing::Generated;
using testing::kNearTie;

class AttentionTpTest : public ::testing::TestWithParam<std::string> {};

// (tp_a, tp_e) in {(2, 1), (2, 2)} with m in {1, 2} (n_a = m: one replica with
// one micro-batch, two with two), tp_e = 2 in both reduction modes; and tp_a 4
// (KV heads replicated: two ranks per KV head) with m = 2 on one replica.
TEST_P(AttentionTpTest, SameTokensAsTheColocatedEngine) {
  const testing::DeploymentReference ref(GetParam());
  ASSERT_EQ(ref.tokens.size(), 16u);
  std::vector<std::pair<std::string, int>> deployments;  // (flags, tp_a)
  for (const std::string shape : {"--attention-workers 1 --expert-workers 2 --micro-batches 1",
                                  "--attention-workers 2 --expert-workers 2 --micro-batches 2"}) {
    for (const std::string tp_e : {"", " --tp-expert 2 --tp-expert-reduce attention-sum",
                                   " --tp-expert 2 --tp-expert-reduce allreduce"}) {
      deployments.emplace_back(shape + " --tp-attention 2" + tp_e, 2);
    }
  }
  deployments.emplace_back(
      "--attention-workers 1 --expert-workers 2 --micro-batches 2 --tp-attention 4", 4);
  for (const auto& [d, tp_a] : deployments) {
    const std::string tp = std::to_string(tp_a);
    const Generated g = ref.check(d);
    EXPECT_NE(g.err.find("tp_attention " + tp + " (" + tp + " processes per attention worker)"),
              std::string::npos)
        << g.err;
    EXPECT_NE(g.err.find("attention worker 0 tp rank " + std::to_string(tp_a - 1) + ": pid"),
              std::string::npos)
        << g.err;
    EXPECT_EQ(g.err.find("attention worker 0 tp rank " + tp), std::string::npos) << g.err;
    // The experts count every row once: the replica's rank 0 alone sends.
    const Json& routing = g.doc["routing"];
    for (size_t l = 0; l < routing["expert_tokens"].size(); ++l) {
      int64_t by_expert = 0, by_worker = 0;
      for (const auto& n : routing["expert_tokens"][l]) by_expert += n.get<int64_t>();
      for (const auto& n : routing["worker_tokens"][l]) by_worker += n.get<int64_t>();
      EXPECT_EQ(by_worker, by_expert) << routing.dump();
    }
  }
}

// int8 weights with tp_a 2: each rank quantises its own slices on load (q/k/v
// rows keep their per-row scales; o_proj's rows are scaled over the rank's
// columns only, so the sum is not bit-identical to one int8 GEMM): greedy
// tokens equal the co-located int8 engine's up to a near-tie of its logits.
TEST_P(AttentionTpTest, Int8WeightsSameTokensAsTheColocatedInt8Engine) {
  const std::string dir = testing::test_model_dir(GetParam());
  const std::vector<int32_t> prompt = {5, 9, 22, 40, 7, 8, 11};
  const std::string args = "--model " + dir +
                           " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 16 --ignore-eos"
                           " --weights int8";
  const auto ref = generate(args).tokens;
  ASSERT_EQ(ref.size(), 16u);
  const std::string d =
      "--attention-workers 1 --expert-workers 2 --micro-batches 2 --tp-attention 2";
  const Generated g = generate(args + " " + d);
  expect_equal_up_to_near_tie(ref, g.tokens, dir, prompt, GetParam() + " int8 " + d,
                              kernels::cpu::WeightFormat::kInt8);
  EXPECT_NE(g.err.find("attention worker 0 tp rank 1: pid"), std::string::npos) << g.err;
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, AttentionTpTest,
                         ::testing::Values("tiny-mixtral", "tiny-qwen3moe"));

// A placement file can carry tp_attention; the flag overrides it.
TEST(AttentionTpPlacementTest, APlacementFileCarriesTpAttention) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const std::string placement =
      ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_atp_placement.json";
  std::ofstream(placement) << R"({"expert_workers": 2, "experts": [0, 1, 0, 1, 0, 1, 0, 1],
                                  "tp_attention": 2})";
  const std::string args = "--model " + dir + " --prompt-ids 5,9,22,40 --max-tokens 8 --ignore-eos";
  const auto ref = generate(args).tokens;
  const std::string d = " --attention-workers 1 --expert-workers 2 --placement " + placement;
  Generated g = generate(args + d);
  EXPECT_EQ(g.tokens, ref);
  EXPECT_NE(g.err.find("attention worker 0 tp rank 1: pid"), std::string::npos) << g.err;
  EXPECT_EQ(g.doc["routing"]["placement"]["tp_attention"], 2) << g.doc["routing"].dump();
  g = generate(args + d + " --tp-attention 1");
  EXPECT_EQ(g.tokens, ref);
  EXPECT_EQ(g.err.find("tp rank"), std::string::npos) << g.err;
}

// bench serve through 1 replica x tp 2 + 1 expert worker with four requests
// batched together: the router sees one attention worker (kv usage,
// admission) and the counters say what crossed the tp channels: rank 1 sends
// back exactly one partial row per token per layer, rank 0 sends it every
// token's normed input (plus the header with positions and block tables).
TEST(AttentionTpBenchTest, TheReplicaIsOneWorkerAndTheCountersAccountForEveryRow) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto cfg = read_json_file(dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  const int64_t row_bytes = (*cfg)["hidden_size"].get<int64_t>() * 4;
  const int64_t layers = (*cfg)["num_hidden_layers"].get<int64_t>();
  const std::string out = msinfer::testing::run_capture(
      kBinary + " bench serve --offline --model " + dir +
      " --num-prompts 4 --input-len 9 --output-len 6 --attention-workers 1 --expert-workers 1"
      " --micro-batches 2 --tp-attention 2 --json 2>/dev/null");
  auto j = parse_json(out, "bench serve --json");
  ASSERT_TRUE(j.ok()) << out.substr(0, 300);
  EXPECT_EQ((*j)["generated_tokens"], 4 * 6) << out.substr(0, 600);
  const auto& workers = (*j)["workers"];
  ASSERT_EQ(workers.size(), 3u) << workers.dump();
  EXPECT_EQ(workers[0]["role"], "attention");
  EXPECT_EQ(workers[0]["tp_rank"], 0);
  EXPECT_EQ(workers[1]["role"], "attention");
  EXPECT_EQ(workers[1]["tp_rank"], 1);
  // Decode phase (stats reset after the prefill): 4 requests x 5 more tokens.
  const int64_t tokens = workers[0]["tokens"].get<int64_t>();
  EXPECT_EQ(tokens, 4 * 5) << workers.dump();
  EXPECT_EQ(workers[1]["tokens"], tokens) << workers.dump();
  EXPECT_EQ(workers[1]["tp_reduce_bytes_sent"].get<int64_t>(), tokens * layers * row_bytes)
      << workers.dump();
  EXPECT_GE(workers[0]["tp_reduce_bytes_sent"].get<int64_t>(), tokens * layers * row_bytes)
      << workers.dump();
  EXPECT_EQ(workers[1]["m2n_bytes_sent"], 0) << workers.dump();
}

TEST(AttentionTpFlagsTest, BadValuesAreRefused) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto run = [&](const std::string& extra) {
    return msinfer::testing::run_capture("sh -c '" + kBinary + " generate --model " + dir +
                                         " --prompt-ids 5,9 --max-tokens 2 " + extra +
                                         " 2>&1; echo exit=$?'");
  };
  std::string out = run("--attention-workers 1 --expert-workers 2 --tp-attention 3");
  EXPECT_NE(out.find("tp_attention 3 must divide the query heads (4) and divide or be a multiple "
                     "of the KV heads (2)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
  out = run("--tp-attention 2");
  EXPECT_NE(out.find("need --attention-workers"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
  out = run("--attention-workers 100 --expert-workers 2 --tp-attention 2");
  EXPECT_NE(out.find("attention workers x tp_attention = 200 processes; at most 128"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
}

// ---- a killed or hung tp rank ----

// Killing rank 1 of attention worker 0 (the request's replica)
// mid-generation: the request ends with an error naming that rank, every other process exits, no
// shared memory is left behind.
TEST(AttentionTpKillTest, AKilledRankIsNamedAndEverythingStops) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  pid_t victim = -1;
  std::chrono::steady_clock::time_point killed_at;
  const auto run = msinfer::testing::watch_router(
      {kBinary, "generate", "--model", dir, "--prompt-ids", "5,9,22", "--max-tokens", "3500",
       "--ignore-eos", "--attention-workers", "2", "--expert-workers", "1", "--micro-batches", "2",
       "--tp-attention", "2", "--timeout-ms", "2000"},
      [&](const char* line, const std::map<std::string, pid_t>& pids) {
        if (victim < 0 && std::strstr(line, "msinfer: step 32") != nullptr &&
            pids.count("attention0.1")) {
          victim = pids.at("attention0.1");
          ::kill(victim, SIGKILL);
          killed_at = std::chrono::steady_clock::now();
        }
      });
  const std::string& all = run.stderr_text;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_GT(victim, 0) << "never saw the workers start and run:\n" << all;
  EXPECT_EQ(run.pids.size(), 5u) << all;  // 2 replicas x 2 ranks, 1 expert worker
  EXPECT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) != 0) << all;
  EXPECT_NE(all.find("attention worker 0 tp rank 1 (pid " + std::to_string(victim) +
                     ") was killed by signal 9"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("request 1"), std::string::npos) << all;
  EXPECT_LT(seconds, 2.0 + 10.0) << "not detected within the M2N timeout";
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/true);
}

// A rank that hangs (SIGSTOP): rank 0's wait for its partial times out and
// names it; the router stops everything.
TEST(AttentionTpKillTest, AHungRankIsNamedByTheTimeout) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  pid_t victim = -1;
  const auto run = msinfer::testing::watch_router(
      {kBinary, "generate", "--model", dir, "--prompt-ids", "5,9,22", "--max-tokens", "3500",
       "--ignore-eos", "--attention-workers", "1", "--expert-workers", "1", "--micro-batches", "2",
       "--tp-attention", "2", "--timeout-ms", "1000"},
      [&](const char* line, const std::map<std::string, pid_t>& pids) {
        if (victim < 0 && std::strstr(line, "msinfer: step 32") != nullptr &&
            pids.count("attention0.1")) {
          victim = pids.at("attention0.1");
          ::kill(victim, SIGSTOP);
        }
      });
  const std::string& all = run.stderr_text;
  ASSERT_GT(victim, 0) << "never saw the workers start and run:\n" << all;
  EXPECT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) != 0) << all;
  EXPECT_NE(all.find("no partial attention output from attention worker 0 tp rank 1"),
            std::string::npos)
      << all;
  msinfer::testing::expect_workers_gone(run.pids, /*no_shm=*/false);
}

}  // namespace
}  // namespace msinfer::runtime
