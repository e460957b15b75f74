// Timing helper shared by the benchmarks (private to bench/).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace msinfer::bench::internal {

// The middle value (the upper one of an even count); `v` must not be empty.
inline double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Seconds per call of f over one round that repeats f for at least `seconds`.
template <typename F>
double round_seconds_per_call(F&& f, double seconds) {
  using clock = std::chrono::steady_clock;
  int64_t n = 0;
  const auto t0 = clock::now();
  double s = 0;
  do {
    f();
    ++n;
    s = std::chrono::duration<double>(clock::now() - t0).count();
  } while (s < seconds);
  return s / static_cast<double>(n);
}

// Seconds per call of f: one warm-up call, then `rounds` rounds that each repeat
// f for at least min_seconds / rounds; the best round counts.
template <typename F>
double seconds_per_call(F&& f, double min_seconds, int rounds = 3) {
  f();  // warm up (primitive creation, page faults)
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    best = std::min(best, round_seconds_per_call(f, min_seconds / rounds));
  }
  return best;
}

}  // namespace msinfer::bench::internal
