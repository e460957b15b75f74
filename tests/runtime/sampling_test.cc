#include "msinfer/runtime/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "test_models.h"

namespace msinfer::runtime {
namespace {

TEST(SamplingTest, GreedyTopKOneAndTinyTopPPickTheArgmax) {
  std::vector<float> l = {0.1f, 2.0f, 1.9f, -1.f};
  std::mt19937_64 rng(1);
  SamplingParams p;
  EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
  p.top_k = 0;
  p.top_p = 1e-6f;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
}

// The two-pass argmax against std::max_element (the first largest): sizes
// around the lane count, ties (many equal maxima, signed zeros), all-negative
// and infinite values, a NaN that must not win.
TEST(SamplingTest, ArgmaxIsTheFirstLargest) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> small(-3, 3);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 390, 1000, 32000}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (auto& v : x) v = trial % 2 ? static_cast<float>(small(rng)) : normal(rng) - 100.f;
      if (trial == 4) x[n / 2] = std::numeric_limits<float>::infinity();
      const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
      EXPECT_EQ(argmax(x.data(), n), want) << "n " << n << " trial " << trial;
    }
  }
  std::vector<float> z = {-0.f, 0.f, -1.f};  // equal under ==: the first
  EXPECT_EQ(argmax(z.data(), 3), 0);
  std::vector<float> nan(40, -5.f);
  nan[3] = std::nanf("");
  nan[37] = -4.f;
  EXPECT_EQ(argmax(nan.data(), 40), 37);
  std::vector<float> all(20, std::nanf(""));
  EXPECT_EQ(argmax(all.data(), 20), 0);
  EXPECT_EQ(argmax(all.data(), 0), 0);
}

TEST(SamplingTest, FrequenciesFollowTheTemperatureSoftmax) {
  std::vector<float> l = {0.f, 1.f, 2.f};
  SamplingParams p;
  p.temperature = 2.0f;
  std::mt19937_64 rng(42);
  std::vector<int> count(3, 0);
  const int n = 60000;
  for (int i = 0; i < n; ++i) ++count[sample_token(l.data(), 3, p, rng)];
  double z = 1 + std::exp(0.5) + std::exp(1.0);
  EXPECT_NEAR(count[0] / double(n), 1 / z, 0.01);
  EXPECT_NEAR(count[2] / double(n), std::exp(1.0) / z, 0.01);
  // top-k 2 removes token 0 entirely.
  p.top_k = 2;
  for (int i = 0; i < 1000; ++i) EXPECT_NE(sample_token(l.data(), 3, p, rng), 0);
}

TEST(SamplingTest, SeededAndValidated) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 1.3f);
  SamplingParams p;
  p.temperature = 1.0f;
  auto draw = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v;
    for (int i = 0; i < 20; ++i) v.push_back(sample_token(l.data(), 50, p, rng));
    return v;
  };
  EXPECT_EQ(draw(3), draw(3));
  EXPECT_NE(draw(3), draw(4));
  SamplingParams bad;
  bad.temperature = -1;
  EXPECT_FALSE(bad.validate().ok());
  bad.temperature = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(bad.validate().ok());
  bad = SamplingParams{};
  bad.max_tokens = 0;
  EXPECT_FALSE(bad.validate().ok());
}

