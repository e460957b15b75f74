#include "msinfer/runtime/engine.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "msinfer/core/json.h"
#include "msinfer/model/make_model.h"
#include "test_models.h"

namespace msinfer::runtime {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const model::ModelWeights> load(const std::string& dir,
                                                const model::LoadOptions& o = {}) {
  auto w = model::ModelWeights::load(dir, o);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::shared_ptr<const model::ModelWeights>(std::move(w).value()) : nullptr;
}

std::unique_ptr<Engine> make_engine(std::shared_ptr<const model::ModelWeights> w,
                                    int64_t kv_bytes = 8 << 20, int64_t block = 4) {
  EngineOptions o;
  o.kv_cache_bytes = kv_bytes;
  o.block_size = block;
  auto e = Engine::create(std::move(w), o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

GenerationRequest req(int64_t id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r{id, std::move(prompt), {}};
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::map<int64_t, std::vector<int32_t>> run_all(Engine& e) {
  std::map<int64_t, std::vector<int32_t>> out;
  for (int guard = 0; !e.idle() && guard < 10000; ++guard) {
    for (const auto& ev : e.step().value()) out[ev.request_id].push_back(ev.token);
  }
  EXPECT_TRUE(e.idle());
  return out;
}

TEST(EngineTest, ContinuousBatchingDoesNotChangeGreedyResults) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto alone = make_engine(w);
  ASSERT_TRUE(alone->add(req(1, {1, 10, 20, 30}, 12)).ok());
  auto ref = run_all(*alone)[1];
  ASSERT_EQ(ref.size(), 12u);

  // The same request with others joining and leaving around it.
  auto e = make_engine(w);
  ASSERT_TRUE(e->add(req(7, {1, 5}, 3)).ok());
  ASSERT_TRUE(e->add(req(1, {1, 10, 20, 30}, 12)).ok());
  std::map<int64_t, std::vector<int32_t>> got;
  for (int step = 0; !e->idle(); ++step) {
    if (step == 4) {
      ASSERT_TRUE(e->add(req(9, {1, 40, 41, 42, 43, 44}, 5)).ok());
    }
    for (const auto& ev : e->step().value()) got[ev.request_id].push_back(ev.token);
  }
  EXPECT_EQ(got[1], ref);
  EXPECT_EQ(got[7].size(), 3u);
  EXPECT_EQ(got[9].size(), 5u);
  EXPECT_EQ(e->kv_cache().free_blocks(), e->kv_cache().total_blocks());  // all released
}

// Local experts whose outputs are garbage in chosen steps, which they report
// through discard_step(), as RemoteExperts does when an expert worker dies
// mid-step.
class LosingExperts : public ExpertBackend {
 public:
  LosingExperts(const model::ModelWeights& w, std::set<int> lost_steps)
      : local_(w), hidden_(w.config().hidden), lost_(std::move(lost_steps)) {}
  Status begin_step() override {
    ++step_;
    return local_.begin_step();
  }
  Status start(int k, int l, const kernels::cpu::RoutedBatch& r) override {
    return local_.start(k, l, r);
  }
  Status finish(int k, int l, const kernels::cpu::RoutedBatch& r, float* results) override {
    MSI_RETURN_IF_ERROR(local_.finish(k, l, r, results));
    if (lost_.count(step_)) {
      for (int64_t i = 0; i < r.rows() * hidden_; ++i)
        results[i] = 1e4f * static_cast<float>(i % 7);
    }
    return ok_status();
  }
  bool discard_step() const override { return lost_.count(step_) > 0; }

 private:
  LocalExperts local_;
  int64_t hidden_;
  std::set<int> lost_;
  int step_ = -1;
};

// A step whose expert outputs were lost is discarded: it delivers no token,
// no request advances, and the next step feeds the same tokens again, so every
// request gets the tokens of a run without the loss (a prefill step and
// decode steps lost, with two micro-batches).
TEST(EngineTest, ADiscardedStepChangesNoToken) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.micro_batches = 2;
  auto run = [&](std::set<int> lost, int* empty_steps) {
    auto e = std::move(Engine::create(w, o, std::make_unique<LosingExperts>(*w, lost))).value();
    EXPECT_TRUE(e->add(req(1, {1, 10, 20, 30}, 10)).ok());
    EXPECT_TRUE(e->add(req(2, {1, 7, 8}, 10)).ok());
    std::map<int64_t, std::vector<int32_t>> out;
    *empty_steps = 0;
    for (int guard = 0; !e->idle() && guard < 100; ++guard) {
      auto ev = e->step();
      EXPECT_TRUE(ev.ok()) << ev.status().to_string();
      if (!ev.ok()) break;
      *empty_steps += ev->empty() ? 1 : 0;
      for (const auto& x : *ev) out[x.request_id].push_back(x.token);
    }
    EXPECT_TRUE(e->idle());
    EXPECT_EQ(e->kv_usage(), 0.0);
    return out;
  };
  int none = 0, three = 0;
  const auto ref = run({}, &none);
  const auto got = run({0, 4, 5}, &three);
  EXPECT_EQ(none, 0);
  EXPECT_EQ(three, 3);
  ASSERT_EQ(ref.at(1).size(), 10u);
  EXPECT_EQ(got, ref);
}

// A long prompt is prefilled in chunks of the step budget, and a request that
// is decoding meanwhile still gets a token every step.
TEST(EngineTest, ALongPromptDoesNotStallDecoding) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.max_step_tokens = 32;
  auto e = std::move(Engine::create(w, o)).value();
  ASSERT_TRUE(e->add(req(1, {1, 10, 20}, 40)).ok());
  ASSERT_EQ(e->step().value().size(), 1u);  // request 1 is decoding
  std::vector<int32_t> long_prompt(300);
  for (int i = 0; i < 300; ++i) long_prompt[i] = 1 + i % 150;
  ASSERT_TRUE(e->add(req(2, long_prompt, 2)).ok());
  // 300 prompt tokens at 31 per step (one token of the budget is request 1's).
  int steps_until_first = 0;
  bool first = false;
  while (!first) {
    ASSERT_LT(steps_until_first, 40) << "the long prompt never finished";
    auto ev = e->step().value();
    ++steps_until_first;
    int for_1 = 0;
    for (const auto& x : ev) {
      for_1 += x.request_id == 1;
      first = first || x.request_id == 2;
    }
    EXPECT_EQ(for_1, 1) << "step " << steps_until_first << ": the decoding request was stalled";
  }
  EXPECT_EQ(steps_until_first, (300 + 30) / 31);  // ceil(300 / 31): chunked, not one step
}

TEST(EngineTest, KvCacheLimitRefusesOrQueues) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  // tiny-mixtral: 2 layers x 2 KV heads x 16 dims x 2 (K,V) x 2 bytes = 256 B per token.
  EXPECT_EQ(KvCache::bytes_per_token(w->config()), 256);
  auto e = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);  // 64 tokens
  Status s = e->add(req(1, std::vector<int32_t>(40, 3), 30));   // 70 tokens: never fits
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("does not fit the KV cache"), std::string::npos);
  // Two 40-token requests fit only one at a time: the second waits, both finish.
  ASSERT_TRUE(e->add(req(2, std::vector<int32_t>(30, 3), 10)).ok());
  ASSERT_TRUE(e->add(req(3, std::vector<int32_t>(30, 4), 10)).ok());
  std::map<int64_t, std::vector<int32_t>> out;
  for (const auto& ev : e->step().value()) out[ev.request_id].push_back(ev.token);
  EXPECT_EQ(e->running(), 1);
  EXPECT_EQ(e->waiting(), 1);
  for (auto& [id, toks] : run_all(*e)) out[id].insert(out[id].end(), toks.begin(), toks.end());
  EXPECT_EQ(out[2].size(), 10u);
  EXPECT_EQ(out[3].size(), 10u);
}

