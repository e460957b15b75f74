// Token sampling: greedy, temperature, top-k, top-p, seeded per request.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer::runtime {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy (argmax, ties to the lower id)
  int top_k = 0;            // 0: no limit
  float top_p = 1.f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;

  Status validate() const;
};

// Picks a token from logits[vocab]; `rng` is the request's own generator.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng);

}  // namespace msinfer::runtime
