// Token sampling: greedy, temperature, top-k, top-p, min-p, seeded per
// request; the penalties (OpenAI's frequency/presence, vLLM's repetition) and
// vLLM's min_tokens applied to the logits first.
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
  // vLLM's min_p in [0, 1]: tokens less likely than min_p times the most
  // likely one (after the temperature) are dropped. 0: off.
  float min_p = 0.f;
  uint64_t seed = 0;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // OpenAI semantics: each generated token's logit is lowered by
  // count * frequency_penalty + (count > 0) * presence_penalty; in [-2, 2].
  float frequency_penalty = 0.f, presence_penalty = 0.f;
  // vLLM's repetition_penalty, > 0 (1: off): the logit of every token that
  // appears in the prompt or the output is divided by it where positive,
  // multiplied by it where negative. Applied before the two above.
  float repetition_penalty = 1.f;
  // vLLM's min_tokens: until this many tokens are generated, EOS (unless
  // ignore_eos) and stop_token_ids cannot be sampled. 0..max_tokens.
  int min_tokens = 0;
  // Log-probabilities to report with each token: -1 none, 0 the sampled
  // token's only, n the n most likely too (n <= 20).
  int logprobs = -1;

  Status validate() const;
};

// Whether apply_penalties() changes anything for `p`.
bool has_penalties(const SamplingParams& p);

// Applies the penalties to logits[vocab] in place, as vLLM does: first the
// repetition penalty over every token of prompt[n_prompt] and
// generated[n_generated], then the frequency and presence penalties for
// `generated` alone (the request's tokens so far). Ids outside the vocabulary
// are skipped.
void apply_penalties(float* logits, int64_t vocab, const SamplingParams& p, const int32_t* prompt,
                     int64_t n_prompt, const int32_t* generated, int64_t n_generated);

// min_tokens: while `generated` < p.min_tokens, sets the logits of the
// stop_token_ids and (unless p.ignore_eos) of `eos[n_eos]` to -infinity.
// True if it changed anything.
bool suppress_stops(float* logits, int64_t vocab, const SamplingParams& p, const int64_t* eos,
                    int64_t n_eos, int64_t generated);

// log softmax(logits)[token], and the `top` most likely (id, log-probability)
// pairs, most likely first (ties to the lower id).
float token_logprob(const float* logits, int64_t vocab, int32_t token, int top,
                    std::vector<std::pair<int32_t, float>>* top_out);

// The index of the largest of x[n], the first on ties (as std::max_element);
// NaNs are never chosen (all NaN, or n == 0: 0). The active CPU level's
// kernel (kernels::cpu::argmax).
int64_t argmax(const float* x, int64_t n);

// Picks a token from logits[vocab]; `rng` is the request's own generator.
// Greedy (temperature 0 or top_k 1): the argmax. Otherwise the distribution
// of sampling_distribution().
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng);

// The probabilities sample_token() draws from (temperature > 0), in vLLM's
// order: softmax(logits / temperature); tokens below min_p times the largest
// probability dropped; the top_k most likely kept (ties to the lower id); the
// smallest prefix of those, most likely first, whose mass (renormalised)
// reaches top_p kept; renormalised. For tests: sample_token() uses the same
// candidates without filling a vector of the vocabulary's size.
std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingParams& p);

}  // namespace msinfer::runtime