// KV blocks are taken on demand: three requests that together need more blocks
// than the cache has all run, the most recently admitted is preempted and
// recomputed, and greedy output is what each produces alone.
TEST(EngineTest, PreemptionKeepsGreedyOutput) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  std::vector<GenerationRequest> reqs = {req(1, {1, 10, 20, 30, 40, 50, 60, 70}, 20),
                                         req(2, {1, 11, 21, 31, 41, 51, 61, 71}, 20),
                                         req(3, {1, 12, 22, 32, 42, 52, 62, 72}, 20)};
  std::map<int64_t, std::vector<int32_t>> alone;
  for (const auto& r : reqs) {
    auto e = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);
    ASSERT_TRUE(e->add(r).ok());
    alone[r.id] = run_all(*e)[r.id];
    ASSERT_EQ(alone[r.id].size(), 20u);
  }
  // 64 tokens of cache (16 blocks); each request needs 28 (7 blocks).
  auto e = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);
  for (const auto& r : reqs) ASSERT_TRUE(e->add(r).ok());
  auto together = run_all(*e);
  EXPECT_GT(e->counters().preemptions, 0);
  EXPECT_EQ(e->kv_usage(), 0.0);
  for (const auto& r : reqs) EXPECT_EQ(together[r.id], alone[r.id]) << "request " << r.id;
}

// Admission fills the cache (issue 47): sixteen requests of one block each
// (2 prompt + 2 generated tokens at 4 per block) in a 16-block cache run 15
// at once (a watermark of one block left), where one spare block per running
// request ran 8; greedy output is what each produces alone.
TEST(EngineTest, AdmissionFillsTheCache) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(req(i + 1, {1, 10 + i}, 2));
  std::map<int64_t, std::vector<int32_t>> alone;
  for (const auto& r : reqs) {
    auto e = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);
    ASSERT_TRUE(e->add(r).ok());
    alone[r.id] = run_all(*e)[r.id];
  }
  auto e = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);  // 16 blocks
  for (const auto& r : reqs) ASSERT_TRUE(e->add(r).ok());
  std::map<int64_t, std::vector<int32_t>> together;
  for (const auto& ev : e->step().value()) together[ev.request_id].push_back(ev.token);
  EXPECT_EQ(e->running(), 15);
  EXPECT_EQ(e->waiting(), 1);
  EXPECT_GE(e->kv_usage(), 0.9);
  for (auto& [id, toks] : run_all(*e)) {
    together[id].insert(together[id].end(), toks.begin(), toks.end());
  }
  EXPECT_EQ(e->counters().preemptions, 0);
  for (const auto& r : reqs) EXPECT_EQ(together[r.id], alone[r.id]) << "request " << r.id;
}

