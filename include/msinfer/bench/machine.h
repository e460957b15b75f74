// Probes of this machine's limits, the denominators of every roofline figure
// msinfer reports: bf16 dot-product peak (AVX512-BF16 vdpbf16ps, 24 independent
// accumulators) and memory read bandwidth (streaming sum over 1 GiB), each with
// one thread and with every OpenMP thread.
#pragma once

#include "msinfer/core/json.h"

namespace msinfer::bench {

struct MachineLimits {
  int threads = 1;
  bool avx512_bf16 = false;
  double bf16_flops_1t = 0, bf16_flops = 0;  // FLOP/s (0 without AVX512-BF16)
  double read_bw_1t = 0, read_bw = 0;        // bytes/s
  Json to_json() const;
};

// Takes about a second (quick: a quarter of that).
MachineLimits measure_machine(bool quick = false);

}  // namespace msinfer::bench
