// Prefill/decode disaggregation through the msinfer binary's workers
// (docs/RUNTIME.md): prefill workers compute the prompts, each sequence's
// K/V move over the M2N transport into blocks of an attention worker's KV
// pool (or, without room there now, its staging region), and the attention
// worker decodes it. Greedy tokens are the co-located engine's; a dead
// prefill worker's requests are prefilled again; K/V that fit neither fall
// back to the attention workers.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <map>

#include "msinfer/runtime/router.h"
#include "test_models.h"

namespace msinfer::runtime {
namespace {

const std::string kBinary = MSINFER_BINARY;

WorkerConfig deployment(const std::string& dir, int experts, const std::string& provider) {
  WorkerConfig c;
  c.model_dir = dir;
  c.attention_workers = 2;
  c.expert_workers = 2;
  c.engine.micro_batches = 2;
  c.placement = Placement::round_robin(experts, 2);
  c.timeout_ms = 4000;
  c.transport = *comm::parse_transport(provider);
  c.prefill_workers = 1;
  c.engine.kv_cache_bytes = 16 << 20;  // the pools live in /dev/shm with the direct transport
  c.kv_transfer_bytes = 4 << 20;
  return c;
}

// Prompts long enough that a sliding window (gpt-oss: 16) leaves blocks
// behind, of different lengths.
std::vector<GenerationRequest> requests(int32_t vocab) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.id = i + 1;
    for (int t = 0; t < 30 + 9 * i; ++t) r.prompt.push_back((7 + 31 * t + 13 * i) % vocab);
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    out.push_back(r);
  }
  return out;
}

std::map<int64_t, std::vector<int32_t>> colocated(const std::string& dir,
                                                  const std::vector<GenerationRequest>& rs) {
  auto w = model::ModelWeights::load(dir, {});
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  auto e = Engine::create(std::shared_ptr<const model::ModelWeights>(std::move(w).value()), {});
  EXPECT_TRUE(e.ok());
  for (const auto& r : rs) EXPECT_TRUE((*e)->add(r).ok());
  std::map<int64_t, std::vector<int32_t>> out;
  for (int g = 0; !(*e)->idle() && g < 1000; ++g) {
    for (const auto& ev : (*e)->step().value()) out[ev.request_id].push_back(ev.token);
  }
  // A request longer than the steps would be cut short here and differ from
  // the deployment's for that reason alone.
  EXPECT_TRUE((*e)->idle()) << "the co-located run stopped at its 1,000 steps";
  return out;
}

// Bytes of one KV block of the model in `dir` (all layers, default block size).
int64_t block_bytes(const std::string& dir) {
  auto mc = load_model_config(dir);
  EXPECT_TRUE(mc.ok());
  return mc.ok() ? KvCache::bytes_per_token(*mc) * KvCache::kDefaultBlockSize : 0;
}

// Runs `rs` through a router of `c`; `on_step(router, i)` before step i.
template <typename OnStep>
std::map<int64_t, std::vector<int32_t>> through(const WorkerConfig& c,
                                                const std::vector<GenerationRequest>& rs,
                                                Router::KvTransfers* moved, OnStep on_step) {
  std::map<int64_t, std::vector<int32_t>> out;
  auto started = Router::start(c, kBinary);
  EXPECT_TRUE(started.ok()) << started.status().to_string();
  if (!started.ok()) return out;
  std::unique_ptr<Router> router = std::move(started).value();  // stops the workers
  for (const auto& r : rs) EXPECT_TRUE(router->add(r).ok());
  for (int i = 0; !router->idle() && i < 5000; ++i) {
    on_step(*router, i);
    auto events = router->step();
    EXPECT_TRUE(events.ok()) << events.status().to_string();
    if (!events.ok()) break;
    for (const auto& ev : *events) {
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
      out[ev.request_id].push_back(ev.token);
    }
  }
  EXPECT_TRUE(router->idle());
  if (moved != nullptr) *moved = router->kv_transfers();
  return out;
}