TEST(EngineTest, CancelFreesBlocks) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto e = make_engine(w);
  ASSERT_TRUE(e->add(req(1, {1, 2, 3}, 50)).ok());
  ASSERT_TRUE(e->add(req(2, {1, 2, 3}, 50)).ok());
  ASSERT_TRUE(e->step().ok());
  EXPECT_GT(e->kv_usage(), 0.0);
  EXPECT_TRUE(e->cancel(1));
  EXPECT_FALSE(e->cancel(1));
  EXPECT_EQ(e->running(), 1);
  auto out = run_all(*e);
  EXPECT_TRUE(out[1].empty());
  EXPECT_EQ(out[2].size(), 49u);
  EXPECT_EQ(e->kv_usage(), 0.0);
}

TEST(EngineTest, BadRequestsAreRefused) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto e = make_engine(w);
  EXPECT_EQ(e->add(req(1, {}, 4)).code(), StatusCode::kInvalidArgument);
  Status s = e->add(req(2, {1, 999999}, 4));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos);
  GenerationRequest r = req(3, {1, 2}, 4);
  r.sampling.top_p = 0;
  EXPECT_EQ(e->add(r).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(e->idle());
}

// Two requests under one id would share one KV block table, freed while the
// other still uses it: the second is refused while the first is queued or
// running, and accepted again once it finished.
TEST(EngineTest, ARequestIdInUseIsRefused) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto e = make_engine(w);
  ASSERT_TRUE(e->add(req(7, {1, 2, 3}, 3)).ok());
  Status s = e->add(req(7, {4, 5}, 3));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("already in use"), std::string::npos) << s.to_string();
  ASSERT_TRUE(e->step().ok());  // now running
  EXPECT_EQ(e->running(), 1);
  EXPECT_EQ(e->add(req(7, {4, 5}, 3)).code(), StatusCode::kInvalidArgument);
  for (int i = 0; i < 20 && !e->idle(); ++i) ASSERT_TRUE(e->step().ok());
  ASSERT_TRUE(e->idle());
  EXPECT_TRUE(e->add(req(7, {4, 5}, 3)).ok());
}

TEST(EngineTest, StopsOnStopTokensEosAndLength) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto e = make_engine(w);
  ASSERT_TRUE(e->add(req(1, {1, 10, 20}, 8)).ok());
  auto greedy = run_all(*e)[1];
  // Stop on the third generated token.
  GenerationRequest r = req(2, {1, 10, 20}, 8);
  r.sampling.stop_token_ids = {greedy[2]};
  ASSERT_TRUE(e->add(r).ok());
  std::vector<TokenEvent> evs;
  while (!e->idle()) {
    for (auto& ev : e->step().value()) evs.push_back(ev);
  }
  size_t first = 0;
  while (greedy[first] != greedy[2]) ++first;  // the stop token may appear earlier
  ASSERT_EQ(evs.size(), first + 1);
  EXPECT_TRUE(evs.back().finished);
  EXPECT_EQ(evs.back().finish_reason, runtime::FinishReason::kStop);
  // The same token as EOS ends it too, unless ignore_eos.
  GenerationRequest r3 = req(3, {1, 10, 20}, 8);
  r3.sampling.ignore_eos = false;
  ASSERT_TRUE(e->add(r3).ok());
  auto out = run_all(*e)[3];
  const auto& eos = w->config().eos_token_ids;
  ASSERT_FALSE(eos.empty());
  bool hit = false;
  for (size_t i = 0; i < greedy.size(); ++i) {
    if (greedy[i] == eos[0]) {
      EXPECT_EQ(out.size(), i + 1);
      hit = true;
      break;
    }
  }
  if (!hit) {
    EXPECT_EQ(out.size(), 8u);
  }
}

// Each sequence's tokens of the requests run: (request id, index) -> tokens,
// with the finish reasons seen per sequence (each must end exactly once).
struct Sequences {
  std::map<std::pair<int64_t, int32_t>, std::vector<int32_t>> tokens;
  std::map<std::pair<int64_t, int32_t>, int> finishes;
};

Sequences run_sequences(Engine& e, int64_t* max_used_blocks = nullptr) {
  Sequences out;
  for (int guard = 0; !e.idle() && guard < 10000; ++guard) {
    for (const auto& ev : e.step().value()) {
      const auto key = std::make_pair(ev.request_id, ev.index);
      EXPECT_EQ(out.finishes[key], 0) << "a token after sequence " << ev.index << "'s end";
      out.tokens[key].push_back(ev.token);
      if (ev.finished) ++out.finishes[key];
    }
    if (max_used_blocks != nullptr) {
      *max_used_blocks =
          std::max(*max_used_blocks, e.kv_cache().total_blocks() - e.kv_cache().free_blocks());
    }
  }
  EXPECT_TRUE(e.idle());
  return out;
}

