#include "msinfer/core/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace msinfer {
namespace {

std::string number_text(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

// "-12" or "12": an optional minus and decimal digits only.
bool integer_syntax(const std::string& s) {
  size_t i = s.size() > 1 && s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

// Decimal notation only: digits, one sign, '.', and an exponent; no hex, inf,
// nan or spaces (strtod would take all of those).
bool number_syntax(const std::string& s) {
  if (s.empty()) return false;
  bool digit = false;
  for (char c : s) {
    if (c >= '0' && c <= '9')
      digit = true;
    else if (c != '-' && c != '+' && c != '.' && c != 'e' && c != 'E')
      return false;
  }
  return digit;
}

}  // namespace

void FlagSet::add_string(const std::string& name, const std::string& def,
                         const std::string& help, const std::string& env) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  flags_[name] = Flag{Kind::kString, help, env, def};
  order_.push_back(name);
}

void FlagSet::add_int(const std::string& name, int64_t def, const std::string& help,
                      const std::string& env) {
  add_int(name, def, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), help,
          env);
}

void FlagSet::add_int(const std::string& name, int64_t def, int64_t min_value, int64_t max_value,
                      const std::string& help, const std::string& env) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  MSI_CHECK(min_value <= def && def <= max_value) << "default of --" << name << " out of range";
  Flag f{Kind::kInt, help, env, std::to_string(def)};
  f.i = def;
  f.min_i = min_value;
  f.max_i = max_value;
  flags_[name] = f;
  order_.push_back(name);
}

void FlagSet::add_double(const std::string& name, double def, const std::string& help,
                         const std::string& env) {
  add_double(name, def, -std::numeric_limits<double>::max(), std::numeric_limits<double>::max(),
             help, env);
}

void FlagSet::add_double(const std::string& name, double def, double min_value, double max_value,
                         const std::string& help, const std::string& env) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  MSI_CHECK(min_value <= def && def <= max_value) << "default of --" << name << " out of range";
  Flag f{Kind::kDouble, help, env, number_text(def)};
  f.d = def;
  f.min_d = min_value;
  f.max_d = max_value;
  flags_[name] = f;
  order_.push_back(name);
}

void FlagSet::add_bool(const std::string& name, const std::string& help) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  flags_[name] = Flag{Kind::kBool, help, "", "false"};
  order_.push_back(name);
}

Status FlagSet::assign(const std::string& name, Flag& f, const std::string& value,
                       const std::string& origin) {
  (void)name;
  if (f.kind == Kind::kInt) {
    errno = 0;
    char* end = nullptr;
    const long long v = integer_syntax(value) ? std::strtoll(value.c_str(), &end, 10) : 0;
    const bool range_known = f.min_i != std::numeric_limits<int32_t>::min() ||
                             f.max_i != std::numeric_limits<int32_t>::max();
    const std::string range = std::to_string(f.min_i) + ".." + std::to_string(f.max_i);
    if (!integer_syntax(value)) {
      return invalid_argument(origin + ": expected an integer, got '" + value + "'" +
                              (range_known ? " (valid: " + range + ")" : ""));
    }
    if (errno == ERANGE || v < f.min_i || v > f.max_i) {
      return invalid_argument(origin + ": " + value + " is out of range (valid: " + range + ")");
    }
    f.i = v;
  } else if (f.kind == Kind::kDouble) {
    errno = 0;
    char* end = nullptr;
    const double v = number_syntax(value) ? std::strtod(value.c_str(), &end) : 0;
    if (!number_syntax(value) || *end != '\0' || !std::isfinite(v)) {
      return invalid_argument(origin + ": expected a number, got '" + value + "'");
    }
    if (v < f.min_d || v > f.max_d) {
      return invalid_argument(origin + ": " + value + " is out of range (valid: " +
                              number_text(f.min_d) + " .. " + number_text(f.max_d) + ")");
    }
    f.d = v;
  }
  f.text = value;
  f.set = true;
  return ok_status();
}

Status FlagSet::parse(int argc, char** argv, int first) {
  std::vector<std::string> args;
  for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
  return parse(args);
}