// The penalties and the distribution sample_token() draws from against
// tests/runtime/sampling_reference.py (PyTorch, vLLM's definitions) on the
// same logits: repetition, frequency and presence penalties over a prompt and
// an output with repeats, min_p, top_k, top_p, alone and together.
TEST(SamplingTest, PenaltiesAndDistributionMatchTorch) {
  if (!testing::have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch not found";
  constexpr int64_t kVocab = 300;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.f, 2.5f);
  std::vector<float> logits(kVocab);
  for (auto& v : logits) v = normal(rng);
  const std::vector<int32_t> prompt = {3, 17, 17, 250, 42, 7};
  const std::vector<int32_t> output = {42, 9, 9, 9, 17, 123, 299};
  struct Case {
    float t, top_p, min_p, rep, freq, pres;
    int top_k;
  };
  const std::vector<Case> cases = {
      {1.0f, 1.f, 0.f, 1.f, 0.f, 0.f, 0},        {0.7f, 1.f, 0.f, 1.3f, 0.f, 0.f, 0},
      {1.0f, 1.f, 0.f, 0.6f, 0.f, 0.f, 0},       {1.0f, 1.f, 0.f, 1.5f, 0.4f, -0.3f, 0},
      {1.0f, 1.f, 0.05f, 1.f, 0.f, 0.f, 0},      {1.6f, 1.f, 0.2f, 1.f, 0.f, 0.f, 0},
      {1.0f, 0.8f, 0.f, 1.f, 0.f, 0.f, 0},       {0.9f, 0.9f, 0.03f, 1.f, 0.f, 0.f, 40},
      {1.2f, 0.6f, 0.01f, 1.2f, 0.5f, 0.5f, 25},
  };
  Json doc{{"logits", logits}, {"cases", Json::array()}};
  for (const Case& c : cases) {
    doc["cases"].push_back({{"temperature", c.t},
                            {"top_k", c.top_k},
                            {"top_p", c.top_p},
                            {"min_p", c.min_p},
                            {"repetition_penalty", c.rep},
                            {"frequency_penalty", c.freq},
                            {"presence_penalty", c.pres},
                            {"prompt", prompt},
                            {"output", output}});
  }
  const std::string in = ::testing::TempDir() + "/sampling-ref-" + std::to_string(::getpid());
  std::ofstream(in) << doc.dump();
  const std::string out = msinfer::testing::run_capture(
      "/usr/bin/python3 '" MSINFER_SOURCE_DIR "/tests/runtime/sampling_reference.py' < " + in);
  std::filesystem::remove(in);
  ASSERT_FALSE(out.empty()) << "sampling_reference.py failed";
  const Json ref = Json::parse(out);
  ASSERT_EQ(ref["cases"].size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SamplingParams p;
    p.temperature = c.t;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.repetition_penalty = c.rep;
    p.frequency_penalty = c.freq;
    p.presence_penalty = c.pres;
    ASSERT_TRUE(p.validate().ok());
    std::vector<float> pen = logits;
    apply_penalties(pen.data(), kVocab, p, prompt.data(), static_cast<int64_t>(prompt.size()),
                    output.data(), static_cast<int64_t>(output.size()));
    const auto want_pen = ref["cases"][i]["penalised"].get<std::vector<float>>();
    const auto want_probs = ref["cases"][i]["probs"].get<std::vector<double>>();
    const std::vector<double> probs = sampling_distribution(pen.data(), kVocab, p);
    int kept = 0;
    for (int64_t t = 0; t < kVocab; ++t) {
      ASSERT_NEAR(pen[t], want_pen[t], 1e-5f) << "case " << i << " token " << t;
      ASSERT_NEAR(probs[t], want_probs[t], 1e-6) << "case " << i << " token " << t;
      // The same tokens are possible, not merely similar probabilities.
      ASSERT_EQ(probs[t] > 0, want_probs[t] > 0) << "case " << i << " token " << t;
      kept += probs[t] > 0;
    }
    if (c.min_p > 0 || c.top_k > 0 || c.top_p < 1) {
      EXPECT_LT(kept, kVocab) << "case " << i;
    }
  }
}

// sample_token() draws from sampling_distribution(): frequencies over many
// seeded draws with min_p, top_k and top_p together.
TEST(SamplingTest, DrawsFollowTheDistribution) {
  std::vector<float> l(64);
  for (int i = 0; i < 64; ++i) l[i] = 3.f * std::sin(i * 0.7f);
  SamplingParams p;
  p.temperature = 0.8f;
  p.min_p = 0.1f;
  p.top_k = 6;
  p.top_p = 0.9f;
  const std::vector<double> want = sampling_distribution(l.data(), 64, p);
  std::vector<int> count(64, 0);
  std::mt19937_64 rng(5);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[sample_token(l.data(), 64, p, rng)];
  for (int t = 0; t < 64; ++t) {
    if (want[t] == 0) {
      EXPECT_EQ(count[t], 0) << t;
    }
    EXPECT_NEAR(count[t] / double(n), want[t], 0.01) << t;
  }
}

// The draw over a vocabulary of many blocks (it sums blocks of 256 weights
// first): frequencies of 20 ranges of ids against sampling_distribution(),
// every token a candidate, with top_p (whose cut reorders the candidates),
// and with min_p.
TEST(SamplingTest, DrawsOverALargeVocabularyFollowTheDistribution) {
  const int64_t V = 5000;
  std::vector<float> l(V);
  for (int64_t i = 0; i < V; ++i) l[i] = 2.f * std::sin(float(i) * 0.0021f) + std::cos(i * 0.9f);
  for (const auto& [top_p, min_p] :
       std::vector<std::pair<float, float>>{{1.f, 0.f}, {0.7f, 0.f}, {1.f, 0.2f}}) {
    SCOPED_TRACE("top_p " + std::to_string(top_p) + " min_p " + std::to_string(min_p));
    SamplingParams p;
    p.temperature = 1.f;
    p.top_p = top_p;
    p.min_p = min_p;
    const std::vector<double> want = sampling_distribution(l.data(), V, p);
    constexpr int kRanges = 20;
    std::vector<double> want_range(kRanges, 0.0);
    for (int64_t t = 0; t < V; ++t) want_range[t * kRanges / V] += want[t];
    std::vector<int> count(kRanges, 0);
    std::mt19937_64 rng(9);
    const int n = 30000;
    for (int i = 0; i < n; ++i) {
      const int32_t t = sample_token(l.data(), V, p, rng);
      ASSERT_GT(want[t], 0.0) << t;
      ++count[t * kRanges / V];
    }
    for (int r = 0; r < kRanges; ++r) {
      EXPECT_NEAR(count[r] / double(n), want_range[r], 0.008) << "ids from " << r * V / kRanges;
    }
  }
}

