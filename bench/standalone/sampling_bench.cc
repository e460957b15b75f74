// Time per token of the sampler (runtime::sample_token) over one row of
// logits, by vocabulary and sampling parameters: what every generated token
// of a request costs after the LM head. Logits are either flat (normal, sd 1:
// a random-weight model, nearly every token a candidate) or peaked (normal,
// sd 4: a trained model's spread, a few dozen tokens hold most of the mass).
// Prints one line per case: microseconds a token, best of 3 rounds.
//   sampling_bench [SECONDS_PER_CASE]      (default 0.3)
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "../internal/timing.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/runtime/sampling.h"

using namespace msinfer;

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.3;
  struct Case {
    const char* name;
    runtime::SamplingParams p;
  };
  const auto params = [](float t, int k, float top_p, float min_p) {
    runtime::SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
  };
  const std::vector<Case> cases = {
      {"greedy", params(0.f, 0, 1.f, 0.f)},
      {"temperature 1", params(1.f, 0, 1.f, 0.f)},
      {"temperature 0.7, top_p 0.9", params(0.7f, 0, 0.9f, 0.f)},
      {"temperature 1, top_k 50", params(1.f, 50, 1.f, 0.f)},
      {"temperature 1, min_p 0.05", params(1.f, 0, 1.f, 0.05f)},
  };
  std::printf("CPU kernels %s\n", kernels::cpu::isa_name(kernels::cpu::active_isa()));
  std::printf("%-9s %-7s %-28s %12s\n", "vocab", "logits", "sampling", "us/token");
  for (const int64_t vocab : {32000L, 129280L, 201088L}) {
    for (const double sd : {1.0, 4.0}) {
      std::mt19937_64 gen(7);
      std::normal_distribution<float> normal(0.f, static_cast<float>(sd));
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (float& x : logits) x = normal(gen);
      for (const Case& c : cases) {
        std::mt19937_64 rng(1);
        volatile int32_t sink = 0;
        const double s = bench::internal::seconds_per_call(
            [&] { sink = runtime::sample_token(logits.data(), vocab, c.p, rng); }, seconds);
        (void)sink;
        std::printf("%-9ld %-7s %-28s %12.1f\n", static_cast<long>(vocab),
                    sd == 1.0 ? "flat" : "peaked", c.name, s * 1e6);
      }
    }
  }
  return 0;
}
