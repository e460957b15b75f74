// Test models written once per process with make_model (the real loader reads them).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "../common/subprocess.h"
#include "msinfer/core/json.h"
#include "msinfer/core/model_config.h"
#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/model/make_model.h"
#include "msinfer/model/weights.h"
#include "msinfer/runtime/engine.h"

namespace msinfer::runtime::testing {

inline std::string test_model_dir(const std::string& preset, uint64_t seed = 0) {
  static std::map<std::string, std::string> made;
  const std::string key = preset + "-" + std::to_string(seed);
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           ("msinfer_" + key + "_" + std::to_string(::getpid())))
                              .string();
  model::MakeModelOptions o;
  o.preset = preset;
  o.out_dir = dir;
  o.seed = seed;
  Status s = model::make_model(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  made[key] = dir;
  return dir;
}

// |logit - reference| over every step and vocabulary entry of two runs: the
// largest and the mean. The exactness bars (why these: exactness_test.cc) are
// kMaxLogitError and kMeanLogitError; runs of other shapes are a test
// failure, with an infinite error.
constexpr double kMaxLogitError = 1e-2, kMeanLogitError = 1e-3;
struct LogitError {
  double max = 0, mean = 0;
  size_t count = 0;  // logits compared
};
inline LogitError logit_error(const std::vector<std::vector<float>>& got,
                              const std::vector<std::vector<float>>& ref) {
  LogitError e;
  bool same_shape = got.size() == ref.size();
  EXPECT_EQ(got.size(), ref.size()) << "steps";
  double sum = 0;
  for (size_t s = 0; same_shape && s < ref.size(); ++s) {
    same_shape = got[s].size() == ref[s].size();
    EXPECT_EQ(got[s].size(), ref[s].size()) << "logits at step " << s;
    for (size_t v = 0; same_shape && v < ref[s].size(); ++v) {
      const double d = std::fabs(double(got[s][v]) - ref[s][v]);
      e.max = std::max(e.max, d);
      sum += d;
      ++e.count;
    }
  }
  if (!same_shape)
    e.max = e.mean = std::numeric_limits<double>::infinity();
  else if (e.count > 0)
    e.mean = sum / static_cast<double>(e.count);
  return e;
}

#ifdef MSINFER_SOURCE_DIR
// Request 1 (`prompt`) run greedily for `steps` tokens through the CPU engine
// on the checkpoint in `dir`, with its logits at each step; `others` (7
// tokens each) share its batches. 8 MiB of KV in blocks of 4 (several blocks
// per request), prefill in chunks of `max_step_tokens`, `micro_batches`
// micro-batches in ping-pong order; GEMM weights in `weights`.
struct EngineRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
inline EngineRun run_engine_greedy(
    const std::string& dir, const std::vector<int32_t>& prompt, int steps, int64_t max_step_tokens,
    const std::vector<std::vector<int32_t>>& others = {}, int micro_batches = 1,
    kernels::cpu::WeightFormat weights = kernels::cpu::WeightFormat::kBf16) {
  EngineRun r;
  model::LoadOptions lo;
  lo.weights = weights;
  auto w = model::ModelWeights::load(dir, lo);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (!w.ok()) return r;
  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.block_size = 4;
  o.max_step_tokens = max_step_tokens;
  o.micro_batches = micro_batches;
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(std::move(w).value()), o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return r;
  (*e)->set_logits_observer([&](int64_t id, const float* l, int64_t v) {
    if (id == 1) r.logits.emplace_back(l, l + v);
  });
  GenerationRequest req{1, prompt, {}};
  req.sampling.max_tokens = steps;
  req.sampling.ignore_eos = true;
  EXPECT_TRUE((*e)->add(req).ok());
  for (size_t i = 0; i < others.size(); ++i) {
    GenerationRequest o2{static_cast<int64_t>(i + 2), others[i], {}};
    o2.sampling.max_tokens = 7;
    o2.sampling.ignore_eos = true;
    EXPECT_TRUE((*e)->add(o2).ok());
  }
  while (!(*e)->idle()) {
    auto events = (*e)->step();
    EXPECT_TRUE(events.ok()) << events.status().to_string();
    if (!events.ok()) break;
    for (const auto& ev : *events) {
      if (ev.request_id == 1) r.tokens.push_back(ev.token);
    }
  }
  return r;
}

// The command that runs tests/runtime/torch_reference.py on `dir` for the
// prompt ids ("1,2,3") and `steps` greedy steps, modelling the active CPU
// level's numerics: --bf16-qk where its attention rounds q to bf16 for the
// scores (kernels::cpu::attention_bf16_qk).
inline std::string torch_reference_command(const std::string& dir, const std::string& ids,
                                           int steps) {
  auto c = load_model_config(dir);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  const bool bf16 =
      c.ok() && kernels::cpu::attention_bf16_qk(kernels::cpu::active_isa(), c->head_dim);
  return "/usr/bin/python3 '" + std::string(MSINFER_SOURCE_DIR) +
         "/tests/runtime/torch_reference.py' '" + dir + "' " + ids + " " + std::to_string(steps) +
         (bf16 ? " --bf16-qk" : "");
}

// Debian's Python with python3-torch and python3-numpy (the tests that need
// them skip without).
inline bool have_torch() {
  return std::filesystem::exists("/usr/bin/python3") &&
         !msinfer::testing::run_capture(
              "/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null && echo ok")
              .empty();
}

// Why a model's own reference (tests/runtime/<script>) cannot run here, or
// "" when it can: the script's --check exits 77 with the reason when the
// published implementation's checkout or /usr/bin/python3's torch and numpy
// are missing (any other exit is a test failure). The script looks for the checkout before it
// imports torch, so a skip costs a Python start rather than torch's import.
inline std::string reference_unavailable(const std::string& script) {
  const std::string out =
      msinfer::testing::run_capture("/usr/bin/python3 '" + std::string(MSINFER_SOURCE_DIR) +
                                    "/tests/runtime/" + script + "' --check 2>&1; echo \" rc=$?\"");
  if (out.find(" rc=0") != std::string::npos) return "";
  if (out.find(" rc=77") == std::string::npos) ADD_FAILURE() << script << " --check: " << out;
  return out;
}

// The PyTorch reference's greedy run: tokens[i] and logits[i] for step i
// (step 0 after the prompt, step i after feeding token i - 1).
struct TorchReference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// Runs torch_reference.py for `prompt` and `steps` steps; a failure is a test
// failure and leaves both vectors empty.
inline TorchReference torch_reference(const std::string& dir, const std::vector<int32_t>& prompt,
                                      int steps) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string out = msinfer::testing::run_capture(torch_reference_command(dir, ids, steps));
  TorchReference r;
  EXPECT_FALSE(out.empty()) << "the PyTorch reference failed";
  auto j = parse_json(out, "torch_reference.py");
  EXPECT_TRUE(j.ok()) << j.status().to_string();
  if (out.empty() || !j.ok()) return r;
  r.tokens = (*j)["tokens"].get<std::vector<int32_t>>();
  r.logits = (*j)["logits"].get<std::vector<std::vector<float>>>();
  return r;
}
// A model's own reference (tests/runtime/<script>, e.g. deepseek_reference.py)
// run on `dir` with the engine's roundings (--dtype engine, then `extra`): its
// greedy tokens and logits per step, or `skip`, the script's reason when it
// exited 77 (the published reference it runs is absent).
struct ReferenceRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::string skip;
};