// n greedy samples of one prompt are n copies of the one greedy answer: the
// forked sequences read the shared prompt blocks and the copied partial block
// as the parent wrote them. Prompts ending mid-block and at a block's end.
TEST(EngineTest, GreedyNSamplesEqualOneSample) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  for (std::vector<int32_t> prompt : {std::vector<int32_t>{1, 10, 20, 30, 40, 50},
                                      std::vector<int32_t>{1, 10, 20, 30, 40, 50, 60, 70}}) {
    auto one = make_engine(w);
    ASSERT_TRUE(one->add(req(1, prompt, 12)).ok());
    const auto ref = run_all(*one)[1];
    ASSERT_EQ(ref.size(), 12u);
    auto e = make_engine(w);
    GenerationRequest r = req(5, prompt, 12);
    r.n = 3;
    ASSERT_TRUE(e->add(r).ok());
    const Sequences got = run_sequences(*e);
    ASSERT_EQ(got.tokens.size(), 3u);
    for (int32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(got.tokens.at({5, i}), ref) << "sequence " << i << ", prompt of " << prompt.size();
      EXPECT_EQ(got.finishes.at({5, i}), 1);
    }
    EXPECT_EQ(e->kv_usage(), 0.0);  // every reference released
  }
}

// The prompt is prefilled once and its full blocks are held once: a request
// of n = 3 over a 9-token prompt (2 full blocks of 4 and 1 token) holds 2
// shared blocks and one last block per sequence right after its prefill,
// where three requests hold 9; once they end, every block is free.
TEST(EngineTest, NSamplesShareThePromptBlocks) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  const std::vector<int32_t> prompt = {1, 10, 20, 30, 40, 50, 60, 70, 80};
  auto e = make_engine(w);
  GenerationRequest r = req(1, prompt, 3);  // 9 + 3 = 12 tokens: no new block
  r.n = 3;
  ASSERT_TRUE(e->add(r).ok());
  auto first = e->step().value();  // the prefill: all 9 prompt tokens, then the fork
  ASSERT_EQ(first.size(), 3u);
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first[static_cast<size_t>(i)].index, i);
    EXPECT_EQ(first[static_cast<size_t>(i)].request_id, 1);
  }
  EXPECT_EQ(e->running(), 3);
  const KvCache& kv = e->kv_cache();
  EXPECT_EQ(kv.total_blocks() - kv.free_blocks(), 2 + 3);
  // The three sequences decode one token each per step, on those blocks.
  int64_t max_used = 0;
  const Sequences rest = run_sequences(*e, &max_used);
  EXPECT_EQ(max_used, 5);
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(rest.tokens.at({1, i}).size(), 2u);
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  // The same prompt as three requests holds three copies.
  auto separate = make_engine(w);
  for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(separate->add(req(id, prompt, 3)).ok());
  ASSERT_TRUE(separate->step().ok());
  EXPECT_EQ(separate->kv_cache().total_blocks() - separate->kv_cache().free_blocks(), 9);
}

// Sequence i of a seeded request samples with seed + i (vLLM's rule): each is
// reproducible on its own, and equal to an n = 1 request with that seed.
TEST(EngineTest, SeededNSamplesAreReproduciblePerSequence) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  const std::vector<int32_t> prompt = {1, 10, 20, 30, 40, 50};
  auto sampled = [&](uint64_t seed, int n) {
    auto e = make_engine(w);
    GenerationRequest r = req(1, prompt, 16);
    r.sampling.temperature = 1.f;
    r.sampling.seed = seed;
    r.n = n;
    EXPECT_TRUE(e->add(r).ok());
    return run_sequences(*e).tokens;
  };
  const auto two = sampled(42, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(sampled(42, 2), two);                        // the same again
  EXPECT_EQ(two.at({1, 0}), sampled(42, 1).at({1, 0}));  // sequence 0: seed 42
  EXPECT_EQ(two.at({1, 1}), sampled(43, 1).at({1, 0}));  // sequence 1: seed 43
  EXPECT_NE(two.at({1, 0}), two.at({1, 1}));  // 16 tokens at temperature 1: not by chance
}

// A cache too small for three sequences together: the most recently admitted
// sequences are preempted (their own references released, the blocks shared
// with the others kept) and recompute later; every sequence's greedy output
// is still the answer of n = 1, and every block is free at the end.
TEST(EngineTest, PreemptingOneOfNSequencesLeavesTheOthersIntact) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  const std::vector<int32_t> prompt = {1, 10, 20, 30, 40, 50};
  auto one = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);
  ASSERT_TRUE(one->add(req(1, prompt, 20)).ok());
  const auto ref = run_all(*one)[1];
  ASSERT_EQ(ref.size(), 20u);
  // 16 blocks; each sequence needs 26 tokens (7 blocks), 1 shared: 19 > 16.
  auto e = make_engine(w, /*kv_bytes=*/256 * 64, /*block=*/4);
  GenerationRequest r = req(1, prompt, 20);
  r.n = 3;
  ASSERT_TRUE(e->add(r).ok());
  // And a request of its own beside them.
  ASSERT_TRUE(e->add(req(2, {1, 11, 21, 31}, 6)).ok());
  const Sequences got = run_sequences(*e);
  EXPECT_GT(e->counters().preemptions, 0);
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got.tokens.at({1, i}), ref) << "sequence " << i;
    EXPECT_EQ(got.finishes.at({1, i}), 1);
  }
  EXPECT_EQ(got.tokens.at({2, 0}).size(), 6u);
  EXPECT_EQ(e->kv_usage(), 0.0);
}

