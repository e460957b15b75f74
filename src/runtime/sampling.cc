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
  return ok_status();
}

void apply_penalties(float* logits, int64_t vocab, const SamplingParams& p,
                     const int32_t* generated, int64_t n) {
  if (p.frequency_penalty == 0.f && p.presence_penalty == 0.f) return;
  std::vector<int32_t> ids(generated, generated + n);
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

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (p.temperature == 0.f || p.top_k == 1) return static_cast<int32_t>(argmax(logits, vocab));
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) keep = p.top_k;
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  idx.resize(keep);
  std::vector<double> prob(keep);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    sum += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  }
  int64_t n = keep;
  if (p.top_p < 1.f) {
    double mass = 0;
    for (n = 0; n < keep;) {
      mass += prob[n++] / sum;
      if (mass >= p.top_p) break;
    }
    sum = std::accumulate(prob.begin(), prob.begin() + n, 0.0);
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng), acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += prob[i];
    if (r < acc) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace msinfer::runtime