Status FlagSet::parse(const std::vector<std::string>& args) {
  // Environment first, so that command-line flags override it.
  for (auto& [name, f] : flags_) {
    if (f.env.empty()) continue;
    if (const char* v = std::getenv(f.env.c_str())) {
      MSI_RETURN_IF_ERROR(assign(name, f, v, f.env + " (environment, for --" + name + ")"));
      f.from_env = true;
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return invalid_argument("unknown flag --" + name + " for '" + command_ +
                              "' (see msinfer " + command_ + " --help)");
    }
    Flag& f = it->second;
    if (f.kind == Kind::kBool) {
      if (value && *value != "true" && *value != "false") {
        return invalid_argument("--" + name + ": expected true or false, got '" + *value + "'");
      }
      value = value.value_or("true");
    } else if (!value) {
      if (i + 1 >= args.size()) return invalid_argument("--" + name + ": missing value");
      value = args[++i];
    }
    if (f.on_command_line) {
      if (*value != f.text) {
        return invalid_argument("--" + name + " given twice with different values ('" + f.text +
                                "' and '" + *value + "')");
      }
      continue;
    }
    if (f.kind == Kind::kBool) {
      f.text = *value;
      f.set = true;
    } else {
      MSI_RETURN_IF_ERROR(assign(name, f, *value, "--" + name));
    }
    f.on_command_line = true;
    f.from_env = false;
  }
  return ok_status();
}

std::string FlagSet::usage() const {
  std::ostringstream out;
  out << "usage: msinfer " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = "  --" + name;
    if (f.kind != Kind::kBool) left += " " + std::string(f.kind == Kind::kString ? "S" : "N");
    out << left;
    if (left.size() < 28) out << std::string(28 - left.size(), ' ');
    else out << "\n" << std::string(28, ' ');
    // A help text of several lines stays in the description column.
    for (char c : f.help) {
      out << c;
      if (c == '\n') out << std::string(28, ' ');
    }
    if (f.kind != Kind::kBool && !f.text.empty()) out << " (default " << f.text;
    if (f.kind == Kind::kInt && (f.min_i != std::numeric_limits<int32_t>::min() ||
                                 f.max_i != std::numeric_limits<int32_t>::max())) {
      out << ", " << f.min_i << ".." << f.max_i;
    }
    if (f.kind == Kind::kDouble && (f.min_d != -std::numeric_limits<double>::max() ||
                                    f.max_d != std::numeric_limits<double>::max())) {
      out << ", " << number_text(f.min_d) << " .. " << number_text(f.max_d);
    }
    if (f.kind != Kind::kBool && !f.text.empty()) out << ")";
    if (!f.env.empty()) out << " [env " << f.env << "]";
    out << "\n";
  }
  out << "\nA flag given twice must have the same value both times.\n";
  if (!epilog_.empty()) out << "\n" << epilog_ << "\n";
  return out.str();
}

const FlagSet::Flag& FlagSet::find(const std::string& name, Kind kind) const {
  auto it = flags_.find(name);
  MSI_CHECK(it != flags_.end()) << "undeclared flag " << name;
  MSI_CHECK(it->second.kind == kind) << "flag " << name << " read with the wrong type";
  return it->second;
}

const std::string& FlagSet::get_string(const std::string& name) const {
  return find(name, Kind::kString).text;
}
int64_t FlagSet::get_int(const std::string& name) const { return find(name, Kind::kInt).i; }
double FlagSet::get_double(const std::string& name) const {
  return find(name, Kind::kDouble).d;
}
bool FlagSet::get_bool(const std::string& name) const {
  return find(name, Kind::kBool).text == "true";
}
bool FlagSet::was_set(const std::string& name) const {
  auto it = flags_.find(name);
  MSI_CHECK(it != flags_.end()) << "undeclared flag " << name;
  return it->second.set;
}

std::string FlagSet::origin(const std::string& name) const {
  auto it = flags_.find(name);
  MSI_CHECK(it != flags_.end()) << "undeclared flag " << name;
  if (it->second.from_env) return it->second.env + " (environment)";
  if (it->second.on_command_line) return "--" + name;
  return "--" + name + " (default)";
}

}  // namespace msinfer
