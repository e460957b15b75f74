// `msinfer bench kernels`: this machine's limits, then the expert FFN (grouped
// SwiGLU GEMMs) over 1..1024 tokens per expert and decode attention over
// 128..4096 tokens of context, at the small-mixtral shapes, each against its
// roofline: time_roofline = max(FLOPs / compute peak, bytes / read bandwidth),
// with the AMX tiles' peak for bf16 GEMMs at the amx level, the bf16 peak for
// bf16 and int8 GEMMs where the level has vdpbf16ps and the fp32 FMA peak
// otherwise. Kernels run at the active CPU level (kernels/cpu/isa.h).
// mxfp4 weights (random e2m1 codes and scales, kept 4-bit: gemm.h) are
// measured on request, e.g. at gpt-oss-20b's shapes (hidden = expert_ffn =
// 2880) against bf16 in the same run; each row says the weight bytes one call
// reads.
#pragma once

#include <string>
#include <vector>

#include "msinfer/bench/machine.h"
#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/runtime/kv_cache.h"

namespace msinfer::bench {

struct KernelBenchOptions {
  int64_t hidden = 1024, expert_ffn = 2816;            // small-mixtral
  int64_t heads = 16, kv_heads = 4, head_dim = 64;
  int64_t decode_requests = 8;                         // decode tokens per attention call
  std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<kernels::cpu::WeightFormat> weights = {kernels::cpu::WeightFormat::kBf16,
                                                     kernels::cpu::WeightFormat::kInt8};
  std::vector<int64_t> contexts = {128, 256, 512, 1024, 2048, 4096};
  int64_t kv_block_size = runtime::KvCache::kDefaultBlockSize;  // token slots per KV block
  double min_seconds = 0.2;  // per measurement
  bool quick = false;
};

struct KernelBenchRow {
  std::string kernel;   // "expert_ffn" | "decode_attention"
  std::string weights;  // "bf16" | "int8" | "w8a8" | "mxfp4" (attention: the bf16 KV cache)
  int64_t tokens = 0;   // tokens per expert, or decode requests
  int64_t context = 0;  // attention only
  int64_t kv_block_size = 0;  // attention only: token slots per KV block
  double seconds = 0;   // per call
  double flops = 0, bytes = 0;
  double weight_bytes = 0;  // expert_ffn: packed weight bytes one call reads (scales included)
  double gflops() const { return flops / seconds / 1e9; }
  double gb_s() const { return bytes / seconds / 1e9; }
  double roofline_fraction = 0;
  std::string bound;    // "compute" | "memory"
  std::string peak;     // compute roof used: "amx" | "bf16" | "fp32"
};

struct KernelBenchResult {
  MachineLimits machine;
  std::vector<KernelBenchRow> rows;
  Json to_json() const;
};

// `progress` receives one line per measured row and after the machine probes
// (may be null): the whole run takes about a minute.
StatusOr<KernelBenchResult> bench_kernels(const KernelBenchOptions& o,
                                          void (*progress)(const std::string&) = nullptr);

}  // namespace msinfer::bench
