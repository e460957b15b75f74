// Shared by the JSON document fuzz targets: the input as JSON text, parsed the
// way msinfer reads a file (parse_json), or nothing when it is not JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "msinfer/core/json.h"

namespace msinfer::fuzz {

inline std::optional<Json> parse(const uint8_t* data, size_t size) {
  auto j = parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (!j.ok()) return std::nullopt;
  return std::move(j).value();
}

}  // namespace msinfer::fuzz
