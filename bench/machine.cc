#include "msinfer/bench/machine.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "msinfer/kernels/cpu/isa.h"

namespace msinfer::bench {
namespace {

using clock = std::chrono::steady_clock;
using kernels::cpu::IsaLevel;

// The sum of v's lanes. (GCC 12's _mm512_reduce_add_ps warns, from its own
// header, that an undefined register is used uninitialized: gcc bug 105593.)
__attribute__((target("avx512f"))) float lanes_sum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (float x : t) s += x;
  return s;
}

// Each probe is compiled for its level with a target attribute and called only
// when the active level includes it (the same dispatch as the kernels).

__attribute__((target("avx512f,avx512bf16"))) double bf16_loop(long iters) {
  __m512 acc[24];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  }
  float s = 0;
  for (auto& x : acc) s += lanes_sum(x);
  return s;
}

// AMX: four 16x16 fp32 accumulator tiles, each += a 16x32 bf16 tile times a
// 32x16 one (in pairs) per iteration: 4 x 16 x 16 x 32 x 2 FLOPs. Tile
// registers only, so the level check (tests/kernels/check_level_code.sh) has
// nothing to see; the process has AMX permission wherever the amx level is
// active (kernels/cpu/isa.cc).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) double amx_loop(long iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  for (uint16_t& x : a) x = 0x3f80;  // 1.0
  for (uint16_t& x : b) x = 0x3c00;  // 2^-7: the sums stay small
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[4][16 * 16];
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  _tile_release();
  double s = 0;
  for (const auto& t : c) s += t[0] + t[255];
  return s;
}

__attribute__((target("avx512f"))) double fma512_loop(long iters) {
  __m512 acc[24];
  for (int j = 0; j < 24; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  float s = 0;
  for (auto& x : acc) s += lanes_sum(x);
  return s;
}

__attribute__((target("avx2,fma"))) double fma256_loop(long iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  float s = 0;
  for (auto& x : acc) {
    float t[8];
    _mm256_storeu_ps(t, x);
    for (float v : t) s += v;
  }
  return s;
}

// SSE2 (every x86-64): a multiply and an add per lane, counted as 2 FLOPs.
double sse_loop(long iters) {
  __m128 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm_set1_ps(static_cast<float>(j));
  const __m128 a = _mm_set1_ps(0.999f), b = _mm_set1_ps(1e-3f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], a), b);
  }
  float s = 0;
  for (auto& x : acc) {
    float t[4];
    _mm_storeu_ps(t, x);
    for (float v : t) s += v;
  }
  return s;
}

// FLOPs per loop iteration of each probe.
struct PeakProbe {
  double (*loop)(long);
  double flops_per_iter;
};

PeakProbe fp32_probe(IsaLevel level) {
  if (level >= IsaLevel::kAvx512) return {fma512_loop, 24.0 * 32};
  if (level >= IsaLevel::kAvx2) return {fma256_loop, 12.0 * 16};
  return {sse_loop, 12.0 * 8};
}

double peak(const PeakProbe& p, int threads, long iters) {
  double sink = 0;
  auto t0 = clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += p.loop(iters);
  const double s = std::chrono::duration<double>(clock::now() - t0).count();
  if (sink == 42.0) std::abort();  // keep the result alive
  return threads * iters * p.flops_per_iter / s;
}

__attribute__((target("avx512f"))) float sum512(const float* p, size_t n) {
  __m512 a[8];
  for (auto& x : a) x = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = _mm512_add_ps(a[j], _mm512_load_ps(p + i + 16 * j));
  }
  for (int j = 1; j < 8; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  float s = lanes_sum(a[0]);
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx2"))) float sum256(const float* p, size_t n) {
  __m256 a[8];
  for (auto& x : a) x = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_load_ps(p + i + 8 * j));
  }
  for (int j = 1; j < 8; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  float t[8];
  _mm256_storeu_ps(t, a[0]);
  float s = 0;
  for (float v : t) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

float sum128(const float* p, size_t n) {
  __m128 a[8];
  for (auto& x : a) x = _mm_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = _mm_add_ps(a[j], _mm_load_ps(p + i + 4 * j));
  }
  for (int j = 1; j < 8; ++j) a[0] = _mm_add_ps(a[0], a[j]);
  float t[4];
  _mm_storeu_ps(t, a[0]);
  float s = t[0] + t[1] + t[2] + t[3];
  for (; i < n; ++i) s += p[i];
  return s;
}

