// SamplingParams' own checks, apart from the sampler (sampling.cc) that needs
// the CPU kernels: the server validates requests with this alone (and so does
// its fuzzer, fuzz/CMakeLists.txt, built without the kernels).
#include <cmath>

#include "msinfer/runtime/sampling.h"

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

}  // namespace msinfer::runtime
