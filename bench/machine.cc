#include "msinfer/bench/machine.h"

#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace msinfer::bench {
namespace {

using clock = std::chrono::steady_clock;

__attribute__((target("avx512f,avx512bf16"))) double bf16_loop(long iters) {
  __m512 acc[24];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  }
  float s = 0;
  for (auto& x : acc) s += _mm512_reduce_add_ps(x);
  return s;
}

double bf16_peak(int threads, long iters) {
  double sink = 0;
  auto t0 = clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += bf16_loop(iters);
  const double s = std::chrono::duration<double>(clock::now() - t0).count();
  if (sink == 42.0) std::abort();  // keep the result alive
  return threads * iters * 24.0 * 64.0 / s;
}

__attribute__((target("avx512f"))) float sum_range(const float* p, size_t n) {
  __m512 a[8];
  for (auto& x : a) x = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = _mm512_add_ps(a[j], _mm512_load_ps(p + i + 16 * j));
  }
  for (int j = 1; j < 8; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  float s = _mm512_reduce_add_ps(a[0]);
  for (; i < n; ++i) s += p[i];
  return s;
}

double read_bandwidth(const float* buf, size_t n, int threads, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    double sink = 0;
    auto t0 = clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t begin = n * t / nt, end = n * (t + 1) / nt;
      sink += sum_range(buf + (begin & ~size_t{15}), (end & ~size_t{15}) - (begin & ~size_t{15}));
    }
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (sink == 42.0) std::abort();
    best = std::max(best, n * sizeof(float) / s);
  }
  return best;
}

}  // namespace

Json MachineLimits::to_json() const {
  return Json{{"threads", threads},
              {"avx512_bf16", avx512_bf16},
              {"bf16_gflops_1_thread", bf16_flops_1t / 1e9},
              {"bf16_gflops", bf16_flops / 1e9},
              {"read_gb_s_1_thread", read_bw_1t / 1e9},
              {"read_gb_s", read_bw / 1e9}};
}

MachineLimits measure_machine(bool quick) {
  MachineLimits m;
  m.threads = omp_get_max_threads();
  __builtin_cpu_init();
  m.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  const long iters = quick ? 5000000 : 20000000;
  if (m.avx512_bf16) {
    bf16_peak(1, iters / 10);  // warm up (clock ramp)
    m.bf16_flops_1t = bf16_peak(1, iters);
    m.bf16_flops = bf16_peak(m.threads, iters);
  }
  const size_t n = (quick ? 64u : 256u) << 20;  // floats: 256 MiB or 1 GiB
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = 1.0f;  // first touch by the reading threads
  m.read_bw_1t = read_bandwidth(buf, n, 1, quick ? 2 : 4);
  m.read_bw = read_bandwidth(buf, n, m.threads, quick ? 2 : 4);
  std::free(buf);
  return m;
}

}  // namespace msinfer::bench
