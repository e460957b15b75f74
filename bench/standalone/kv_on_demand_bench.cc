// Concurrency and throughput of the engine when clients ask for a large
// max_tokens but stop early (here: at stop tokens), the case on-demand KV
// blocks address. Built twice by scripts/bench-kv-on-demand: against this
// tree's engine and against the engine before on-demand blocks (from git), so
// both run the same workload side by side. Uses only the Engine calls both
// versions have (create, add, step, idle, running).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "msinfer/runtime/engine.h"

using namespace msinfer;

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: %s MODEL_DIR KV_MB REQUESTS PROMPT_LEN MAX_TOKENS STOP_ID[,STOP_ID]\n",
                 argv[0]);
    return 2;
  }
  auto w = model::ModelWeights::load(argv[1]);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().message().c_str());
    return 1;
  }
  runtime::EngineOptions o;
  o.kv_cache_bytes = std::atoll(argv[2]) << 20;
  auto e = runtime::Engine::create(std::move(w).value(), o);
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().message().c_str());
    return 1;
  }
  runtime::Engine& engine = **e;
  const int n = std::atoi(argv[3]), plen = std::atoi(argv[4]), max_tokens = std::atoi(argv[5]);
  std::vector<int32_t> stops;
  for (char* p = argv[6]; *p != '\0';) {
    stops.push_back(static_cast<int32_t>(std::strtol(p, &p, 10)));
    if (*p == ',') ++p;
  }
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int32_t> id(3, 258);
  for (int i = 0; i < n; ++i) {
    runtime::GenerationRequest r;
    r.id = i + 1;
    for (int t = 0; t < plen; ++t) r.prompt.push_back(id(rng));
    r.sampling.max_tokens = max_tokens;
    r.sampling.stop_token_ids = stops;
    Status s = engine.add(r);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0, steps = 0, max_running = 0, running_sum = 0;
  while (!engine.idle()) {
    auto ev = engine.step();
    if (!ev.ok()) return 1;
    tokens += static_cast<int64_t>(ev->size());
    ++steps;
    max_running = std::max<int64_t>(max_running, engine.running());
    running_sum += engine.running();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"requests\": %d, \"tokens\": %lld, \"seconds\": %.3f, \"tokens_per_s\": %.1f, \"steps\": "
      "%lld, "
      "\"max_running\": %lld, \"mean_running\": %.1f}\n",
      n, static_cast<long long>(tokens), s, tokens / s, static_cast<long long>(steps),
      static_cast<long long>(max_running), static_cast<double>(running_sum) / steps);
  return 0;
}
