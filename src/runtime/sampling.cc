#include "msinfer/runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace msinfer::runtime {

Status SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return invalid_argument("temperature must be a finite number >= 0");
  }
  if (top_k < 0) return invalid_argument("top_k must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) return invalid_argument("top_p must be in (0, 1]");
  if (max_tokens < 1) return invalid_argument("max_tokens must be >= 1");
  for (float v : {frequency_penalty, presence_penalty}) {
    if (!(v >= -2 && v <= 2)) return invalid_argument("penalties must be in [-2, 2]");
  }
  if (logprobs < -1 || logprobs > 20) return invalid_argument("logprobs must be in 0..20");
  if (!(min_p >= 0 && min_p <= 1)) return invalid_argument("min_p must be in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return invalid_argument("repetition_penalty must be a finite number > 0");
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return invalid_argument("min_tokens must be in 0..max_tokens");
  }
  return ok_status();
}

bool has_penalties(const SamplingParams& p) {
  return p.frequency_penalty != 0.f || p.presence_penalty != 0.f || p.repetition_penalty != 1.f;
}

void apply_penalties(float* logits, int64_t vocab, const SamplingParams& p, const int32_t* prompt,
                     int64_t n_prompt, const int32_t* generated, int64_t n_generated) {
  if (p.repetition_penalty != 1.f) {
    // Each token once, whether it appears in the prompt, the output or both.
    std::vector<int32_t> seen(prompt, prompt + n_prompt);
    seen.insert(seen.end(), generated, generated + n_generated);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty == 0.f && p.presence_penalty == 0.f) return;
  std::vector<int32_t> ids(generated, generated + n_generated);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    if (ids[i] >= 0 && ids[i] < vocab) {
      logits[ids[i]] -= static_cast<float>(j - i) * p.frequency_penalty + p.presence_penalty;
    }
    i = j;
  }
}

bool suppress_stops(float* logits, int64_t vocab, const SamplingParams& p, const int64_t* eos,
                    int64_t n_eos, int64_t generated) {
  if (generated >= p.min_tokens) return false;
  bool changed = false;
  auto drop = [&](int64_t t) {
    if (t < 0 || t >= vocab) return;
    logits[t] = -std::numeric_limits<float>::infinity();
    changed = true;
  };
  for (int32_t t : p.stop_token_ids) drop(t);
  if (!p.ignore_eos) {
    for (int64_t i = 0; i < n_eos; ++i) drop(eos[i]);
  }
  return changed;
}

float token_logprob(const float* logits, int64_t vocab, int32_t token, int top,
                    std::vector<std::pair<int32_t, float>>* top_out) {
  const float mx = logits[argmax(logits, vocab)];
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  if (top_out != nullptr) {
    top_out->clear();
    const int64_t k = std::min<int64_t>(std::max(top, 0), vocab);
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) {
      top_out->emplace_back(idx[i], static_cast<float>(logits[idx[i]] - lse));
    }
  }
  return static_cast<float>(logits[token] - lse);
}

int64_t argmax(const float* x, int64_t n) {
  // std::max_element compares each element with the best so far through a
  // pointer the previous compare chose: a load on the critical path, ~12
  // cycles an element (17% of tiny-mixtral's greedy decode). Two passes
  // instead: the largest value over kLanes independent lanes (each compare
  // `v > m ? v : m` is one packed max at any vector width), then the first
  // index that holds it. NaNs never win; all NaN gives 0.
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  for (float& m : lane) m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  }
  for (; i < n; ++i) lane[0] = x[i] > lane[0] ? x[i] : lane[0];
  float m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (i = 0; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;
}

