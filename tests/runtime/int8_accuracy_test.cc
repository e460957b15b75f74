// The accuracy check of int8 weights (docs/ENGINE.md): the engine with int8
// GEMM weights against the same engine with bf16 weights, greedy, over a fixed
// set of prompts. Reported per preset: the logits error (max and mean |d| over
// the steps both runs share, relative to the bf16 logits' standard deviation)
// and greedy agreement (the fraction of generated tokens before the first
// divergence). MSINFER_INT8_CHECK_MODEL=DIR runs the same check on another
// model (docs/ENGINE.md has small-mixtral's figures).
//
// Bars, set with margin over what the seeded tiny presets measure (the same at
// every level): tiny-mixtral mean 0.62% / max 4.1% of the logits' std, 99.2%
// agreement; tiny-qwen3moe mean 0.71% / max 25% (a token whose top-2 of 8
// experts changes: the routing is discrete), 70% agreement. Random weights give
// flat logits (std ~1 over the vocabulary), where near-ties flip more easily
// than in a trained model: mean |d| <= 2% and max |d| <= 40% of the std, and
// at least 60% of the greedy tokens agree before the first divergence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <ostream>
#include <random>
#include <tuple>

#include "msinfer/runtime/engine.h"
#include "test_models.h"

namespace msinfer::kernels::cpu {
// The test's parameter as googletest (and so ctest's test names) print it.
void PrintTo(WeightFormat f, std::ostream* os) { *os << weight_format_name(f); }
}  // namespace msinfer::kernels::cpu

namespace msinfer::runtime {
namespace {

using kernels::cpu::WeightFormat;

constexpr int kSteps = 16;
constexpr int kPrompts = 8;

struct Run {
  std::vector<std::vector<int32_t>> tokens;               // per prompt
  std::vector<std::vector<std::vector<float>>> logits;    // per prompt, per step
};

Run run(const std::string& dir, WeightFormat format, const std::vector<std::vector<int32_t>>& prompts) {
  model::LoadOptions lo;
  lo.weights = format;
  auto w = model::ModelWeights::load(dir, lo);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  EngineOptions o;
  o.kv_cache_bytes = 16 << 20;
  o.block_size = 4;
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(std::move(w).value()), o);
  EXPECT_TRUE(e.ok());
  Run r;
  r.tokens.resize(prompts.size());
  r.logits.resize(prompts.size());
  (*e)->set_logits_observer([&](int64_t id, const float* l, int64_t v) {
    r.logits[id - 1].emplace_back(l, l + v);
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest req{static_cast<int64_t>(i + 1), prompts[i], {}};
    req.sampling.max_tokens = kSteps;
    req.sampling.ignore_eos = true;
    EXPECT_TRUE((*e)->add(req).ok());
  }
  while (!(*e)->idle()) {
    for (const auto& ev : (*e)->step().value()) r.tokens[ev.request_id - 1].push_back(ev.token);
  }
  return r;
}

void check(const std::string& name, const std::string& dir, int64_t vocab, WeightFormat format,
           bool enforce) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<int32_t>> prompts(kPrompts);
  for (auto& p : prompts) {
    const int len = 4 + static_cast<int>(rng() % 21);
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % vocab));
  }
  const Run ref = run(dir, WeightFormat::kBf16, prompts);
  const Run q = run(dir, format, prompts);
  double max_d = 0, sum_d = 0, sum_sq = 0, sum_v = 0;
  int64_t n = 0, agree = 0, total = 0;
  for (int i = 0; i < kPrompts; ++i) {
    ASSERT_EQ(ref.tokens[i].size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(q.tokens[i].size(), static_cast<size_t>(kSteps));
    size_t shared = 0;  // steps with the same context in both runs
    while (shared < ref.tokens[i].size() && ref.tokens[i][shared] == q.tokens[i][shared]) ++shared;
    agree += static_cast<int64_t>(shared);
    total += kSteps;
    // Logits of step s are computed from the prompt and tokens 0..s-1.
    for (size_t s = 0; s <= std::min(shared, ref.logits[i].size() - 1); ++s) {
      for (size_t v = 0; v < ref.logits[i][s].size(); ++v) {
        const double a = ref.logits[i][s][v], b = q.logits[i][s][v];
        max_d = std::max(max_d, std::fabs(a - b));
        sum_d += std::fabs(a - b);
        sum_v += a;
        sum_sq += a * a;
        ++n;
      }
    }
  }
  const double mean_v = sum_v / n, sd = std::sqrt(sum_sq / n - mean_v * mean_v);
  const double rel_max = max_d / sd, rel_mean = sum_d / n / sd;
  const double agreement = static_cast<double>(agree) / total;
  std::printf(
      "[ %s ] %s (%s): logits |d| max %.4f, mean %.5f (logit std %.3f: %.2f%% / %.3f%%); "
      "greedy agreement %.1f%% (%lld of %lld tokens before the first divergence)\n",
      kernels::cpu::weight_format_name(format), name.c_str(),
      kernels::cpu::isa_name(kernels::cpu::active_isa()), max_d, sum_d / n, sd, 100 * rel_max,
      100 * rel_mean, 100 * agreement, static_cast<long long>(agree),
      static_cast<long long>(total));
  if (!enforce) return;
  EXPECT_LE(rel_mean, 0.02) << name;
  EXPECT_LE(rel_max, 0.40) << name;
  EXPECT_GE(agreement, 0.60) << name;
}

class Int8AccuracyTest : public ::testing::TestWithParam<std::tuple<std::string, WeightFormat>> {};

TEST_P(Int8AccuracyTest, LogitsAndGreedyTokensStayCloseToBf16) {
  const auto& [preset, format] = GetParam();
  const std::string dir = testing::test_model_dir(preset);
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok());
  check(preset, dir, c->vocab, format, true);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, Int8AccuracyTest,
                         ::testing::Combine(::testing::Values("tiny-mixtral", "tiny-qwen3moe"),
                                            ::testing::Values(WeightFormat::kInt8,
                                                              WeightFormat::kW8A8)),
                         [](const ::testing::TestParamInfo<Int8AccuracyTest::ParamType>& info) {
                           std::string name =
                               std::get<0>(info.param) + "_" +
                               kernels::cpu::weight_format_name(std::get<1>(info.param));
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

TEST(Int8AccuracyCheck, OtherModelFromTheEnvironment) {
  const char* dir = std::getenv("MSINFER_INT8_CHECK_MODEL");
  if (dir == nullptr) GTEST_SKIP() << "MSINFER_INT8_CHECK_MODEL not set";
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kW8A8})
    check(dir, dir, c->vocab, f, false);
}

}  // namespace
}  // namespace msinfer::runtime