double read_bandwidth(float (*sum)(const float*, size_t), const float* buf, size_t n, int threads,
                      int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    double sink = 0;
    auto t0 = clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t begin = n * t / nt, end = n * (t + 1) / nt;
      sink += sum(buf + (begin & ~size_t{15}), (end & ~size_t{15}) - (begin & ~size_t{15}));
    }
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (sink == 42.0) std::abort();
    best = std::max(best, n * sizeof(float) / s);
  }
  return best;
}

}  // namespace

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

Json MachineLimits::to_json() const {
  return Json{{"threads", threads},
              {"isa", isa},
              {"cpu", cpu},
              {"avx512_bf16", avx512_bf16},
              {"fp32_gflops_1_thread", fp32_flops_1t / 1e9},
              {"fp32_gflops", fp32_flops / 1e9},
              {"bf16_gflops_1_thread", bf16_flops_1t / 1e9},
              {"bf16_gflops", bf16_flops / 1e9},
              {"amx_bf16_gflops_1_thread", amx_flops_1t / 1e9},
              {"amx_bf16_gflops", amx_flops / 1e9},
              {"read_gb_s_1_thread", read_bw_1t / 1e9},
              {"read_gb_s", read_bw / 1e9}};
}

MachineLimits measure_machine(bool quick) {
  MachineLimits m;
  m.threads = omp_get_max_threads();
  const IsaLevel level = kernels::cpu::active_isa();
  m.isa = kernels::cpu::isa_name(level);
  m.cpu = cpu_model_name();
  // Iterations per probe: a fixed count (a native core runs it in 10-80 ms),
  // cut to what takes `seconds` only where a first short run says the count
  // would take over 20 times that (an emulated CPU: under qemu-user the full
  // counts took minutes, tests/kernels/foreign_cpu_test.sh).
  const long full = quick ? 5000000 : 20000000;
  const double seconds = quick ? 0.05 : 0.2;
  auto iters_for = [&](const PeakProbe& p, long n) {
    const long probe = std::max(1L, n / 100);
    const auto t0 = clock::now();
    peak(p, 1, probe);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    const double per_iter = s / static_cast<double>(probe);
    return per_iter * static_cast<double>(n) > 20 * seconds
               ? std::max(probe, static_cast<long>(seconds / per_iter))
               : n;
  };
  const PeakProbe fp32 = fp32_probe(level);
  const long iters = iters_for(fp32, full);
  peak(fp32, 1, iters / 10);  // warm up (clock ramp)
  m.fp32_flops_1t = peak(fp32, 1, iters);
  m.fp32_flops = peak(fp32, m.threads, iters);
  m.avx512_bf16 = level >= IsaLevel::kAvx512Bf16;
  if (m.avx512_bf16) {
    const PeakProbe bf16{bf16_loop, 24.0 * 64};
    const long n = iters_for(bf16, full);
    m.bf16_flops_1t = peak(bf16, 1, n);
    m.bf16_flops = peak(bf16, m.threads, n);
  }
  if (level >= IsaLevel::kAmx) {
    // One AMX iteration is 64x the work of a vdpbf16ps one.
    const PeakProbe amx{amx_loop, 4.0 * 16 * 16 * 32 * 2};
    const long n = iters_for(amx, full / 64);
    m.amx_flops_1t = peak(amx, 1, n);
    m.amx_flops = peak(amx, m.threads, n);
  }
  float (*sum)(const float*, size_t) =
      level >= IsaLevel::kAvx512 ? sum512 : level >= IsaLevel::kAvx2 ? sum256 : sum128;
  const size_t n = (quick ? 64u : 256u) << 20;  // floats: 256 MiB or 1 GiB
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = 1.0f;  // first touch by the reading threads
  m.read_bw_1t = read_bandwidth(sum, buf, n, 1, quick ? 2 : 4);
  m.read_bw = read_bandwidth(sum, buf, n, m.threads, quick ? 2 : 4);
  std::free(buf);
  return m;
}

}  // namespace msinfer::bench