namespace {

// The tokens sample_token() draws from in idx[0, n): most likely first (ties
// to the lower id) when top_k or top_p cut, in id order when every token
// stays, with their weights exp((logit - max) / temperature) in
// w[0, n) (not normalised); returns n >= 1. Temperature > 0. idx and w are
// scratch that keeps its size from call to call (only [0, n) means
// anything): allocating and zeroing a vocabulary's worth of each per token
// was a third of a sampled step at 200k tokens.
int64_t candidates(const float* logits, int64_t vocab, const SamplingParams& p,
                   std::vector<int32_t>& idx, std::vector<double>& w) {
  const double mx = logits[argmax(logits, vocab)];
  const auto weight = [&](int32_t t) -> double {
    return std::exp((logits[t] - mx) / p.temperature);
  };
  if (static_cast<int64_t>(idx.size()) < vocab) idx.resize(static_cast<size_t>(vocab));
  int64_t size = 0;
  if (p.min_p > 0.f) {
    // min_p first (a cut relative to the largest probability, so top_k
    // before or after keeps the same tokens): usually few are left to sort.
    for (int32_t t = 0; t < static_cast<int32_t>(vocab); ++t) {
      if (weight(t) >= p.min_p) idx[size++] = t;
    }
    if (size == 0) idx[size++] = static_cast<int32_t>(argmax(logits, vocab));
  } else {
    std::iota(idx.begin(), idx.begin() + vocab, 0);
    size = vocab;
  }
  const auto first = idx.begin(), last = idx.begin() + size;
  const auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (p.top_k <= 0 && p.top_p >= 1.f) {
    // Every token stays a candidate: no order is needed, and sorting a
    // 200k vocabulary per token was most of a sampled step (82% of
    // tiny-gpt-oss's serve time). Tokens of weight 0 can never be drawn.
    if (static_cast<int64_t>(w.size()) < size) w.resize(static_cast<size_t>(size));
    int64_t n = 0;
    for (int64_t i = 0; i < size; ++i) {
      const double x = weight(idx[i]);
      if (x > 0) {
        idx[n] = idx[i];
        w[n++] = x;
      }
    }
    if (n == 0) {
      idx[0] = static_cast<int32_t>(argmax(logits, vocab));
      w[0] = 1;
      n = 1;
    }
    return n;
  }
  // top_k, else top_p: sort only as far as the cut can reach. For top_p
  // alone, the sorted prefix grows until it holds the mass (the total is
  // over every candidate, sorted or not).
  int64_t keep = p.top_k > 0 && p.top_k < size ? p.top_k : size;
  double total = 0;
  if (p.top_k <= 0) {
    for (int64_t i = 0; i < size; ++i) total += weight(idx[i]);
    keep = std::min<int64_t>(size, 256);
  }
  for (;;) {
    // A heap sort (partial_sort) is quick for a small prefix only; a large
    // one is a plain sort of everything.
    if (keep * 16 < size) {
      std::partial_sort(first, first + keep, last, by_logit);
    } else {
      std::sort(first, last, by_logit);
      if (p.top_k <= 0) keep = size;
    }
    if (p.top_k > 0 || keep == size) break;
    double mass = 0;  // as the cut below sums it
    for (int64_t i = 0; i < keep; ++i) mass += weight(idx[i]) / total;
    if (mass >= p.top_p) break;
    keep *= 16;
  }
  if (static_cast<int64_t>(w.size()) < keep) w.resize(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += w[i] = weight(idx[i]);
  if (p.top_k <= 0) sum = total;
  int64_t n = keep;
  if (p.top_p < 1.f) {
    double mass = 0;
    for (n = 0; n < keep;) {
      mass += w[n++] / sum;
      if (mass >= p.top_p) break;
    }
  }
  // Tokens that cannot be drawn (-infinity: suppressed) are not candidates,
  // so that rounding at the end of the draw cannot pick one.
  while (n > 1 && !(w[n - 1] > 0)) --n;
  return n;
}

}  // namespace

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (p.temperature == 0.f || p.top_k == 1) return static_cast<int32_t>(argmax(logits, vocab));
  // Per thread: the engine's step samples on one.
  thread_local std::vector<int32_t> idx;
  thread_local std::vector<double> w;
  const int64_t n = candidates(logits, vocab, p, idx, w);
  const double sum = std::accumulate(w.begin(), w.begin() + n, 0.0);
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng), acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += w[i];
    if (r < acc) return idx[i];
  }
  return idx[n - 1];
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingParams& p) {
  std::vector<double> out(vocab, 0.0);
  if (p.temperature == 0.f || p.top_k == 1) {
    out[argmax(logits, vocab)] = 1.0;
    return out;
  }
  std::vector<int32_t> idx;
  std::vector<double> w;
  const int64_t n = candidates(logits, vocab, p, idx, w);
  const double sum = std::accumulate(w.begin(), w.begin() + n, 0.0);
  for (int64_t i = 0; i < n; ++i) out[idx[i]] = w[i] / sum;
  return out;
}

}  // namespace msinfer::runtime