inline ReferenceRun run_reference_script(const std::string& script, const std::string& dir,
                                         const std::vector<int32_t>& prompt, int steps,
                                         const std::string& extra = "") {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string stem = std::filesystem::path(script).stem().string();
  const std::string out = (std::filesystem::path(::testing::TempDir()) / (stem + ".json")).string();
  const std::string err = (std::filesystem::path(::testing::TempDir()) / (stem + ".err")).string();
  const std::string rc = msinfer::testing::run_capture(
      "cd " + std::string(MSINFER_SOURCE_DIR) + " && /usr/bin/python3 tests/runtime/" + script +
      " '" + dir + "' " + ids + " " + std::to_string(steps) + " --dtype engine" + extra + " > " +
      out + " 2> " + err + "; echo $?");
  std::ifstream e(err);
  const std::string err_text((std::istreambuf_iterator<char>(e)), {});
  ReferenceRun r;
  if (rc == "77\n") {
    r.skip = err_text;
    return r;
  }
  EXPECT_EQ(rc, "0\n") << err_text;
  auto j = read_json_file(out);
  EXPECT_TRUE(j.ok()) << err_text;
  if (!j.ok()) return r;
  r.tokens = (*j)["tokens"].get<std::vector<int32_t>>();
  r.logits = (*j)["logits"].get<std::vector<std::vector<float>>>();
  return r;
}

