// Prefill/decode handoff between two engines (Engine::take_prefilled,
// Engine::add_prefilled, KvCache::export_kv / import_kv; and without the
// copies, Engine::place_prefilled / commit_prefilled with the bytes written
// from pool to pool along KvCache::transfer_spans): a sequence prefilled by
// one engine and decoded by another produces the tokens one engine
// produces, on every tiny preset, greedy and sampled.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <utility>

#include "msinfer/runtime/engine.h"
#include "test_models.h"

namespace msinfer::runtime {
namespace {

using Key = std::pair<int64_t, int32_t>;  // (request, sequence)
using Tokens = std::map<Key, std::vector<int32_t>>;

std::shared_ptr<const model::ModelWeights> load(const std::string& preset) {
  auto w = model::ModelWeights::load(testing::test_model_dir(preset), {});
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::shared_ptr<const model::ModelWeights>(std::move(w).value()) : nullptr;
}

std::unique_ptr<Engine> engine(std::shared_ptr<const model::ModelWeights> w,
                               int64_t kv_bytes = 8 << 20, int64_t block = 4,
                               int64_t max_step_tokens = 256) {
  EngineOptions o;
  o.kv_cache_bytes = kv_bytes;
  o.block_size = block;
  o.max_step_tokens = max_step_tokens;
  auto e = Engine::create(std::move(w), o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

std::vector<int32_t> prompt_of(int64_t n, int32_t seed, int32_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    p[static_cast<size_t>(i)] = (seed * 131 + 17 * static_cast<int32_t>(i)) % vocab;
  return p;
}

// Greedy; seeded at temperature 1 with n = 2 and penalties; with logprobs
// (the decoding engine's logits must be the ones one engine sees).
std::vector<GenerationRequest> requests(int32_t vocab) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r{10 + i, prompt_of(20 + 11 * i, i + 1, vocab), {}};
    r.sampling.max_tokens = 7;
    r.sampling.ignore_eos = true;
    if (i == 1) {
      r.sampling.temperature = 1.f;
      r.sampling.seed = 99;
      r.sampling.presence_penalty = 0.5f;
      r.n = 2;
    }
    if (i == 2) r.sampling.logprobs = 2;
    out.push_back(std::move(r));
  }
  return out;
}

void collect(const std::vector<TokenEvent>& events, Tokens* out) {
  for (const TokenEvent& ev : events) {
    EXPECT_EQ(ev.finish_reason == FinishReason::kError, false) << ev.error;
    (*out)[{ev.request_id, ev.index}].push_back(ev.token);
  }
}

Tokens run(Engine& e, Tokens out = {}) {
  for (int guard = 0; !e.idle() && guard < 10000; ++guard) collect(e.step().value(), &out);
  EXPECT_TRUE(e.idle());
  return out;
}

// Every sequence's tokens when one engine runs `rs`.
Tokens in_one_engine(std::shared_ptr<const model::ModelWeights> w,
                     const std::vector<GenerationRequest>& rs) {
  auto one = engine(std::move(w));
  for (const auto& r : rs) EXPECT_TRUE(one->add(r).ok());
  return run(*one);
}

// Prefills `rs` on `prefill` (prefill_only), hands every sequence to
// `decode` and decodes there; returns every sequence's tokens.
Tokens disaggregated(Engine& prefill, Engine& decode, std::vector<GenerationRequest> rs) {
  Tokens out;
  for (GenerationRequest& r : rs) {
    r.prefill_only = true;
    EXPECT_TRUE(prefill.add(r).ok());
  }
  out = run(prefill, std::move(out));
  for (const auto& [key, tokens] : out) EXPECT_EQ(tokens.size(), 1u) << "request " << key.first;
  EXPECT_EQ(prefill.prefilled() > 0, prefill.kv_usage() > 0);  // held by the waiting sequences
  for (PrefilledSequence& s : prefill.take_prefilled()) {
    EXPECT_EQ(s.generated, 1);
    EXPECT_FALSE(s.request.prefill_only);
    const Status st = decode.add_prefilled(std::move(s));
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  EXPECT_EQ(prefill.prefilled(), 0);
  EXPECT_EQ(prefill.kv_usage(), 0.0);  // handed off: nothing held
  return run(decode, std::move(out));
}

// As disaggregated, but each sequence's K/V go from the prefill engine's
// pool straight into blocks the decoding engine placed, as a prefill worker
// writes them (KvCache::pair_spans); `placed` counts those that went so (the
// others, without room now, are copied: add_prefilled); `skips` (may be
// null) gets each placed one's blocks that the decoding engine's prefix
// cache held (not written).
Tokens in_place(Engine& prefill, Engine& decode, std::vector<GenerationRequest> rs, int* placed,
                std::vector<int64_t>* skips = nullptr) {
  Tokens out;
  for (GenerationRequest& r : rs) {
    r.prefill_only = true;
    EXPECT_TRUE(prefill.add(r).ok());
  }
  out = run(prefill, std::move(out));
  const KvCache& from = prefill.kv_cache();
  const KvCache& to = decode.kv_cache();
  *placed = 0;
  for (PrefilledSequence& s : prefill.take_prefilled(/*copy_kv=*/false)) {
    EXPECT_TRUE(s.kv.empty());
    const int64_t seq = s.kv_seq, tokens = s.computed, id = s.request.id;
    const int32_t index = s.index;
    auto where = decode.place_prefilled(s, from.transfer_bytes(tokens));
    EXPECT_TRUE(where.ok()) << where.status().to_string();
    if (!where.ok()) continue;
    if (!where->has_value()) {
      s.kv.resize(static_cast<size_t>(from.transfer_bytes(tokens)));
      from.export_kv(seq, tokens, s.kv.data());
      EXPECT_TRUE(decode.add_prefilled(std::move(s)).ok());
    } else {
      const int64_t skip = (*where)->skip_blocks;
      if (skips != nullptr) skips->push_back(skip);
      auto src = from.transfer_spans(from.transfer_table(seq, tokens, skip), tokens,
                                     from.total_blocks(), skip);
      auto dst = to.transfer_spans((*where)->table, tokens, (*where)->pool_blocks, skip);
      EXPECT_TRUE(src.ok() && dst.ok());
      if (!src.ok() || !dst.ok()) continue;
      int64_t moved = 0;
      for (const KvCache::Copy& c : KvCache::pair_spans(*src, *dst)) {
        std::memcpy(to.pool_data() + c.to, from.pool_data() + c.from, static_cast<size_t>(c.bytes));
        moved += c.bytes;
      }
      const int64_t block_bytes = from.transfer_bytes(tokens) / from.transfer_blocks(tokens);
      EXPECT_EQ(moved, from.transfer_bytes(tokens) - skip * block_bytes);
      EXPECT_TRUE(decode.commit_prefilled(id, index, /*arrived=*/true));
      ++*placed;
    }
    prefill.release_prefilled(seq);
  }
  EXPECT_EQ(prefill.kv_usage(), 0.0);  // every block given back
  return run(decode, std::move(out));
}

// The K/V of every preset's cache (MLA latents in DeepSeek's, sliding
// windows of 16 in gpt-oss's: prompts up to 42 tokens leave a sliding
// group's early blocks behind), prefilled in one engine and decoded in
// another, give the single engine's tokens for every sequence.
TEST(PrefillHandoffTest, DecodingElsewhereGivesTheTokensOfOneEngine) {
  for (const char* preset : {"tiny-mixtral", "tiny-qwen3moe", "tiny-deepseek-v3",
                             "tiny-deepseek-v2-lite", "tiny-gpt-oss", "tiny-glm4-moe"}) {
    SCOPED_TRACE(preset);
    auto w = load(preset);
    ASSERT_NE(w, nullptr);
    const auto rs = requests(static_cast<int32_t>(w->config().vocab));
    const Tokens expected = in_one_engine(w, rs);
    ASSERT_EQ(expected.size(), 4u);  // three requests, one of two sequences
    auto prefill = engine(w);
    auto decode = engine(w);
    EXPECT_EQ(disaggregated(*prefill, *decode, rs), expected);
    EXPECT_EQ(decode->kv_usage(), 0.0);
    // What the decoding engine was handed is in its prefix cache now: the
    // whole prompt but its last block; with sliding windows nothing, since
    // the blocks before the window stayed with the prefill engine.
    GenerationRequest again = rs[0];
    again.id = 50;
    ASSERT_TRUE(decode->add(again).ok());
    const auto first = decode->step().value();
    ASSERT_FALSE(first.empty());
    const bool sliding = w->config().attention_window(0) > 0 || w->config().attention_window(1) > 0;
    EXPECT_EQ(first[0].cached_tokens,
              sliding ? 0 : (static_cast<int64_t>(again.prompt.size()) - 1) / 4 * 4);
  }
}

// The same without the copies, into a decoding engine whose pool is of
// another size and whose free blocks are out of order (a finished request
// gave them back): each sequence's K/V land, as scattered runs, in the
// blocks it placed.
TEST(PrefillHandoffTest, KvWrittenIntoPlacedBlocksGivesTheTokensOfOneEngine) {
  for (const char* preset : {"tiny-mixtral", "tiny-deepseek-v3", "tiny-gpt-oss"}) {
    SCOPED_TRACE(preset);
    auto w = load(preset);
    ASSERT_NE(w, nullptr);
    const int32_t vocab = static_cast<int32_t>(w->config().vocab);
    const auto rs = requests(vocab);
    const Tokens expected = in_one_engine(w, rs);
    auto prefill = engine(w);
    auto decode = engine(w, 6 << 20);
    ASSERT_NE(decode->kv_cache().total_blocks(), prefill->kv_cache().total_blocks());
    GenerationRequest before{90, prompt_of(37, 5, vocab), {}};
    before.sampling.max_tokens = 3;
    ASSERT_TRUE(decode->add(before).ok());
    run(*decode);
    decode->flush_prefix_cache();  // its blocks free again, the last freed first
    int placed = 0;
    EXPECT_EQ(in_place(*prefill, *decode, rs, &placed), expected);
    EXPECT_EQ(placed, 4);
    EXPECT_EQ(decode->kv_usage(), 0.0);
  }
}

// A prompt whose first blocks the decoding engine's prefix cache holds
// (another sequence with the same start was handed to it before) has only
// the rest written: those blocks are shared. Not with sliding layers, whose
// windows leave the early blocks behind (none skipped there).
TEST(PrefillHandoffTest, BlocksThePrefixCacheHoldsAreNotWrittenAgain) {
  for (const char* preset : {"tiny-mixtral", "tiny-deepseek-v3", "tiny-gpt-oss"}) {
    SCOPED_TRACE(preset);
    auto w = load(preset);
    ASSERT_NE(w, nullptr);
    const int32_t vocab = static_cast<int32_t>(w->config().vocab);
    std::vector<GenerationRequest> rs;
    for (int i = 0; i < 2; ++i) {
      GenerationRequest r{60 + i, prompt_of(30, 4, vocab), {}};
      for (int t = 24; t < 30; ++t) r.prompt[static_cast<size_t>(t)] = (t * 7 + 13 * i) % vocab;
      r.sampling.max_tokens = 5;
      r.sampling.ignore_eos = true;
      rs.push_back(r);
    }
    const Tokens expected = in_one_engine(w, rs);
    auto prefill = engine(w);
    auto decode = engine(w);
    int placed = 0;
    std::vector<int64_t> skips;
    EXPECT_EQ(in_place(*prefill, *decode, rs, &placed, &skips), expected);
    EXPECT_EQ(placed, 2);
    const bool sliding = w->config().attention_window(0) > 0 || w->config().attention_window(1) > 0;
    // The second shares 24 tokens, 6 blocks of 4, with the first.
    EXPECT_EQ(skips, (std::vector<int64_t>{0, sliding ? 0 : 6}));
    EXPECT_EQ(decode->kv_usage(), 0.0);
  }
}

// A placed sequence whose K/V never came, and one cancelled before they
// did, give their blocks back; a pool without room now places nothing.
TEST(PrefillHandoffTest, PlacedBlocksAreFreedWhenTheKvDoNotCome) {
  auto w = load("tiny-mixtral");
  ASSERT_NE(w, nullptr);
  const int32_t vocab = static_cast<int32_t>(w->config().vocab);
  auto prefill = engine(w);
  std::vector<PrefilledSequence> taken;
  for (int i = 0; i < 2; ++i) {
    GenerationRequest r{20 + i, prompt_of(30, i + 1, vocab), {}};
    r.sampling.max_tokens = 4;
    r.prefill_only = true;
    ASSERT_TRUE(prefill->add(r).ok());
  }
  run(*prefill);
  taken = prefill->take_prefilled(/*copy_kv=*/false);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_GT(prefill->kv_usage(), 0.0);  // held until released
  const int64_t bytes = prefill->kv_cache().transfer_bytes(taken[0].computed);
  auto decode = engine(w);
  for (const PrefilledSequence& s : taken) {
    auto where = decode->place_prefilled(s, bytes);
    ASSERT_TRUE(where.ok());
    ASSERT_TRUE(where->has_value());
  }
  EXPECT_GT(decode->kv_usage(), 0.0);
  EXPECT_EQ(decode->place_prefilled(taken[0], bytes).status().code(),
            StatusCode::kInvalidArgument);  // already placed
  EXPECT_EQ(decode->place_prefilled(taken[1], bytes + 1).status().code(),
            StatusCode::kInvalidArgument);  // not the bytes of its positions
  EXPECT_TRUE(decode->commit_prefilled(20, 0, /*arrived=*/false));
  EXPECT_FALSE(decode->commit_prefilled(20, 0, /*arrived=*/true));  // gone
  EXPECT_TRUE(decode->cancel(21));
  EXPECT_FALSE(decode->commit_prefilled(21, 0, /*arrived=*/true));
  EXPECT_EQ(decode->kv_usage(), 0.0);
  EXPECT_TRUE(decode->idle());
  for (const PrefilledSequence& s : taken) prefill->release_prefilled(s.kv_seq);
  EXPECT_EQ(prefill->kv_usage(), 0.0);
  // 30 positions take 8 blocks of 4; a pool of 10 with a running request
  // holding 8 has no room for them.
  const int64_t block_bytes = KvCache::bytes_per_token(w->config()) * 4;
  auto small = engine(w, 10 * block_bytes);
  GenerationRequest busy{30, prompt_of(30, 7, vocab), {}};
  busy.sampling.max_tokens = 2;
  ASSERT_TRUE(small->add(busy).ok());
  ASSERT_TRUE(small->step().ok());
  auto none = small->place_prefilled(taken[0], bytes);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

// Block tables off the wire: the wrong number of layer groups or blocks, a
// block outside the pool.
TEST(PrefillHandoffTest, TransferSpansRefuseTablesOfTheWrongShape) {
  auto w = load("tiny-gpt-oss");  // two layer groups, one sliding
  ASSERT_NE(w, nullptr);
  auto e = engine(w);
  const KvCache& kv = e->kv_cache();
  ASSERT_EQ(kv.groups(), 2);
  const int64_t tokens = 41;  // 11 blocks of 4; the sliding group's window of 16 needs 5
  const int64_t full = kv.blocks_for(tokens);
  const int64_t window = kv.transfer_blocks(tokens) - full;
  ASSERT_LT(window, full);
  std::vector<std::vector<int32_t>> good(2);
  for (int g = 0; g < 2; ++g) {
    const int64_t n = kv.group_window(g) > 0 ? window : full;
    for (int64_t i = 0; i < n; ++i)
      good[static_cast<size_t>(g)].push_back(static_cast<int32_t>(2 * i + g));
  }
  auto spans = kv.transfer_spans(good, tokens, 64);
  ASSERT_TRUE(spans.ok()) << spans.status().to_string();
  int64_t bytes = 0;
  for (const auto& s : *spans) bytes += s.bytes;
  EXPECT_EQ(bytes, kv.transfer_bytes(tokens));
  auto bad = good;
  bad.pop_back();
  EXPECT_FALSE(kv.transfer_spans(bad, tokens, 64).ok());
  bad = good;
  bad[0].pop_back();
  EXPECT_FALSE(kv.transfer_spans(bad, tokens, 64).ok());
  bad = good;
  bad[1][0] = 64;
  EXPECT_FALSE(kv.transfer_spans(bad, tokens, 64).ok());
  bad[1][0] = -1;
  EXPECT_FALSE(kv.transfer_spans(bad, tokens, 64).ok());
  EXPECT_FALSE(kv.transfer_spans(good, 0, 64).ok());
  EXPECT_FALSE(kv.transfer_spans(good, tokens, 64, 1).ok());  // sliding groups skip nothing
  EXPECT_FALSE(kv.transfer_spans(good, tokens, 64, -1).ok());
}

// A decoding engine too small for every handed-off sequence at once preempts
// some; they recompute their prompt and tokens so far and still end with the
// single engine's tokens.
TEST(PrefillHandoffTest, AHandedOffSequencePreemptedRecomputesTheSameTokens) {
  auto w = load("tiny-mixtral");
  ASSERT_NE(w, nullptr);
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r{i, prompt_of(30, i + 3, static_cast<int32_t>(w->config().vocab)), {}};
    r.sampling.max_tokens = 24;
    r.sampling.ignore_eos = true;
    rs.push_back(r);
  }
  const Tokens expected = in_one_engine(w, rs);
  auto prefill = engine(w);
  // 4 sequences of up to 54 positions need 56 blocks of 4; the pool holds 40.
  const int64_t block_bytes = KvCache::bytes_per_token(w->config()) * 4;
  auto decode = engine(w, 40 * block_bytes);
  ASSERT_EQ(decode->kv_cache().total_blocks(), 40);
  EXPECT_EQ(disaggregated(*prefill, *decode, rs), expected);
  EXPECT_GT(decode->counters().preemptions, 0);
  EXPECT_EQ(decode->kv_usage(), 0.0);
}

// A first token that ends its sequence leaves nothing to hand off; a
// cancelled prefilled sequence frees its blocks.
TEST(PrefillHandoffTest, FinishedAndCancelledSequencesAreNotHandedOff) {
  auto w = load("tiny-mixtral");
  ASSERT_NE(w, nullptr);
  auto e = engine(w);
  const auto p = prompt_of(10, 1, static_cast<int32_t>(w->config().vocab));
  GenerationRequest done{1, p, {}}, cancelled{2, p, {}};
  done.sampling.max_tokens = 1;
  cancelled.sampling.max_tokens = 5;
  done.prefill_only = cancelled.prefill_only = true;
  ASSERT_TRUE(e->add(done).ok());
  ASSERT_TRUE(e->add(cancelled).ok());
  const auto events = e->step().value();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].finished);
  EXPECT_FALSE(events[1].finished);
  EXPECT_TRUE(e->idle());
  EXPECT_EQ(e->prefilled(), 1);
  EXPECT_GT(e->kv_usage(), 0.0);  // the parked sequence holds its prompt's blocks
  EXPECT_FALSE(e->add(cancelled).ok()) << "its id is in use while it waits";
  EXPECT_TRUE(e->cancel(2));
  EXPECT_EQ(e->prefilled(), 0);
  EXPECT_EQ(e->kv_usage(), 0.0);
  EXPECT_TRUE(e->take_prefilled().empty());
}

// What a decoding engine refuses: K/V of another cache layout or size, a
// sequence whose counts do not agree, one with all its tokens, a sequence
// already there, a sampler state it cannot read.
TEST(PrefillHandoffTest, MismatchedHandoffsAreRefused) {
  auto w = load("tiny-mixtral");
  ASSERT_NE(w, nullptr);
  auto prefill = engine(w);
  GenerationRequest r{7, prompt_of(13, 2, static_cast<int32_t>(w->config().vocab)), {}};
  r.sampling.max_tokens = 4;
  r.prefill_only = true;
  ASSERT_TRUE(prefill->add(r).ok());
  run(*prefill);
  auto taken = prefill->take_prefilled();
  ASSERT_EQ(taken.size(), 1u);
  const PrefilledSequence good = taken[0];
  EXPECT_EQ(static_cast<int64_t>(good.kv.size()), prefill->kv_cache().transfer_bytes(13));
  auto refused = [&](PrefilledSequence s, const std::string& why) {
    auto decode = engine(w);
    const Status st = decode->add_prefilled(std::move(s));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why << ": " << st.to_string();
    EXPECT_TRUE(decode->idle());
  };
  {
    auto other_blocks = engine(w, 8 << 20, 8);  // a block of 8 tokens: another layout
    EXPECT_EQ(other_blocks->add_prefilled(good).code(), StatusCode::kInvalidArgument);
  }
  PrefilledSequence s = good;
  s.kv.pop_back();
  refused(s, "short K/V");
  s = good;
  s.computed = 12;
  refused(s, "K/V of fewer positions than the tokens before the last");
  s = good;
  s.tokens.push_back(3);
  refused(s, "tokens beyond those generated");
  s = good;
  s.generated = 4;
  s.tokens.insert(s.tokens.end(), 3, 5);
  s.computed = static_cast<int64_t>(s.tokens.size()) - 1;
  refused(s, "max_tokens reached");
  s = good;
  s.rng = "not a generator";
  refused(s, "sampler state");
  s = good;
  s.index = 1;
  refused(s, "sequence 1 of n = 1");
  auto decode = engine(w);
  ASSERT_TRUE(decode->add_prefilled(good).ok());
  EXPECT_EQ(decode->add_prefilled(good).code(), StatusCode::kInvalidArgument);  // already there
  EXPECT_EQ(decode->add(r).code(), StatusCode::kInvalidArgument);               // its id is in use
}

}  // namespace
}  // namespace msinfer::runtime
