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
  // OpenAI semantics: each generated token's logit is lowered by
  // count * frequency_penalty + (count > 0) * presence_penalty; in [-2, 2].
  float frequency_penalty = 0.f, presence_penalty = 0.f;
  // Log-probabilities to report with each token: -1 none, 0 the sampled
  // token's only, n the n most likely too (n <= 20).
  int logprobs = -1;

  Status validate() const;
};

// Applies the frequency and presence penalties for `generated` (the request's
// tokens so far, prompt excluded) to logits[vocab] in place.
void apply_penalties(float* logits, int64_t vocab, const SamplingParams& p,
                     const int32_t* generated, int64_t n);

// log softmax(logits)[token], and the `top` most likely (id, log-probability)
// pairs, most likely first (ties to the lower id).
float token_logprob(const float* logits, int64_t vocab, int32_t token, int top,
                    std::vector<std::pair<int32_t, float>>* top_out);

// The index of the largest of x[n], the first on ties (as std::max_element);
// NaNs are never chosen (all NaN, or n == 0: 0).
int64_t argmax(const float* x, int64_t n);

// Picks a token from logits[vocab]; `rng` is the request's own generator.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng);

}  // namespace msinfer::runtime
