#include "msinfer/runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "msinfer/kernels/cpu/ops.h"

namespace msinfer::runtime {

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

int64_t argmax(const float* x, int64_t n) { return kernels::cpu::argmax(x, n); }

namespace {

// Scratch of sample_token() and sampling_distribution(), per thread, kept
// from call to call (only the part a call fills means anything): allocating
// and zeroing a vocabulary's worth of each per token was a third of a
// sampled step at 200k tokens.
struct Scratch {
  std::vector<float> all;      // every token's weight
  std::vector<int32_t> idx;    // the candidates' ids
  std::vector<float> w;        // and their weights
  std::vector<double> mass;    // top_p: the weight in each bucket
  std::vector<int32_t> edge;   // and the tokens of the bucket the cut falls in
  std::vector<double> blocks;  // the draw's block sums
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The tokens sample_token() draws from: ids idx[0, n) (null: every token,
// ids 0..n) with their weights w[0, n) (not normalised); n >= 1. Most
// likely first (ties to the lower id) after a top_k cut; otherwise in id
// order, except that a top_p cut puts the tokens of the bucket it falls in
// last, most likely first (the order does not change the distribution).
struct Candidates {
  const int32_t* idx;
  const float* w;
  int64_t n;
};

bool by_logit(const float* logits, int32_t a, int32_t b) {
  return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

// top_p without top_k over the candidates: ids src_idx[0, size) (null:
// every token, ids 0..size) with weights src_w (= all[id]) that sum to
// `total`. Writes the smallest set of the most likely whose mass reaches
// top_p of the total (the token that reaches it included, vLLM's rule) to
// idx/w (which may be src_idx/src_w: it writes behind where it reads) and
// returns how many, without sorting them. Weights are in [0, 1] (the largest
// is exp(0)), and a positive float's bits grow with its value: bucketed by
// exponent and the top 6 bits of the mantissa (steps of at most 2^(1/64)),
// the buckets are summed from the top until the next would reach the mass;
// only that bucket's tokens are sorted, and taken until it is reached.
// Sorting a flat 200k-token distribution whole took 25 ms a token.
int64_t nucleus(const float* logits, const float* all, float top_p, double total,
                const int32_t* src_idx, const float* src_w, int64_t size, int32_t* idx, float* w,
                Scratch& s) {
  constexpr uint32_t kBuckets = 8192;  // 1.0f is bucket 127 << 6 = 8128
  const auto bucket = [](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return std::min(bits >> 17, kBuckets - 1);
  };
  std::vector<double>& mass = s.mass;
  mass.assign(kBuckets, 0.0);
  for (int64_t i = 0; i < size; ++i) mass[bucket(src_w[i])] += src_w[i];
  const double target = static_cast<double>(top_p) * total;
  double above = 0;
  uint32_t cut = kBuckets - 1;
  for (; cut > 0 && above + mass[cut] < target; --cut) above += mass[cut];
  int64_t n = 0;
  std::vector<int32_t>& edge = s.edge;
  edge.clear();
  for (int64_t i = 0; i < size; ++i) {
    const float x = src_w[i];
    const uint32_t b = bucket(x);
    const int32_t t = src_idx ? src_idx[i] : static_cast<int32_t>(i);
    if (b > cut) {
      idx[n] = t;
      w[n++] = x;
    } else if (b == cut && x > 0) {
      edge.push_back(t);
    }
  }
  std::sort(edge.begin(), edge.end(), [&](int32_t a, int32_t b) { return by_logit(logits, a, b); });
  double mass_so_far = above;
  for (const int32_t t : edge) {
    if (n > 0 && mass_so_far >= target) break;
    idx[n] = t;
    w[n++] = all[t];
    mass_so_far += all[t];
  }
  return n;
}

// idx/w with room for a vocabulary of candidates.
void reserve_candidates(Scratch& s, int64_t vocab) {
  if (static_cast<int64_t>(s.idx.size()) < vocab) {
    s.idx.resize(static_cast<size_t>(vocab));
    s.w.resize(static_cast<size_t>(vocab));
  }
}

// Orders idx[0, size) so that its first `keep` are the most likely, in
// order (ties to the lower id): a heap sort is quick for a small prefix
// only; a large one is a plain sort of everything.
void most_likely_first(const float* logits, int32_t* idx, int64_t size, int64_t keep) {
  const auto order = [&](int32_t a, int32_t b) { return by_logit(logits, a, b); };
  if (keep * 16 < size) {
    std::partial_sort(idx, idx + keep, idx + size, order);
  } else {
    std::sort(idx, idx + size, order);
  }
}

// The argmax alone, weight 1: where no token has a positive weight.
Candidates argmax_only(const float* logits, int64_t vocab, Scratch& s) {
  s.idx.assign(1, static_cast<int32_t>(argmax(logits, vocab)));
  s.w.assign(1, 1.f);
  return {s.idx.data(), s.w.data(), 1};
}

// top_k without min_p: the k most likely by logit (a heap sort; the
// weights of those k alone).
Candidates top_k_only(const float* logits, int64_t vocab, const SamplingParams& p, Scratch& s) {
  reserve_candidates(s, vocab);
  int32_t* idx = s.idx.data();
  float* w = s.w.data();
  std::iota(idx, idx + vocab, 0);
  const int64_t keep = std::min<int64_t>(p.top_k, vocab);
  most_likely_first(logits, idx, vocab, keep);
  const float mx = logits[idx[0]], scale = 1.0f / p.temperature;
  int64_t size = 0;
  for (; size < keep; ++size) {
    w[size] = std::exp((logits[idx[size]] - mx) * scale);
    if (!(w[size] > 0)) break;  // weight 0 (suppressed): no candidate, nor any after it
  }
  if (size == 0) {
    w[0] = 1.f;
    return {idx, w, 1};
  }
  return {idx, w, size};
}

Candidates candidates(const float* logits, int64_t vocab, const SamplingParams& p, Scratch& s) {
  if (p.top_k > 0 && p.min_p <= 0.f && p.top_p >= 1.f) return top_k_only(logits, vocab, p, s);
  const float mx = logits[argmax(logits, vocab)];
  if (static_cast<int64_t>(s.all.size()) < vocab) s.all.resize(static_cast<size_t>(vocab));
  float* all = s.all.data();
  const double everything = kernels::cpu::exp_scaled(logits, vocab, mx, 1.0f / p.temperature, all);
  if (p.top_k <= 0 && p.top_p >= 1.f && p.min_p <= 0.f) {
    // Every token stays: no order is needed, and sorting a 200k vocabulary
    // per token was most of a sampled step (82% of tiny-gpt-oss's serve
    // time). Tokens of weight 0 are never drawn.
    return everything > 0 ? Candidates{nullptr, all, vocab} : argmax_only(logits, vocab, s);
  }
  reserve_candidates(s, vocab);
  int32_t* idx = s.idx.data();
  float* w = s.w.data();
  if (p.top_k <= 0 && p.min_p <= 0.f) {
    // top_p alone (< 1 here) over every token: no copy of them first.
    const int64_t n = nucleus(logits, all, p.top_p, everything, nullptr, all, vocab, idx, w, s);
    return n > 0 ? Candidates{idx, w, n} : argmax_only(logits, vocab, s);
  }
  // min_p first (a cut relative to the largest probability, so top_k before
  // or after keeps the same tokens); tokens of weight 0 are no candidates.
  const float floor = p.min_p;
  int64_t size = 0;
  for (int32_t t = 0; t < static_cast<int32_t>(vocab); ++t) {
    if (all[t] > 0 && all[t] >= floor) {
      idx[size] = t;
      w[size++] = all[t];
    }
  }
  double total = everything;  // without min_p the candidates hold every positive weight
  if (floor > 0) total = std::accumulate(w, w + size, 0.0);
  if (size == 0) return argmax_only(logits, vocab, s);
  if (p.top_k <= 0) {
    // top_p alone, or min_p's candidates are the answer.
    if (p.top_p >= 1.f) return {idx, w, size};
    return {idx, w, nucleus(logits, all, p.top_p, total, idx, w, size, idx, w, s)};
  }
  // top_k: sort only the k most likely.
  const int64_t keep = p.top_k < size ? p.top_k : size;
  most_likely_first(logits, idx, size, keep);
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += w[i] = all[idx[i]];
  int64_t n = keep;
  if (p.top_p < 1.f) {
    // top_p over the top_k, renormalised.
    double mass = 0;
    for (n = 0; n < keep;) {
      mass += w[n++] / sum;
      if (mass >= p.top_p) break;
    }
  }
  return {idx, w, n};
}

// The index in [0, n) where the running sum of w first exceeds r, r uniform
// in [0, sum w): block sums of 256 weights first (8 lanes: the compiler
// vectorises them), then that block's running sum. Rounding can carry r
// past a block's end (block and running sums round differently); the scan
// then goes on into the next, and past the end it is the last token of
// positive weight.
int64_t draw(const float* w, int64_t n, std::mt19937_64& rng, std::vector<double>& blocks) {
  constexpr int64_t kBlock = 256, kLanes = 8;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  if (static_cast<int64_t>(blocks.size()) < nb) blocks.resize(static_cast<size_t>(nb));
  double total = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    float lane[kLanes] = {};
    int64_t i = lo;
    for (; i + kLanes <= hi; i += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += w[i + l];
    }
    double sum = 0;
    for (; i < hi; ++i) sum += w[i];
    for (float x : lane) sum += x;
    total += blocks[b] = sum;
  }
  std::uniform_real_distribution<double> u(0.0, total);
  const double r = u(rng);
  double acc = 0;
  int64_t b = 0;
  while (b + 1 < nb && acc + blocks[b] <= r) acc += blocks[b++];
  int64_t last = -1;
  for (int64_t i = b * kBlock; i < n; ++i) {
    if (!(w[i] > 0)) continue;
    acc += w[i];
    last = i;
    if (r < acc) return i;
  }
  if (last >= 0) return last;
  // Rounding carried r past every positive weight of the blocks after b:
  // the last one before them.
  for (int64_t i = b * kBlock - 1; i >= 0; --i) {
    if (w[i] > 0) return i;
  }
  return 0;
}

}  // namespace

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (p.temperature == 0.f || p.top_k == 1) return static_cast<int32_t>(argmax(logits, vocab));
  Scratch& s = scratch();
  const Candidates c = candidates(logits, vocab, p, s);
  const int64_t i = draw(c.w, c.n, rng, s.blocks);
  return c.idx ? c.idx[i] : static_cast<int32_t>(i);
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingParams& p) {
  std::vector<double> out(vocab, 0.0);
  if (p.temperature == 0.f || p.top_k == 1) {
    out[argmax(logits, vocab)] = 1.0;
    return out;
  }
  Scratch& s = scratch();
  const Candidates c = candidates(logits, vocab, p, s);
  double sum = 0;
  for (int64_t i = 0; i < c.n; ++i) sum += c.w[i];
  for (int64_t i = 0; i < c.n; ++i) out[c.idx ? c.idx[i] : i] += c.w[i] / sum;
  return out;
}

}  // namespace msinfer::runtime
