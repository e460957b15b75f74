#include "internal/generated_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "msinfer/core/bf16.h"

namespace msinfer::model::internal {

namespace fs = std::filesystem;

std::vector<float> draw_values(int64_t n, double std, std::mt19937_64& rng,
                               std::normal_distribution<float>& normal) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = std < 0 ? 1.0f + 0.1f * normal(rng) : static_cast<float>(std) * normal(rng);
  }
  return v;
}

GeneratedTensor encode_tensor(const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<float>& v, DType dtype) {
  const size_t n = v.size();
  GeneratedTensor t{name, dtype, shape, std::vector<uint8_t>(dtype_size(dtype) * n)};
  for (size_t k = 0; k < n; ++k) {
    if (dtype == DType::kBF16) {
      const bf16 b = float_to_bf16(v[k]);
      std::memcpy(t.data.data() + 2 * k, &b, 2);
    } else if (dtype == DType::kF32) {
      std::memcpy(t.data.data() + 4 * k, &v[k], 4);
    } else {
      const uint16_t hb = float_to_f16(v[k]);
      std::memcpy(t.data.data() + 2 * k, &hb, 2);
    }
  }
  return t;
}

Status write_generated_weights(
    const std::string& dir, size_t count, int shards,
    const std::function<void(size_t, std::vector<GeneratedTensor>&)>& generate) {
  if (shards < 1 || shards > 64) return invalid_argument("--shards must be in 1..64");
  const size_t per_shard = (count + shards - 1) / shards;
  Json weight_map = Json::object();
  for (int s = 0; s < shards; ++s) {
    char file[64];
    if (shards == 1) {
      std::snprintf(file, sizeof(file), "model.safetensors");
    } else {
      std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, shards);
    }
    std::vector<GeneratedTensor> outs;
    for (size_t i = s * per_shard; i < std::min(count, (s + 1) * per_shard); ++i) {
      generate(i, outs);
    }
    std::stable_sort(outs.begin(), outs.end(),
                     [](const GeneratedTensor& a, const GeneratedTensor& b) {
                       return dtype_size(a.dtype) > dtype_size(b.dtype);
                     });
    std::vector<TensorToWrite> tensors;
    for (const GeneratedTensor& t : outs) {
      tensors.push_back({t.name, t.dtype, t.shape, t.data.data()});
      weight_map[t.name] = file;
    }
    MSI_RETURN_IF_ERROR(
        write_safetensors((fs::path(dir) / file).string(), tensors, {{"format", "pt"}}));
  }
  if (shards > 1) {
    MSI_RETURN_IF_ERROR(
        write_json_file((fs::path(dir) / "model.safetensors.index.json").string(),
                        Json{{"metadata", Json::object()}, {"weight_map", weight_map}}));
  }
  return ok_status();
}

Status write_model_files(const std::string& dir, const Json& config, const Json& tokenizer,
                         const Json& tokenizer_config, const Json& generation_config) {
  const fs::path d(dir);
  MSI_RETURN_IF_ERROR(write_json_file((d / "config.json").string(), config));
  MSI_RETURN_IF_ERROR(write_json_file((d / "tokenizer.json").string(), tokenizer));
  MSI_RETURN_IF_ERROR(write_json_file((d / "tokenizer_config.json").string(), tokenizer_config));
  return write_json_file((d / "generation_config.json").string(), generation_config);
}

}  // namespace msinfer::model::internal