// cancel() takes every sequence of the request; max_tokens 1 ends each
// sequence at its first token (none stays in the batch).
TEST(EngineTest, NSamplesCancelAndEndTogether) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto e = make_engine(w);
  GenerationRequest r = req(1, {1, 10, 20, 30, 40, 50}, 30);
  r.n = 4;
  ASSERT_TRUE(e->add(r).ok());
  ASSERT_TRUE(e->step().ok());
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(e->running(), 4);
  EXPECT_TRUE(e->cancel(1));
  EXPECT_EQ(e->running(), 0);
  EXPECT_EQ(e->kv_usage(), 0.0);
  EXPECT_FALSE(e->cancel(1));
  GenerationRequest single = req(2, {1, 10, 20}, 1);
  single.n = 3;
  ASSERT_TRUE(e->add(single).ok());
  const auto evs = e->step().value();
  ASSERT_EQ(evs.size(), 3u);
  for (const auto& ev : evs) {
    EXPECT_TRUE(ev.finished);
    EXPECT_EQ(ev.finish_reason, runtime::FinishReason::kLength);
  }
  EXPECT_TRUE(e->idle());
  EXPECT_EQ(e->kv_usage(), 0.0);
  GenerationRequest bad = req(3, {1, 2}, 4);
  bad.n = 0;
  EXPECT_EQ(e->add(bad).code(), StatusCode::kInvalidArgument);
  bad.n = GenerationRequest::kMaxSequences + 1;
  EXPECT_EQ(e->add(bad).code(), StatusCode::kInvalidArgument);
}

TEST(LoaderTest, DtypesAndShardsLoadTheSameWeights) {
  const fs::path root = fs::path(::testing::TempDir()) / ("msinfer_loader_" + std::to_string(getpid()));
  auto make = [&](const std::string& name, model::DType dt, int shards) {
    model::MakeModelOptions o;
    o.preset = "tiny-qwen3moe";
    o.out_dir = (root / name).string();
    o.dtype = dt;
    o.shards = shards;
    EXPECT_TRUE(model::make_model(o).ok());
    auto e = make_engine(load(o.out_dir));
    EXPECT_TRUE(e->add(req(1, {5, 6, 7, 8}, 6)).ok());
    return run_all(*e)[1];
  };
  auto bf16 = make("bf16", model::DType::kBF16, 1);
  EXPECT_EQ(make("f32", model::DType::kF32, 1), bf16);  // f32 rounds to the same bf16 values
  EXPECT_EQ(make("sharded", model::DType::kBF16, 3), bf16);
  EXPECT_EQ(make("f16", model::DType::kF16, 1).size(), 6u);
  fs::remove_all(root);
}

TEST(LoaderTest, ValidatesTensorsAgainstTheConfig) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("msinfer_badmodel_" + std::to_string(getpid()));
  model::MakeModelOptions o;
  o.preset = "tiny-mixtral";
  o.out_dir = dir.string();
  ASSERT_TRUE(model::make_model(o).ok());
  auto cfg = read_json_file((dir / "config.json").string());
  // A config whose expert FFN width disagrees with the tensors.
  Json bad = *cfg;
  bad["intermediate_size"] = 100;
  ASSERT_TRUE(write_json_file((dir / "config.json").string(), bad).ok());
  auto w = model::ModelWeights::load(dir.string());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.safetensors: tensor 'model.layers.0.block_sparse_moe."
                                      "experts.0.w1.weight' has shape [128, 64], expected [100, 64]"),
            std::string::npos)
      << w.status().message();
  // More experts in the config than in the file: the router's shape gives it away.
  bad = *cfg;
  bad["num_local_experts"] = 9;
  ASSERT_TRUE(write_json_file((dir / "config.json").string(), bad).ok());
  w = model::ModelWeights::load(dir.string());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("block_sparse_moe.gate.weight' has shape [8, 64], expected [9, 64]"),
            std::string::npos) << w.status().message();
  // Fewer layers than the file holds: extra tensors.
  bad = *cfg;
  bad["num_hidden_layers"] = 1;
  ASSERT_TRUE(write_json_file((dir / "config.json").string(), bad).ok());
  w = model::ModelWeights::load(dir.string());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("unexpected tensor 'model.layers.1."), std::string::npos);
  // An unsupported architecture.
  bad = *cfg;
  bad["architectures"] = {"DbrxForCausalLM"};
  ASSERT_TRUE(write_json_file((dir / "config.json").string(), bad).ok());
  EXPECT_FALSE(model::ModelWeights::load(dir.string()).ok());
  // A checkpoint without the final norm: a missing tensor.
  ASSERT_TRUE(write_json_file((dir / "config.json").string(), *cfg).ok());
  {
    auto ck = model::Checkpoint::open(dir.string());
    ASSERT_TRUE(ck.ok());
    std::vector<model::TensorToWrite> keep;
    for (const auto& [name, t] : ck->tensors()) {
      if (name != "model.norm.weight") keep.push_back({name, t.dtype, t.shape, t.data});
    }
    ASSERT_TRUE(model::write_safetensors((dir / "tmp.bin").string(), keep).ok());
  }
  fs::rename(dir / "tmp.bin", dir / "model.safetensors");
  w = model::ModelWeights::load(dir.string());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("tensor 'model.norm.weight' is missing"), std::string::npos)
      << w.status().message();
  fs::remove_all(dir);
}

