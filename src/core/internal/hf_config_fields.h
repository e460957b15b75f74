// What the HF config.json reader (hf_config.cc) shares with
// ModelConfig::from_json (model_config.cc): private to src/core.
#pragma once

#include <cstdint>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/model_config.h"
#include "msinfer/core/status.h"

namespace msinfer::hf_config {

// The integer field `key` (>= min_value and at most 2^30), as an int.
StatusOr<int> get_int(const JsonFields& f, const std::string& key, int64_t min_value = 1);

// The DeepSeek-V2/V3 fields beyond the shapes: layer pattern, routing, YaRN,
// FP8 quantisation. Every error names the field.
Status parse_deepseek(const JsonFields& f, ModelConfig& m);

}  // namespace msinfer::hf_config