// Prefill and 16 decode steps of `dir` against run_reference_script(script),
// in three variants: the whole prompt in one step, chunks of 5, and beside two
// other requests over 3 micro-batches. Greedy tokens equal, logits within
// kMaxLogitError / kMeanLogitError; `tag` (the model) and `label` (the
// checkpoint) name the run in messages. Skips when the reference is absent.
inline void expect_matches_reference(const std::string& script, const std::string& tag,
                                     const std::string& dir, const std::string& label,
                                     const std::string& extra = "") {
  constexpr int kDecodeSteps = 16;
  const std::vector<int32_t> prompt = {5, 17, 42, 99, 3, 250, 7, 64, 11, 128, 33, 2};
  const ReferenceRun ref = run_reference_script(script, dir, prompt, kDecodeSteps + 1, extra);
  if (!ref.skip.empty()) GTEST_SKIP() << ref.skip;
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(kDecodeSteps + 1));

  const std::vector<std::vector<int32_t>> two = {{prompt[1], prompt[2]},
                                                 {prompt[3], prompt[0], prompt[4], prompt[5]}};
  struct Variant {
    int64_t chunk;
    std::vector<std::vector<int32_t>> others;
    int micro_batches;
  };
  for (const auto& [chunk, others, mbs] :
       {Variant{256, {}, 1}, Variant{5, {}, 1}, Variant{256, two, 3}}) {
    const EngineRun r = run_engine_greedy(dir, prompt, kDecodeSteps + 1, chunk, others, mbs);
    EXPECT_EQ(r.tokens, ref.tokens)
        << label << " chunk " << chunk << ", " << others.size() << " others";
    const LogitError err = logit_error(r.logits, ref.logits);
    if (err.max > kMaxLogitError) {  // where it went wrong
      for (size_t st = 0; st < std::min(r.logits.size(), ref.logits.size()); ++st) {
        std::printf("  step %zu: |dlogit| max %.3g\n", st,
                    logit_error({r.logits[st]}, {ref.logits[st]}).max);
      }
    }
    EXPECT_LE(err.max, kMaxLogitError) << label << " chunk " << chunk;
    EXPECT_LE(err.mean, kMeanLogitError) << label << " chunk " << chunk;
    std::printf(
        "[ %s exactness ] %s, prefill chunk %lld, %zu other requests, %d micro-batches: "
        "|dlogit| max %.3g, mean %.3g over %zu logits\n",
        tag.c_str(), label.c_str(), static_cast<long long>(chunk), others.size(), mbs, err.max,
        err.mean, err.count);
  }
}
#endif

// Greedy tokens of the co-located engine for `r` (the reference the
// disaggregated tests compare with).
inline std::vector<int32_t> colocated_tokens(const std::string& dir, const GenerationRequest& r) {
  auto w = model::ModelWeights::load(dir);
  EXPECT_TRUE(w.ok());
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(std::move(w).value()),
                          EngineOptions{});
  EXPECT_TRUE(e.ok());
  std::vector<int32_t> t;
  EXPECT_TRUE((*e)->add(r).ok());
  while (!(*e)->idle()) {
    auto ev = (*e)->step();
    EXPECT_TRUE(ev.ok());
    if (!ev.ok()) break;
    for (const auto& x : *ev) t.push_back(x.token);
  }
  return t;
}

}  // namespace msinfer::runtime::testing