TEST(LoaderTest, PartialLoadsHoldOnlyTheirShare) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto all = load(dir);
  model::LoadOptions attn;
  attn.all_experts = false;  // attention worker: no experts
  auto a = load(dir, attn);
  model::LoadOptions two;
  two.attention = false;
  two.all_experts = false;
  two.experts = {1, 5};
  auto x = load(dir, two);
  EXPECT_FALSE(a->has_expert(0, 0));
  EXPECT_TRUE(x->has_expert(1, 5));
  EXPECT_FALSE(x->has_expert(1, 4));
  EXPECT_LT(a->packed_bytes() + x->packed_bytes(), all->packed_bytes());
  model::LoadOptions bad;
  bad.all_experts = false;
  bad.experts = {8};
  EXPECT_FALSE(model::ModelWeights::load(dir, bad).ok());
}

}  // namespace
}  // namespace msinfer::runtime

namespace msinfer::runtime {
namespace {

// A device that does not exist is bad input; "cuda" is refused with a reason
// in a build without the CUDA backend or on a machine without a GPU, and runs
// where there is one.
TEST(EngineTest, DeviceIsCheckedBeforeAnyWork) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto w = std::shared_ptr<const model::ModelWeights>(model::ModelWeights::load(dir).value());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "tpu:0"}) {
    EngineOptions o;
    o.device = bad;
    auto e = Engine::create(w, o);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EngineOptions o;
  o.device = "cuda";
  auto e = Engine::create(w, o);
#ifdef MSINFER_WITH_CUDA
  if (!e.ok()) {
    EXPECT_EQ(e.status().code(), StatusCode::kUnavailable) << e.status().to_string();
  }
#else
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(e.status().message().find("without the CUDA backend"), std::string::npos);
#endif
}

}  // namespace
}  // namespace msinfer::runtime