// Every tiny preset's K/V (MLA latents, sliding windows, GQA with biases)
// over msinfer's two transports and libfabric's tcp provider: the co-located engine's tokens, every
// sequence moved, none prefilled twice.
TEST(PrefillWorkersTest, DecodingAfterATransferGivesTheColocatedTokens) {
  for (const char* preset : {"tiny-mixtral", "tiny-deepseek-v3", "tiny-gpt-oss"}) {
    for (const char* provider : {"direct", "socket", "tcp"}) {  // tcp: libfabric's
      SCOPED_TRACE(std::string(preset) + " over " + provider);
      const std::string dir = testing::test_model_dir(preset);
      auto mc = load_model_config(dir);
      ASSERT_TRUE(mc.ok());
      const auto rs = requests(static_cast<int32_t>(mc->vocab));
      Router::KvTransfers moved;
      const auto got = through(deployment(dir, static_cast<int>(mc->experts), provider), rs, &moved,
                               [](Router&, int) {});
      EXPECT_EQ(got, colocated(dir, rs));
      EXPECT_EQ(moved.sequences, 4);
      EXPECT_EQ(moved.into_pool, 4);  // written into the pools' blocks, no staging copy
      EXPECT_EQ(moved.fallbacks, 0);
      EXPECT_GT(moved.bytes, 0);
    }
  }
}

// The only prefill worker killed while it holds requests: they are
// prefilled again on the attention workers, with the same tokens.
TEST(PrefillWorkersTest, AKilledPrefillWorkersRequestsArePrefilledAgain) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto rs = requests(256);
  for (auto& r : rs) r.prompt.resize(600, 5);  // several steps of prefill each
  WorkerConfig c = deployment(dir, 8, "direct");
  c.engine.max_step_tokens = 64;
  Router::KvTransfers moved;
  bool killed = false;
  const auto got = through(c, rs, &moved, [&](Router& router, int i) {
    if (i == 2 && !killed) {
      ASSERT_GT(router.pid_of(WorkerRole::kPrefill, 0), 0);
      ::kill(router.pid_of(WorkerRole::kPrefill, 0), SIGKILL);
      killed = true;
    }
  });
  EXPECT_TRUE(killed);
  EXPECT_EQ(got, colocated(dir, rs));
  EXPECT_LT(moved.sequences, 4);  // at least one was still prefilling when it died
}

// --respawn: the only prefill worker killed while it holds requests; they
// are prefilled again on the attention workers, a replacement is forked and
// wired to the attention workers' staging regions while the deployment
// serves, and the next requests' K/V move from it. Tokens are the
// co-located engine's throughout.
TEST(PrefillWorkersTest, UnderRespawnAKilledPrefillWorkerIsReplaced) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto rs = requests(256);
  for (auto& r : rs) r.prompt.resize(600, 5);  // several steps of prefill each
  WorkerConfig c = deployment(dir, 8, "direct");
  c.engine.max_step_tokens = 64;
  c.respawn = true;
  auto started = Router::start(c, kBinary);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<Router> router = std::move(started).value();  // stops the workers
  std::map<int64_t, std::vector<int32_t>> got;
  const auto run = [&](const std::vector<GenerationRequest>& batch, int kill_at) {
    for (const auto& r : batch) ASSERT_TRUE(router->add(r).ok());
    for (int i = 0; !router->idle() && i < 5000; ++i) {
      if (i == kill_at) {
        ASSERT_GT(router->pid_of(WorkerRole::kPrefill, 0), 0);
        ::kill(router->pid_of(WorkerRole::kPrefill, 0), SIGKILL);
      }
      auto events = router->step();
      ASSERT_TRUE(events.ok()) << events.status().to_string();
      for (const auto& ev : *events) {
        EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
        got[ev.request_id].push_back(ev.token);
      }
    }
    ASSERT_TRUE(router->idle());
  };
  run(rs, /*kill_at=*/2);
  const int64_t moved_before = router->kv_transfers().sequences;
  EXPECT_LT(moved_before, 4);  // at least one was still prefilling when it died
  // The replacement joins between steps (an idle router steps too).
  for (int i = 0; i < 3000 && router->health().prefill.live == 0; ++i) {
    ASSERT_TRUE(router->step().ok());
    ::usleep(10000);
  }
  const DeploymentHealth h = router->health();
  EXPECT_EQ(h.prefill.live, 1);
  EXPECT_EQ(h.prefill.deaths, 1);
  EXPECT_EQ(h.prefill.restarts, 1);
  auto more = requests(256);
  for (auto& r : more) r.id += 100;
  run(more, /*kill_at=*/-1);
  EXPECT_EQ(router->kv_transfers().sequences, moved_before + 4);  // all through the new one
  EXPECT_EQ(router->kv_transfers().fallbacks, 0);
  auto want = colocated(dir, rs);
  for (const auto& [id, t] : colocated(dir, more)) want[id] = t;
  EXPECT_EQ(got, want);
}

