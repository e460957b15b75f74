// JSON helpers over nlohmann::json (Debian nlohmann-json3-dev): reading files and
// typed fields with errors that name the file and the field path.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "msinfer/core/status.h"

namespace msinfer {

using Json = nlohmann::json;

// Parses `text`; `source` names it in errors ("plan.json").
StatusOr<Json> parse_json(std::string_view text, const std::string& source);
// Reads and parses a file; errors name the path.
StatusOr<Json> read_json_file(const std::string& path);
// Writes `j` (pretty, 2 spaces) to `path`.
Status write_json_file(const std::string& path, const Json& j);

// Typed access to the fields of one JSON object. `where` names the object in
// errors, e.g. "catalog.json: gpus[3] (A100)". Holds a reference: the json
// must outlive this view.
class JsonFields {
 public:
  JsonFields(const Json& object, std::string where) : j_(object), where_(std::move(where)) {}

  // Non-OK unless the viewed value is a JSON object.
  Status expect_object() const;
  bool has(const std::string& key) const;
  const std::string& where() const { return where_; }
  const Json& json() const { return j_; }

  // Required fields: missing or mistyped is an INVALID_ARGUMENT naming where.key.
  StatusOr<double> number(const std::string& key) const;
  StatusOr<int64_t> integer(const std::string& key) const;
  StatusOr<std::string> string(const std::string& key) const;
  StatusOr<bool> boolean(const std::string& key) const;
  StatusOr<JsonFields> object(const std::string& key) const;

  // Optional fields: `fallback` when missing (or null); mistyped is still an error.
  StatusOr<double> number_or(const std::string& key, double fallback) const;
  StatusOr<int64_t> integer_or(const std::string& key, int64_t fallback) const;
  StatusOr<std::string> string_or(const std::string& key, const std::string& fallback) const;
  StatusOr<bool> boolean_or(const std::string& key, bool fallback) const;

  // A required number > 0 (and finite).
  StatusOr<double> positive(const std::string& key) const;
  // A required integer >= min_value.
  StatusOr<int64_t> integer_at_least(const std::string& key, int64_t min_value) const;
  // A required number in [lo, hi] (finite), or with `lo_open` in (lo, hi].
  StatusOr<double> number_in(const std::string& key, double lo, double hi,
                             bool lo_open = false) const;
  // A required integer in [lo, hi].
  StatusOr<int64_t> integer_in(const std::string& key, int64_t lo, int64_t hi) const;

  // Error naming where.key, for callers' own range checks.
  Status field_error(const std::string& key, const std::string& what) const;

 private:
  const Json& j_;
  std::string where_;
};

}  // namespace msinfer
