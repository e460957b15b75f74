// KV blocks a long request holds when sliding-window layers keep only their
// window (KvCache "Layer groups"), and how many such requests the engine
// admits together into a fixed KV budget, against the same checkpoint with
// every layer full attention. The checkpoint has small-gpt-oss's KV shape (8
// layers, sliding and full in turn, 4 KV heads of 64, a 128-token window:
// 1 KiB of K and V per token and layer) with 4 query heads, hidden and expert
// width 256 and 16384 positions, so an 8k prefill takes minutes on 2 cores,
// not hours; both are written under OUT_DIR by make_model. The real Engine
// runs, on each: one request of PROMPT_LEN prompt tokens,
// greedy, until AT positions are in its cache (blocks in use read then; the
// prefix cache is off, so a released block is a free one); then REQUESTS
// requests of AT - 128 prompt tokens and 128 new ones each are added to a
// fresh engine and its first step admits what fits (the count read after it).
// Prints one JSON object.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "msinfer/core/json.h"
#include "msinfer/model/make_model.h"
#include "msinfer/runtime/engine.h"

using namespace msinfer;

namespace {

StatusOr<std::unique_ptr<runtime::Engine>> make_engine(const char* dir, int64_t kv_mb) {
  MSI_ASSIGN_OR_RETURN(auto w, model::ModelWeights::load(dir));
  runtime::EngineOptions o;
  o.kv_cache_bytes = kv_mb << 20;
  o.prefix_caching = false;
  return runtime::Engine::create(std::move(w), o);
}

std::vector<int32_t> random_prompt(int64_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, std::max(4, vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = id(rng);
  return p;
}

// The measurement on one checkpoint; prints its JSON object.
int measure(const std::string& dir, int64_t kv_mb, int64_t plen, int64_t at, int requests) {
  auto e = make_engine(dir.c_str(), kv_mb);
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().to_string().c_str());
    return 1;
  }
  runtime::Engine& engine = **e;
  const runtime::KvCache& kv = engine.kv_cache();
  runtime::GenerationRequest r;
  r.id = 1;
  r.prompt = random_prompt(plen, engine.config().vocab, 1);
  r.sampling.max_tokens = at - plen + 2;
  r.sampling.ignore_eos = true;
  if (Status s = engine.add(r); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0, held_at = -1, max_held = 0;
  while (!engine.idle()) {
    auto ev = engine.step();
    if (!ev.ok()) {
      std::fprintf(stderr, "%s\n", ev.status().to_string().c_str());
      return 1;
    }
    generated += static_cast<int64_t>(ev->size());
    if (engine.idle()) break;
    const int64_t used = kv.total_blocks() - kv.free_blocks();
    max_held = std::max(max_held, used);
    if (generated > 0 && plen + generated - 1 == at) held_at = used;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  auto e2 = make_engine(dir.c_str(), kv_mb);
  if (!e2.ok()) return 1;
  runtime::Engine& many = **e2;
  for (int i = 0; i < requests; ++i) {
    runtime::GenerationRequest q;
    q.id = i + 1;
    q.prompt = random_prompt(at - 128, many.config().vocab, 100 + static_cast<uint64_t>(i));
    q.sampling.max_tokens = 128;
    q.sampling.ignore_eos = true;
    if (Status s = many.add(q); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 1;
    }
  }
  if (!many.step().ok()) return 1;
  std::printf(
      "{\"model\": \"%s\", \"kv_cache_mb\": %lld, \"layer_groups\": %d, \"block_size\": %lld, "
      "\"block_bytes\": %lld, \"total_blocks\": %lld, \"prompt_len\": %lld, \"at\": %lld, "
      "\"blocks_held_at\": %lld, \"bytes_held_at\": %lld, \"max_blocks_held\": %lld, "
      "\"seconds\": %.1f, \"requests\": %d, \"admitted_at_first_step\": %lld}\n",
      dir.c_str(), static_cast<long long>(kv_mb), kv.groups(),
      static_cast<long long>(kv.block_size()), static_cast<long long>(kv.block_bytes()),
      static_cast<long long>(kv.total_blocks()), static_cast<long long>(plen),
      static_cast<long long>(at), static_cast<long long>(held_at),
      static_cast<long long>(held_at * kv.block_bytes()), static_cast<long long>(max_held), secs,
      requests, static_cast<long long>(many.running()));
  std::fflush(stdout);
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s OUT_DIR KV_MB PROMPT_LEN AT REQUESTS\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int64_t kv_mb = std::atoll(argv[2]), plen = std::atoll(argv[3]), at = std::atoll(argv[4]);
  const int requests = std::atoi(argv[5]);
  Json full_layers = Json::array();
  for (int i = 0; i < 8; ++i) full_layers.push_back("full_attention");
  for (const bool sliding : {true, false}) {
    const std::string dir = out + (sliding ? "/windowed" : "/full-attention");
    if (!std::filesystem::exists(dir + "/config.json")) {
      model::MakeModelOptions o;
      o.preset = "small-gpt-oss";
      o.out_dir = dir;
      o.seed = 3;
      o.config_overrides = Json{{"hidden_size", 256},
                                {"intermediate_size", 256},
                                {"num_attention_heads", 4},
                                {"num_key_value_heads", 4},
                                {"max_position_embeddings", 16384}};
      if (!sliding) o.config_overrides["layer_types"] = full_layers;
      if (Status s = model::make_model(o); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.to_string().c_str());
        return 1;
      }
    }
    if (int rc = measure(dir, kv_mb, plen, at, requests); rc != 0) return rc;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
