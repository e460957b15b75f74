// Typed reading of the JSON documents the runtime exchanges (the control
// protocol, a worker's configuration) without exceptions: a field of the
// wrong type or range is an INVALID_ARGUMENT naming it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "line_io.h"
#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/runtime/placement.h"

namespace msinfer::runtime::internal {

// ---- typed reading of one JSON value, without exceptions ----

template <typename T>
bool read_value(const Json& v, T* out);
template <typename A, typename B>
bool read_value_compound(const Json& v, std::pair<A, B>* out);
template <typename T>
bool read_value_compound(const Json& v, std::vector<T>* out);

template <typename T>
bool read_integer(const Json& v, T* out) {
  if (!v.is_number_integer()) return false;
  if constexpr (std::is_unsigned_v<T>) {
    if (v.is_number_unsigned()) {
      const uint64_t x = v.get<uint64_t>();
      if (x > std::numeric_limits<T>::max()) return false;
      *out = static_cast<T>(x);
      return true;
    }
    const int64_t x = v.get<int64_t>();
    if (x < 0 || static_cast<uint64_t>(x) > std::numeric_limits<T>::max()) return false;
    *out = static_cast<T>(x);
    return true;
  } else {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) return false;
    const int64_t x = v.get<int64_t>();
    if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) return false;
    *out = static_cast<T>(x);
    return true;
  }
}

template <typename T>
bool read_value(const Json& v, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return false;
    *out = v.get<bool>();
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    return read_integer(v, out);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return false;
    *out = v.get<T>();
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return false;
    *out = v.get<std::string>();
    return true;
  } else if constexpr (std::is_same_v<T, Json>) {
    *out = v;
    return true;
  } else {
    return read_value_compound(v, out);
  }
}

template <typename A, typename B>
bool read_value_compound(const Json& v, std::pair<A, B>* out) {
  return v.is_array() && v.size() == 2 && read_value(v[0], &out->first) &&
         read_value(v[1], &out->second);
}

template <typename T>
bool read_value_compound(const Json& v, std::vector<T>* out) {
  if (!v.is_array()) return false;
  out->clear();
  out->reserve(v.size());
  for (const Json& x : v) {
    T t{};
    if (!read_value(x, &t)) return false;
    out->push_back(std::move(t));
  }
  return true;
}

// The fields of one message; the first error sticks, later reads do nothing.
class Fields {
 public:
  Fields(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}
  template <typename T>
  Fields& required(const char* key, T* out) {
    return read(key, out, /*optional=*/false);
  }
  template <typename T>
  Fields& optional(const char* key, T* out) {
    return read(key, out, /*optional=*/true);
  }
  Status status() const { return status_; }

 private:
  template <typename T>
  Fields& read(const char* key, T* out, bool optional) {
    if (!status_.ok()) return *this;
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (!optional) status_ = invalid_argument(where_ + ": field '" + key + "' is missing");
      return *this;
    }
    if (!read_value(*it, out)) {
      status_ =
          invalid_argument(where_ + ": field '" + key + "' has the wrong type or range: " +
                           it->dump(-1, ' ', false, Json::error_handler_t::replace).substr(0, 200));
    }
    return *this;
  }
  const Json& j_;
  std::string where_;
  Status status_ = ok_status();
};

inline std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Binary blobs (peer cards) travel as lowercase hex.
inline Status read_hex(Fields& f, const char* key, std::string* out, const std::string& where) {
  std::string hex;
  f.required(key, &hex);
  MSI_RETURN_IF_ERROR(f.status());
  if (!internal::from_hex(hex, out)) {
    return invalid_argument(where + ": field '" + key + "' is not hex");
  }
  return ok_status();
}

inline StatusOr<Placement> read_placement(const Json& j, const std::string& where) {
  auto it = j.find("placement");
  if (it == j.end() || !it->is_object()) {
    return invalid_argument(where + ": field 'placement' is missing or not an object");
  }
  auto ex = it->find("experts");
  const int experts = ex != it->end() && ex->is_array() ? static_cast<int>(ex->size()) : 0;
  return Placement::from_json(*it, experts, where + ": placement");
}

// Reads an enum field by its flag name with `parse` (name, where).
template <typename E, typename Parse>
Status read_enum(Fields& f, const char* key, E* out, const std::string& where, Parse parse) {
  std::string name;
  f.optional(key, &name);
  MSI_RETURN_IF_ERROR(f.status());
  if (name.empty()) return ok_status();
  auto e = parse(name, where + ": field '" + key + "'");
  if (!e.ok()) return e.status();
  *out = *e;
  return ok_status();
}

}  // namespace msinfer::runtime::internal
