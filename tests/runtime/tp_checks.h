// Shared by the tensor-parallel deployment tests (expert_tp_test.cc,
// attention_tp_test.cc): `msinfer generate --json` through the binary, the
// co-located engine's logits in this process, and the "equal up to a
// near-tie" token check those tests describe. Needs MSINFER_BINARY.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "msinfer/model/weights.h"
#include "msinfer/runtime/engine.h"
#include "test_models.h"

namespace msinfer::runtime::testing {

// A near-tie: within the exactness test's max |dlogit| bar (test_models.h).
constexpr double kNearTie = kMaxLogitError;

struct Generated {
  std::vector<int32_t> tokens;
  std::string err;
  Json doc;  // generate --json's answer
};

// `msinfer generate ARGS --json`; its stderr is kept in err.
inline Generated generate(const std::string& args) {
  const std::string errf =
      ::testing::TempDir() + "/tp_generate_stderr_" + std::to_string(::getpid()) + ".txt";
  const std::string out = msinfer::testing::run_capture(std::string(MSINFER_BINARY) + " generate " +
                                                        args + " --json 2>" + errf);
  Generated g;
  std::stringstream e;
  e << std::ifstream(errf).rdbuf();
  g.err = e.str();
  auto j = parse_json(out, "generate --json");
  EXPECT_TRUE(j.ok()) << args << "\nstdout: " << out.substr(0, 300) << "\nstderr: " << g.err;
  if (j.ok()) {
    g.tokens = (*j)["token_ids"].get<std::vector<int32_t>>();
    g.doc = *j;
  }
  return g;
}

// One request (`prompt`) alone on `e`, greedy, to `steps` tokens: its tokens
// and each step's logits.
struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
inline GreedyRun run_greedy(Engine& e, const std::vector<int32_t>& prompt, int steps) {
  GreedyRun run;
  e.set_logits_observer(
      [&](int64_t, const float* l, int64_t v) { run.logits.emplace_back(l, l + v); });
  GenerationRequest r{1, prompt, {}};
  r.sampling.max_tokens = steps;
  r.sampling.ignore_eos = true;
  EXPECT_TRUE(e.add(r).ok());
  while (!e.idle()) {
    auto events = e.step();
    EXPECT_TRUE(events.ok()) << events.status().to_string();
    if (!events.ok()) break;
    for (const auto& ev : *events) run.tokens.push_back(ev.token);
  }
  e.set_logits_observer(nullptr);
  return run;
}

// Logits of each greedy step of the co-located engine (in this process).
inline std::vector<std::vector<float>> colocated_logits(
    const std::string& dir, const std::vector<int32_t>& prompt, int steps,
    kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16) {
  model::LoadOptions lo;
  lo.weights = weights;
  auto w = model::ModelWeights::load(dir, lo);
  EXPECT_TRUE(w.ok());
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(std::move(w).value()),
                          EngineOptions{});
  EXPECT_TRUE(e.ok());
  return run_greedy(**e, prompt, steps).logits;
}

// Greedy tokens `got` of a tp run equal the co-located engine's `ref`; where
// they first differ, `got`'s token must be within kNearTie of the co-located
// engine's best logit at that step, and the comparison stops there.
// NearTieCheckTest (expert_tp_test.cc) shows that it fails on a clear
// divergence. `weights`: the format both runs used.
inline void expect_equal_up_to_near_tie(
    const std::vector<int32_t>& ref, const std::vector<int32_t>& got, const std::string& dir,
    const std::vector<int32_t>& prompt, const std::string& what,
    kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t i = 0;
  while (i < ref.size() && ref[i] == got[i]) ++i;
  if (i == ref.size()) return;
  const auto logits = colocated_logits(dir, prompt, static_cast<int>(i) + 1, weights);
  ASSERT_GT(logits.size(), i);
  const auto& l = logits[i];
  const float best = *std::max_element(l.begin(), l.end());
  EXPECT_EQ(l[ref[i]], best) << what;
  EXPECT_LE(best - l[got[i]], kNearTie)
      << what << ": token " << i << " is " << got[i] << ", the co-located engine's " << ref[i]
      << " (logit margin " << best - l[got[i]] << ", not a near-tie)";
  std::printf("[ tp ] %s: first different token %zu (logit margin %.3g)\n", what.c_str(), i,
              best - l[got[i]]);
}