// Requests, a cancel and the stats arrive while the prefill worker is
// stepping: its step's answer is taken first, nothing is mixed up, and the
// tokens are the co-located engine's.
TEST(PrefillWorkersTest, CommandsWhileAPrefillWorkerStepsWaitForItsAnswer) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto rs = requests(256);
  // The first decodes after one prefill step; the others take several, so
  // the prefill worker steps while the attention workers decode.
  for (auto& r : rs) r.prompt.resize(r.id == 1 ? 30 : 600, 5 + static_cast<int32_t>(r.id));
  WorkerConfig c = deployment(dir, 8, "direct");
  c.engine.max_step_tokens = 64;
  c.engine.micro_batches = 1;
  const std::vector<GenerationRequest> first(rs.begin(), rs.begin() + 2);
  GenerationRequest cancelled = rs[3];
  cancelled.id = 99;
  const auto got = through(c, first, nullptr, [&](Router& router, int i) {
    if (i == 2) {
      EXPECT_TRUE(router.add(rs[2]).ok());
      EXPECT_TRUE(router.add(cancelled).ok());
    }
    if (i == 3) {
      EXPECT_TRUE(router.stats(false).ok());
    }
    if (i == 4) {
      EXPECT_TRUE(router.cancel(99).ok());
    }
  });
  const std::vector<GenerationRequest> kept(rs.begin(), rs.begin() + 3);
  auto expected = colocated(dir, kept);
  EXPECT_EQ(got.count(99), 0u) << "cancelled before its first token";
  EXPECT_EQ(got, expected);
}

// With two prefill workers, one killed mid-prompt: its requests go to the
// other, which moves them on; nothing is prefilled on an attention worker.
TEST(PrefillWorkersTest, AKilledPrefillWorkersRequestsGoToAnother) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto rs = requests(256);
  for (auto& r : rs) r.prompt.resize(600, 5 + static_cast<int32_t>(r.id));
  WorkerConfig c = deployment(dir, 8, "socket");
  c.prefill_workers = 2;
  c.engine.max_step_tokens = 64;
  Router::KvTransfers moved;
  bool killed = false;
  const auto got = through(c, rs, &moved, [&](Router& router, int i) {
    if (i == 2 && !killed) {
      ::kill(router.pid_of(WorkerRole::kPrefill, 1), SIGKILL);
      killed = true;
    }
  });
  EXPECT_TRUE(killed);
  EXPECT_EQ(got, colocated(dir, rs));
  EXPECT_EQ(moved.sequences, 4);
  EXPECT_EQ(moved.fallbacks, 0);
}

