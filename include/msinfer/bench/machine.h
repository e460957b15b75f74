// Probes of this machine's limits, the denominators of every roofline figure
// msinfer reports, run with the instructions of the active CPU kernel level
// (kernels/cpu/isa.h): fp32 FMA peak (24 independent accumulators of the
// level's widest vector: zmm at avx512 and above, ymm at avx2, SSE mul+add at
// generic), bf16 dot-product peak (vdpbf16ps; avx512bf16 and amx only), the
// AMX tiles' bf16 peak (TDPBF16PS on four accumulator tiles; amx only) and
// memory read bandwidth (streaming sum over 1 GiB with the level's loads),
// each with one thread and with every OpenMP thread.
#pragma once

#include <string>

#include "msinfer/core/json.h"

namespace msinfer::bench {

struct MachineLimits {
  int threads = 1;
  std::string isa;    // the kernel level the probes (and kernels) ran at
  std::string cpu;    // model name from /proc/cpuinfo
  bool avx512_bf16 = false;                  // bf16 peak measured (level >= avx512bf16)
  double fp32_flops_1t = 0, fp32_flops = 0;  // FLOP/s
  double bf16_flops_1t = 0, bf16_flops = 0;  // FLOP/s (0 below avx512bf16)
  double amx_flops_1t = 0, amx_flops = 0;    // AMX tiles' bf16 FLOP/s (0 below amx)
  double read_bw_1t = 0, read_bw = 0;        // bytes/s
  Json to_json() const;
};

// Takes about a second (quick: a quarter of that).
MachineLimits measure_machine(bool quick = false);

// "AMD EPYC 9B45" from /proc/cpuinfo ("unknown" if absent).
std::string cpu_model_name();

}  // namespace msinfer::bench
