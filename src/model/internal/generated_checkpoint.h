// Writing the random checkpoints of make-model: one writer for every preset
// family (make_model.cc, make_model_deepseek.cc, make_model_gpt_oss.cc).
// Values are generated tensor by tensor in one order, whatever the sharding,
// so a checkpoint's values do not depend on --shards.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/model/safetensors.h"

namespace msinfer::model::internal {

// One tensor of a shard, its bytes owned.
struct GeneratedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// The number of values of a tensor of `shape`.
inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// n values drawn from `normal`: std > 0 N(0, std^2); std < 0 a norm weight
// 1 + N(0, 0.1^2).
std::vector<float> draw_values(int64_t n, double std, std::mt19937_64& rng,
                               std::normal_distribution<float>& normal);

// `v` as a tensor of `dtype` (bf16, f16 or f32).
GeneratedTensor encode_tensor(const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<float>& v, DType dtype);

// Writes `count` specs into `shards` files in `dir` (model.safetensors, or
// model-0000i-of-0000n.safetensors and the index): spec i's tensors are what
// `generate(i, out)` appends, called for i = 0..count-1 in order. Within a
// file the widest dtype comes first, so that every tensor's data stays
// aligned to its element size (as the safetensors library does).
Status write_generated_weights(
    const std::string& dir, size_t count, int shards,
    const std::function<void(size_t, std::vector<GeneratedTensor>&)>& generate);

// config.json, tokenizer.json, tokenizer_config.json and generation_config.json.
Status write_model_files(const std::string& dir, const Json& config, const Json& tokenizer,
                         const Json& tokenizer_config, const Json& generation_config);

}  // namespace msinfer::model::internal
