#include "msinfer/core/json.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace msinfer {

StatusOr<Json> parse_json(std::string_view text, const std::string& source) {
  // nlohmann reports some malformed input (a number too large for a double) by
  // throwing even with allow_exceptions = false, so catch every json exception.
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return invalid_argument(source + ": not valid JSON (" + e.what() + ")");
  }
}

StatusOr<Json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open file");
  // A regular file is read into one string of its size (a 27 MB
  // tokenizer.json through a growing stringstream was copied several times);
  // what has no size (a pipe) is read to its end.
  std::string text;
  std::error_code ec;
  const uintmax_t size =
      std::filesystem::is_regular_file(path, ec) && !ec ? std::filesystem::file_size(path, ec) : 0;
  if (!ec && size > 0) {
    text.resize(size);
    in.read(text.data(), static_cast<std::streamsize>(size));
    if (static_cast<uintmax_t>(in.gcount()) != size) return invalid_argument(path + ": read error");
  } else {
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return invalid_argument(path + ": read error");
    text = std::move(ss).str();
  }
  return parse_json(text, path);
}

Status write_json_file(const std::string& path, const Json& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return not_found(path + ": cannot open for writing");
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return internal_error(path + ": write failed");
  return ok_status();
}

Status JsonFields::expect_object() const {
  if (!j_.is_object()) return invalid_argument(where_ + ": expected a JSON object");
  return ok_status();
}

bool JsonFields::has(const std::string& key) const {
  return j_.is_object() && j_.contains(key) && !j_.at(key).is_null();
}

Status JsonFields::field_error(const std::string& key, const std::string& what) const {
  return invalid_argument(where_ + ": field '" + key + "' " + what);
}

StatusOr<double> JsonFields::number(const std::string& key) const {
  if (!has(key)) return field_error(key, "is missing");
  const Json& v = j_.at(key);
  if (!v.is_number()) return field_error(key, "must be a number, got " + v.dump());
  double d = v.get<double>();
  if (!std::isfinite(d)) return field_error(key, "must be finite");
  return d;
}

StatusOr<int64_t> JsonFields::integer(const std::string& key) const {
  if (!has(key)) return field_error(key, "is missing");
  const Json& v = j_.at(key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return field_error(key, "is too large, got " + v.dump());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      return static_cast<int64_t>(d);
    }
  }
  return field_error(key, "must be an integer, got " + v.dump());
}

StatusOr<std::string> JsonFields::string(const std::string& key) const {
  if (!has(key)) return field_error(key, "is missing");
  const Json& v = j_.at(key);
  if (!v.is_string()) return field_error(key, "must be a string, got " + v.dump());
  return v.get<std::string>();
}

StatusOr<bool> JsonFields::boolean(const std::string& key) const {
  if (!has(key)) return field_error(key, "is missing");
  const Json& v = j_.at(key);
  if (!v.is_boolean()) return field_error(key, "must be true or false, got " + v.dump());
  return v.get<bool>();
}

StatusOr<JsonFields> JsonFields::object(const std::string& key) const {
  if (!has(key)) return field_error(key, "is missing");
  const Json& v = j_.at(key);
  if (!v.is_object()) return field_error(key, "must be an object");
  return JsonFields(v, where_ + "." + key);
}

StatusOr<double> JsonFields::number_or(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  return number(key);
}

StatusOr<int64_t> JsonFields::integer_or(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  return integer(key);
}

StatusOr<std::string> JsonFields::string_or(const std::string& key,
                                            const std::string& fallback) const {
  if (!has(key)) return fallback;
  return string(key);
}

StatusOr<bool> JsonFields::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  return boolean(key);
}

StatusOr<double> JsonFields::positive(const std::string& key) const {
  MSI_ASSIGN_OR_RETURN(double v, number(key));
  if (!(v > 0)) return field_error(key, "must be > 0, got " + Json(v).dump());
  return v;
}

StatusOr<int64_t> JsonFields::integer_at_least(const std::string& key, int64_t min_value) const {
  MSI_ASSIGN_OR_RETURN(int64_t v, integer(key));
  if (v < min_value) {
    return field_error(key, "must be >= " + std::to_string(min_value) + ", got " +
                                std::to_string(v));
  }
  return v;
}

StatusOr<double> JsonFields::number_in(const std::string& key, double lo, double hi,
                                       bool lo_open) const {
  MSI_ASSIGN_OR_RETURN(double v, number(key));
  if ((lo_open ? !(v > lo) : !(v >= lo)) || !(v <= hi)) {
    auto g = [](double x) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", x);
      return std::string(buf);
    };
    return field_error(key, std::string("must be in ") + (lo_open ? "(" : "[") + g(lo) + ", " +
                                g(hi) + "], got " + g(v));
  }
  return v;
}

StatusOr<int64_t> JsonFields::integer_in(const std::string& key, int64_t lo, int64_t hi) const {
  MSI_ASSIGN_OR_RETURN(int64_t v, integer(key));
  if (v < lo || v > hi) {
    return field_error(key, "must be in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                ", got " + std::to_string(v));
  }
  return v;
}

}  // namespace msinfer