namespace msinfer::runtime {
namespace {

// Micro-batches are composed by predicted attention time (tokens + context),
// not by token count. With unit costs, one request of 200 prompt tokens and
// four of 4, two micro-batches, two steps:
//  - prefill: the long prompt (200 + 200*201/2 = 20300) alone, the four short
//    ones (4 + 10 = 14 each) together: max/mean = 20300 / (20356 / 2);
//  - decode: the long request (1 + 201 = 202) alone, the four short ones
//    (1 + 5 = 6 each) together: 202 / (226 / 2). Split by count (each
//    request to the micro-batch with fewer tokens), the long one would share
//    with two short ones: 214 / 113.
// Greedy output is the same as with one micro-batch.
TEST(EngineTest, MicroBatchesAreComposedByPredictedAttentionTime) {
  auto w = std::shared_ptr<const model::ModelWeights>(
      model::ModelWeights::load(testing::test_model_dir("tiny-mixtral")).value());
  auto run = [&](int m, double* balance) {
    EngineOptions o;
    o.kv_cache_bytes = 8 << 20;
    o.micro_batches = m;
    o.attention_cost_per_token = 1;
    o.attention_cost_per_position = 1;
    auto e = Engine::create(w, o).value();
    std::vector<int32_t> longp(200);
    for (int i = 0; i < 200; ++i) longp[i] = (i * 7 + 3) % 250;
    GenerationRequest a{1, longp, {}};
    a.sampling.max_tokens = 2;
    a.sampling.ignore_eos = true;
    EXPECT_TRUE(e->add(a).ok());
    for (int64_t id = 2; id <= 5; ++id) {
      GenerationRequest r{id, {5, 6, static_cast<int32_t>(id), 9}, {}};
      r.sampling.max_tokens = 2;
      r.sampling.ignore_eos = true;
      EXPECT_TRUE(e->add(r).ok());
    }
    std::map<int64_t, std::vector<int32_t>> out;
    int steps = 0;
    while (!e->idle()) {
      for (const auto& ev : e->step().value()) out[ev.request_id].push_back(ev.token);
      ++steps;
    }
    EXPECT_EQ(steps, 2);
    *balance = e->micro_batch_balance();
    return out;
  };
  double b1 = 0, b2 = 0;
  const auto one = run(1, &b1);
  const auto two = run(2, &b2);
  EXPECT_EQ(one, two);
  EXPECT_EQ(b1, 0.0);  // one micro-batch: nothing to balance
  const double expected = (20300.0 / (20356.0 / 2) + 202.0 / (226.0 / 2)) / 2;
  EXPECT_NEAR(b2, expected, 1e-9);
  EXPECT_LT(b2, (20300.0 / (20356.0 / 2) + 214.0 / 113.0) / 2);  // better than by count
}

// ---- prefix caching (issue 50) ----

std::unique_ptr<Engine> make_engine_with(std::shared_ptr<const model::ModelWeights> w,
                                         bool prefix_caching, int64_t kv_bytes = 8 << 20,
                                         int64_t block = 4, int64_t max_step_tokens = 256) {
  EngineOptions o;
  o.kv_cache_bytes = kv_bytes;
  o.block_size = block;
  o.max_step_tokens = max_step_tokens;
  o.prefix_caching = prefix_caching;
  auto e = Engine::create(std::move(w), o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

// Tokens and the cached_tokens of each request's first event.
struct Outputs {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, int64_t> cached;
};
void collect(const std::vector<TokenEvent>& events, Outputs* out) {
  for (const auto& ev : events) {
    auto& t = out->tokens[ev.request_id];
    if (t.empty()) out->cached[ev.request_id] = ev.cached_tokens;
    t.push_back(ev.token);
  }
}
Outputs run_outputs(Engine& e) {
  Outputs out;
  for (int guard = 0; !e.idle() && guard < 10000; ++guard) collect(e.step().value(), &out);
  EXPECT_TRUE(e.idle());
  return out;
}

std::vector<int32_t> prompt_of(int64_t n, int32_t seed, int32_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    p[static_cast<size_t>(i)] = (seed * 131 + 17 * static_cast<int32_t>(i)) % vocab;
  return p;
}

// Multi-turn traffic (a shared system prompt, then each turn the previous
// turn's prompt plus more) run one request after another with the cache on
// and off: the same greedy tokens, on every tiny preset (MLA latents in
// DeepSeek's, sliding windows of 16 in gpt-oss's: the prompts are longer),
// and with the cache on later turns report their cached prefix, and the
// engine's counters add up.
TEST(EngineTest, PrefixCacheKeepsGreedyOutputOnEveryTinyPreset) {
  for (const char* preset : {"tiny-mixtral", "tiny-qwen3moe", "tiny-deepseek-v3",
                             "tiny-deepseek-v2-lite", "tiny-gpt-oss", "tiny-glm4-moe"}) {
    SCOPED_TRACE(preset);
    auto w = load(testing::test_model_dir(preset));
    const int32_t vocab = static_cast<int32_t>(w->config().vocab);
    const std::vector<int32_t> system = prompt_of(22, 1, vocab);
    std::vector<GenerationRequest> turns;
    for (int user = 0; user < 2; ++user) {
      std::vector<int32_t> history = system;
      for (int turn = 0; turn < 3; ++turn) {
        const auto more = prompt_of(7 + turn, 10 * user + turn + 2, vocab);
        history.insert(history.end(), more.begin(), more.end());
        turns.push_back(req(100 * user + turn, history, 5));
      }
    }
    Outputs off, on;
    auto plain = make_engine_with(w, false);
    auto cached = make_engine_with(w, true);
    for (const auto& r : turns) {
      ASSERT_TRUE(plain->add(r).ok());
      for (int g = 0; !plain->idle() && g < 1000; ++g) collect(plain->step().value(), &off);
      ASSERT_TRUE(cached->add(r).ok());
      for (int g = 0; !cached->idle() && g < 1000; ++g) collect(cached->step().value(), &on);
    }
    int64_t queries = 0, hits = 0;
    for (const auto& r : turns) {
      EXPECT_EQ(on.tokens[r.id], off.tokens[r.id]) << "request " << r.id;
      EXPECT_EQ(off.cached[r.id], 0);
      // Whole blocks of what came before, at most (prompt - 1) rounded down.
      EXPECT_EQ(on.cached[r.id] % 4, 0);
      EXPECT_LE(on.cached[r.id], static_cast<int64_t>(r.prompt.size()) - 1);
      queries += static_cast<int64_t>(r.prompt.size());
      hits += on.cached[r.id];
    }
    EXPECT_EQ(on.cached[0], 0);     // the first request finds nothing
    EXPECT_EQ(on.cached[100], 20);  // the second user: the system prompt's 5 full blocks
    EXPECT_GE(on.cached[1], 28);    // a second turn: its whole first turn
    EXPECT_EQ(cached->counters().prefix_queries, queries);
    EXPECT_EQ(cached->counters().prefix_hits, hits);
    EXPECT_EQ(plain->counters().prefix_hits, 0);
    EXPECT_EQ(plain->counters().prefix_queries, queries);  // looked up, none found: all computed
    EXPECT_EQ(cached->kv_usage(), 0.0);
    EXPECT_GT(cached->kv_cache().cached_blocks(), 0);
    EXPECT_EQ(plain->kv_cache().cached_blocks(), 0);
  }
}

// A prompt sent again whole: (12 - 1) / 4 = 2 of its 3 blocks come from the
// cache and the last block is computed again (a shared block is never
// written), so the request still gets its logits; the same tokens as before.
// Also with n = 3 samples forked from a cached prefix.
TEST(EngineTest, AWholePromptHitComputesItsLastBlock) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  const std::vector<int32_t> prompt = {1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110};
  auto e = make_engine_with(w, true);
  ASSERT_TRUE(e->add(req(1, prompt, 6)).ok());
  const Outputs first = run_outputs(*e);
  ASSERT_TRUE(e->add(req(2, prompt, 6)).ok());
  auto step = e->step().value();  // one step: 4 tokens computed, the first token out
  ASSERT_EQ(step.size(), 1u);
  EXPECT_EQ(step[0].cached_tokens, 8);
  Outputs second;
  collect(step, &second);
  for (auto& [id, t] : run_outputs(*e).tokens)
    second.tokens[id].insert(second.tokens[id].end(), t.begin(), t.end());
  EXPECT_EQ(second.tokens[2], first.tokens.at(1));
  GenerationRequest r = req(3, prompt, 6);
  r.n = 3;
  ASSERT_TRUE(e->add(r).ok());
  const Sequences got = run_sequences(*e);
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(got.tokens.at({3, i}), first.tokens.at(1)) << i;
  EXPECT_EQ(e->kv_usage(), 0.0);
  EXPECT_EQ(e->counters().prefix_hits, 16);
  EXPECT_EQ(e->counters().prefix_queries, 36);
}

// Cached blocks no request holds count as free: admission takes them into
// account and a cache full of old prefixes admits as much as an empty one
// (evicting, least recently used first); the output is unchanged.
TEST(EngineTest, EvictableCachedBlocksCountAsFree) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  auto e = make_engine_with(w, true, /*kv_bytes=*/256 * 64, /*block=*/4);  // 16 blocks
  // Fill the cache with 15 blocks of finished prompts.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(e->add(req(i + 1, prompt_of(12, i + 1, 256), 1)).ok());
  run_outputs(*e);
  EXPECT_EQ(e->kv_usage(), 0.0);
  EXPECT_GE(e->kv_cache().evictable_blocks(), 10);
  // Now 15 new one-block requests run at once, as in an empty cache
  // (AdmissionFillsTheCache), and the same as alone.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(req(i + 10, {1, 10 + i}, 2));
  for (const auto& r : reqs) ASSERT_TRUE(e->add(r).ok());
  Outputs together;
  collect(e->step().value(), &together);
  EXPECT_EQ(e->running(), 15);
  EXPECT_EQ(e->waiting(), 1);
  for (auto& [id, t] : run_outputs(*e).tokens)
    together.tokens[id].insert(together.tokens[id].end(), t.begin(), t.end());
  EXPECT_EQ(e->counters().preemptions, 0);
  for (const auto& r : reqs) {
    auto alone = make_engine_with(w, false, 256 * 64, 4);
    ASSERT_TRUE(alone->add(r).ok());
    EXPECT_EQ(together.tokens[r.id], run_all(*alone)[r.id]) << "request " << r.id;
  }
}

// Preemption with shared cached blocks: three requests with one 12-token
// prefix (3 shared blocks) in a 16-block cache need more than it holds; the
// preempted one releases only its own references, is recomputed (finding
// its prefix, and its own blocks, in the cache again) and every output is
// what each produces alone; nothing stays referenced.
TEST(EngineTest, PreemptionWithCachedBlocksKeepsGreedyOutput) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  const std::vector<int32_t> prefix = {1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110};
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = prefix;
    p.insert(p.end(), {11 + i, 21 + i, 31 + i, 41 + i});
    reqs.push_back(req(i + 1, p, 24));
  }
  std::map<int64_t, std::vector<int32_t>> alone;
  for (const auto& r : reqs) {
    auto e = make_engine_with(w, false, 256 * 64, 4);
    ASSERT_TRUE(e->add(r).ok());
    alone[r.id] = run_all(*e)[r.id];
    ASSERT_EQ(alone[r.id].size(), 24u);
  }
  auto e = make_engine_with(w, true, 256 * 64, 4);
  // The first alone, so the others find its prefix.
  ASSERT_TRUE(e->add(reqs[0]).ok());
  Outputs out;
  collect(e->step().value(), &out);
  ASSERT_TRUE(e->add(reqs[1]).ok());
  ASSERT_TRUE(e->add(reqs[2]).ok());
  for (int g = 0; !e->idle() && g < 10000; ++g) collect(e->step().value(), &out);
  EXPECT_GT(e->counters().preemptions, 0);
  EXPECT_EQ(out.cached[2], 12);
  EXPECT_EQ(out.cached[3], 12);
  for (const auto& r : reqs) EXPECT_EQ(out.tokens[r.id], alone[r.id]) << "request " << r.id;
  EXPECT_EQ(e->kv_usage(), 0.0);
  for (int32_t b = 0; b < e->kv_cache().total_blocks(); ++b)
    EXPECT_EQ(e->kv_cache().block_refs(b), 0);
  e->flush_prefix_cache();
  EXPECT_EQ(e->kv_cache().cached_blocks(), 0);
  EXPECT_EQ(e->kv_cache().free_blocks(), e->kv_cache().total_blocks());
}