// An attention worker killed while prompts are prefilled (--resubmit): a
// sequence routed to it, or in flight there, ends on the other one; every
// request still gives the co-located engine's tokens.
TEST(PrefillWorkersTest, ATransferToADeadAttentionWorkerGoesToAnother) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  auto rs = requests(256);
  for (auto& r : rs) r.prompt.resize(r.id == 1 ? 30 : 400, 5 + static_cast<int32_t>(r.id));
  WorkerConfig c = deployment(dir, 8, "direct");
  c.engine.max_step_tokens = 64;
  c.engine.micro_batches = 1;
  c.resubmit = true;
  c.routing = RoutingPolicy::kRoundRobin;  // both attention workers take sequences
  bool killed = false;
  const auto got = through(c, rs, nullptr, [&](Router& router, int i) {
    if (i == 3 && !killed) {
      ::kill(router.pid_of(WorkerRole::kAttention, 0), SIGKILL);
      killed = true;
    }
  });
  EXPECT_TRUE(killed);
  EXPECT_EQ(got, colocated(dir, rs));
}

// Two prompts with the same first 300 tokens (2 full blocks of 128) into one
// attention worker: the second's K/V leave out the blocks the first left in
// its prefix cache; both give the co-located tokens.
TEST(PrefillWorkersTest, BlocksTheAttentionWorkersCacheHoldsAreNotSent) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const int64_t block = block_bytes(dir);
  std::vector<GenerationRequest> rs = requests(256);
  rs.resize(2);
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> p(300, 0);
    for (int t = 0; t < 300; ++t) p[static_cast<size_t>(t)] = (t * 5 + 3) % 256;
    p.insert(p.end(), rs[static_cast<size_t>(i)].prompt.begin(),
             rs[static_cast<size_t>(i)].prompt.end());  // 30 and 39 tokens of their own
    rs[static_cast<size_t>(i)].prompt = p;
  }
  WorkerConfig c = deployment(dir, 8, "socket");
  c.attention_workers = 1;
  Router::KvTransfers moved;
  const auto got = through(c, rs, &moved, [](Router&, int) {});
  EXPECT_EQ(got, colocated(dir, rs));
  EXPECT_EQ(moved.sequences, 2);
  EXPECT_EQ(moved.into_pool, 2);
  EXPECT_EQ(moved.bytes, (3 + 1) * block);  // 330 and 339 positions: 3 blocks each, 2 shared
}

// One attention worker whose pool a long decoding request half fills: a
// second long prompt's blocks are not free when its K/V come, so they go
// through the staging region when it holds them, and otherwise the request
// is prefilled again on the attention worker; either way the tokens are
// the co-located engine's. The first decodes 500 tokens, longer than
// the second's prefill takes: with 200, under ASan on a busy CI machine, it
// once finished before the second's K/V came, and both went into the pool.
TEST(PrefillWorkersTest, KvWithoutRoomInThePoolGoThroughTheStagingRegionOrFallBack) {
  const std::string dir = testing::test_model_dir("tiny-mixtral");
  const int64_t block = block_bytes(dir);
  std::vector<GenerationRequest> rs = requests(256);
  rs.resize(2);
  rs[0].prompt.resize(2000, 9);  // 16 blocks, 20 with its 500 tokens
  rs[0].sampling.max_tokens = 500;
  rs[1].prompt.resize(1900, 11);  // 15 blocks (+1 watermark): not free beside the first
  const auto expected = colocated(dir, rs);
  for (const bool staging_holds_it : {true, false}) {
    SCOPED_TRACE(staging_holds_it ? "through the staging region" : "prefilled again");
    WorkerConfig c = deployment(dir, 8, "direct");
    c.attention_workers = 1;
    c.engine.kv_cache_bytes = 31 * block;
    c.kv_transfer_bytes = staging_holds_it ? 16 * block : 8 * block;
    Router::KvTransfers moved;
    const auto got = through(c, rs, &moved, [](Router&, int) {});
    EXPECT_EQ(got, expected);
    EXPECT_EQ(moved.into_pool, 1);
    EXPECT_EQ(moved.sequences, staging_holds_it ? 2 : 1);
    EXPECT_EQ(moved.fallbacks, staging_holds_it ? 0 : 1);
  }
}

}  // namespace
}  // namespace msinfer::runtime
