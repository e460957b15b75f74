#include "msinfer/core/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace msinfer {

void FlagSet::add_string(const std::string& name, const std::string& def,
                         const std::string& help, const std::string& env) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  flags_[name] = Flag{Kind::kString, help, env, def};
  order_.push_back(name);
}

void FlagSet::add_int(const std::string& name, int64_t def, const std::string& help,
                      const std::string& env) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  Flag f{Kind::kInt, help, env, std::to_string(def)};
  f.i = def;
  flags_[name] = f;
  order_.push_back(name);
}

void FlagSet::add_double(const std::string& name, double def, const std::string& help,
                         const std::string& env) {
  MSI_CHECK(!flags_.count(name)) << "flag declared twice: " << name;
  std::ostringstream ss;
  ss << def;
  Flag f{Kind::kDouble, help, env, ss.str()};
  f.d = def;
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
  f.text = value;
  f.set = true;
  if (f.kind == Kind::kInt) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0) {
      return invalid_argument(origin + ": expected an integer, got '" + value + "'");
    }
    f.i = v;
  } else if (f.kind == Kind::kDouble) {
    errno = 0;
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) {
      return invalid_argument(origin + ": expected a number, got '" + value + "'");
    }
    f.d = v;
  }
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
      f.set = true;
      f.text = value.value_or("true");
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) return invalid_argument("--" + name + ": missing value");
      value = args[++i];
    }
    MSI_RETURN_IF_ERROR(assign(name, f, *value, "--" + name));
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
    out << f.help;
    if (f.kind != Kind::kBool && !f.text.empty()) out << " (default " << f.text << ")";
    if (!f.env.empty()) out << " [env " << f.env << "]";
    out << "\n";
  }
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

}  // namespace msinfer