#ifdef MSINFER_SOURCE_DIR
// A deployment's `generate --logprobs N --json` answer against the PyTorch
// reference's logits for the same prompt: at every step up to the first token
// where the two greedy runs part (a near-tie; the steps after it see other
// contexts), each listed log-probability, the chosen token's included, is
// within 2e-2 of log_softmax of the reference's logits (mean over them 2e-3):
// the exactness test's logit bars (1e-2, 1e-3) twice, since a log-probability
// is a logit minus the log-sum-exp, which moves by at most as much. The top N
// are the reference's N best up to that tolerance.
inline void expect_logprobs_match_reference(const Json& doc, const TorchReference& ref, int top,
                                            const std::string& what) {
  ASSERT_TRUE(doc.contains("logprobs")) << what;
  const Json& lp = doc["logprobs"];
  ASSERT_EQ(lp.size(), ref.logits.size()) << what;
  double worst = 0, sum = 0;
  size_t n = 0, steps = 0;
  for (size_t s = 0; s < lp.size(); ++s) {
    const std::vector<float>& l = ref.logits[s];
    const double mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (float x : l) z += std::exp(double(x) - mx);
    const double lse = mx + std::log(z);
    auto ref_lp = [&](int32_t id) { return double(l.at(static_cast<size_t>(id))) - lse; };
    const Json& e = lp[s];
    const auto token = e["token"].get<int32_t>();
    std::vector<std::pair<int32_t, double>> listed = {{token, e["logprob"].get<double>()}};
    for (const auto& t : e["top"]) listed.emplace_back(t[0].get<int32_t>(), t[1].get<double>());
    EXPECT_EQ(e["top"].size(), static_cast<size_t>(std::min<int64_t>(top, l.size()))) << what;
    for (const auto& [id, v] : listed) {
      ASSERT_TRUE(id >= 0 && static_cast<size_t>(id) < l.size()) << what;
      const double d = std::fabs(v - ref_lp(id));
      worst = std::max(worst, d);
      sum += d;
      ++n;
    }
    // Nothing the reference ranks clearly above the listed N was left out.
    std::vector<double> sorted(l.begin(), l.end());
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (!e["top"].empty()) {
      const double last = e["top"].back()[1].get<double>();
      EXPECT_LE(sorted[e["top"].size() - 1] - lse, last + 2e-2) << what << ", step " << s;
    }
    ++steps;
    if (s >= ref.tokens.size() || token != ref.tokens[s]) break;
  }
  EXPECT_LE(worst, 2e-2) << what;
  EXPECT_LE(sum / std::max<size_t>(n, 1), 2e-3) << what;
  std::printf("[ tp logprobs ] %s: %zu steps vs PyTorch, |dlogprob| max %.3g, mean %.3g\n",
              what.c_str(), steps, worst, sum / std::max<size_t>(n, 1));
}

// What a deployment of a test model is checked against: the co-located
// engine's 16 greedy tokens for a fixed prompt and, where /usr/bin/python3 has
// torch, PyTorch's log-probabilities for the same steps.
struct DeploymentReference {
  std::string preset, dir, args;
  std::vector<int32_t> prompt = {5, 9, 22, 40, 7, 8, 11};
  std::vector<int32_t> tokens;
  bool torch = false;
  TorchReference pt;

  explicit DeploymentReference(const std::string& preset_name)
      : preset(preset_name), dir(test_model_dir(preset_name)) {
    args = "--model " + dir + " --prompt-ids 5,9,22,40,7,8,11 --max-tokens 16 --ignore-eos";
    tokens = generate(args).tokens;
    EXPECT_EQ(tokens.size(), 16u) << preset;
    torch = have_torch();
    if (torch) pt = torch_reference(dir, prompt, 16);
  }

  // Runs `deployment` (generate flags) with the top 20 log-probabilities: its
  // tokens equal the reference's up to a near-tie, and its log-probabilities
  // match PyTorch's where it is installed.
  Generated check(const std::string& deployment) const {
    const Generated g = generate(args + " " + deployment + " --logprobs 20");
    const std::string what = preset + " " + deployment;
    expect_equal_up_to_near_tie(tokens, g.tokens, dir, prompt, what);
    if (torch) expect_logprobs_match_reference(g.doc, pt, 20, what);
    return g;
  }
};
#endif

}  // namespace msinfer::runtime::testing