// On a large vocabulary, the distribution is the definition's: every token
// sorted by logit, cut at top_k and then at the top_p mass, renormalised.
// Flat logits need more than the first sorted slice for top_p 0.9, peaked
// ones less; suppressed tokens never appear.
TEST(SamplingTest, LargeVocabularyDistributionIsTheFullSortsDefinition) {
  const int64_t V = 20000;
  auto reference = [&](const std::vector<float>& l, const SamplingParams& p) {
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    const int64_t keep = p.top_k > 0 ? std::min<int64_t>(p.top_k, V) : V;
    std::vector<double> w(keep);
    double sum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      sum += w[i] = std::exp((double(l[idx[i]]) - l[idx[0]]) / p.temperature);
    }
    int64_t n = keep;
    double mass = 0;
    for (int64_t i = 0; i < keep && p.top_p < 1.f; ++i) {
      mass += w[i] / sum;
      if (mass >= p.top_p) {
        n = i + 1;
        break;
      }
    }
    double kept = 0;
    for (int64_t i = 0; i < n; ++i) kept += w[i];
    std::vector<double> out(V, 0.0);
    for (int64_t i = 0; i < n; ++i) out[idx[i]] = w[i] / kept;
    return out;
  };
  // Flat, peaked, and 13 distinct values (ties at every cut: lower ids first).
  for (const float amplitude : {0.05f, 8.f, 0.f}) {
    std::vector<float> l(V);
    for (int64_t i = 0; i < V; ++i) {
      l[i] = amplitude > 0 ? amplitude * std::sin(float(i) * 0.37f) : float((i * 7) % 13);
    }
    for (int64_t i = 0; i < V; i += 97) l[i] = -std::numeric_limits<float>::infinity();
    for (const auto& [top_k, top_p] :
         std::vector<std::pair<int, float>>{
             {0, 1.f}, {0, 0.9f}, {0, 0.3f}, {50, 0.9f}, {5000, 1.f}}) {
      SCOPED_TRACE("amplitude " + std::to_string(amplitude) + " top_k " + std::to_string(top_k) +
                   " top_p " + std::to_string(top_p));
      SamplingParams p;
      p.temperature = 0.7f;
      p.top_k = top_k;
      p.top_p = top_p;
      const std::vector<double> got = sampling_distribution(l.data(), V, p);
      const std::vector<double> want = reference(l, p);
      int64_t support = 0;
      for (int64_t t = 0; t < V; ++t) {
        // The weights are floats from the CPU level's vector exp (relative
        // error ~2e-7, ops.h's exp_scaled), the reference's doubles.
        ASSERT_NEAR(got[t], want[t], 1e-5 * want[t]) << t;
        support += want[t] > 0;
      }
      EXPECT_EQ(got[0], 0.0);  // suppressed (ids 0, 97, ...): never drawn
      // The flat case's top_p 0.9 keeps thousands of tokens: past any
      // first slice the sampler sorts.
      if (amplitude > 0.f && amplitude < 1.f && top_k == 0 && top_p == 0.9f) {
        EXPECT_GT(support, 10000);
      }
    }
  }
}

// min_tokens: the stop ids and EOS are impossible until then, exactly; EOS
// stays possible with ignore_eos (it would not stop anything).
TEST(SamplingTest, MinTokensSuppressesEosAndStopIds) {
  std::vector<float> l(10, 0.f);
  SamplingParams p;
  p.max_tokens = 8;
  p.min_tokens = 3;
  p.stop_token_ids = {4, 7, 99};  // 99: outside this vocabulary, skipped
  const std::vector<int64_t> eos = {2};
  for (int64_t generated = 0; generated < 5; ++generated) {
    std::vector<float> x = l;
    const bool changed = suppress_stops(x.data(), 10, p, eos.data(), 1, generated);
    EXPECT_EQ(changed, generated < 3);
    for (int t = 0; t < 10; ++t) {
      const bool gone = generated < 3 && (t == 2 || t == 4 || t == 7);
      EXPECT_EQ(x[t] == -std::numeric_limits<float>::infinity(), gone) << generated << " " << t;
    }
    std::mt19937_64 rng(generated);
    p.temperature = 1.f;
    for (int i = 0; i < 200 && generated < 3; ++i) {
      const int32_t tok = sample_token(x.data(), 10, p, rng);
      EXPECT_TRUE(tok != 2 && tok != 4 && tok != 7) << tok;
    }
  }
  p.ignore_eos = true;
  std::vector<float> x = l;
  EXPECT_TRUE(suppress_stops(x.data(), 10, p, eos.data(), 1, 0));
  EXPECT_EQ(x[2], 0.f);
  EXPECT_EQ(x[4], -std::numeric_limits<float>::infinity());
  // Validation of the new fields.
  SamplingParams bad;
  bad.min_p = 1.5f;
  EXPECT_FALSE(bad.validate().ok());
  bad = SamplingParams{};
  bad.repetition_penalty = 0.f;
  EXPECT_FALSE(bad.validate().ok());
  bad = SamplingParams{};
  bad.min_tokens = 17;  // > max_tokens (16)
  EXPECT_FALSE(bad.validate().ok());
}

}  // namespace
}  // namespace msinfer::runtime