// A request whose prefix was cached when it arrived but evicted while it
// waited (a long request took the blocks): it finds less, or nothing, at
// admission, computes the rest, and its output is unchanged.
TEST(EngineTest, APrefixEvictedWhileWaitingIsRecomputed) {
  auto w = load(testing::test_model_dir("tiny-mixtral"));
  const std::vector<int32_t> a = prompt_of(24, 3, 256);  // 6 blocks
  std::vector<int32_t> c = a;
  c.insert(c.end(), {5, 6, 7, 8});
  auto e = make_engine_with(w, true, 256 * 64, 4);  // 16 blocks
  ASSERT_TRUE(e->add(req(1, a, 1)).ok());
  run_outputs(*e);
  EXPECT_EQ(e->kv_cache().cached_blocks(), 6);
  // B: 40 + 20 tokens = 15 blocks, admitted first; C (a + 4) waits for it and
  // B's decode takes the cached blocks of a (evicted from a's end).
  ASSERT_TRUE(e->add(req(2, prompt_of(40, 9, 256), 20)).ok());
  ASSERT_TRUE(e->add(req(3, c, 4)).ok());
  Outputs out;
  for (int g = 0; !e->idle() && g < 10000; ++g) collect(e->step().value(), &out);
  EXPECT_LT(out.cached.at(3), 24);
  auto alone = make_engine_with(w, false, 256 * 64, 4);
  ASSERT_TRUE(alone->add(req(3, c, 4)).ok());
  EXPECT_EQ(out.tokens.at(3), run_all(*alone)[3]);
  EXPECT_EQ(e->kv_usage(), 0.0);
}

}  // namespace
}  // namespace msinfer::runtime
