// `msinfer bench kernels --device cuda[:N]` (builds with the CUDA backend): the
// GPU's measured limits (dense bf16 GEMM rate through cuBLASLt at 8192^3,
// device-to-device copy bandwidth), then each of the backend's kernels against
// them: the experts' grouped SwiGLU GEMMs at large batch against the bf16 rate,
// the expert FFN and decode attention at small batch against the bandwidth,
// the dense projections at decode sizes. Shapes are Mixtral-8x7B's (hidden
// 4096, expert FFN 14336, 8 experts, 32 query / 8 KV heads of 128).
#pragma once

#include <functional>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::bench {

struct CudaKernelBenchOptions {
  std::string device = "cuda";
  bool quick = false;
};

// One JSON object: {"device", "limits": {...}, "rows": [{kernel, shape, seconds,
// tflops, gb_s, fraction, of}]}; progress lines go to `progress`.
StatusOr<Json> bench_cuda_kernels(const CudaKernelBenchOptions& o,
                                  const std::function<void(const std::string&)>& progress);

}  // namespace msinfer::bench
