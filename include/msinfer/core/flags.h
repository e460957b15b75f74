// Command-line flags of one subcommand, declared once with default, help and an
// optional environment variable. Precedence: flag > environment > default.
// Accepts "--name value" and "--name=value"; boolean flags take no value.
// Anything not starting with "--" is a positional argument.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  void add_string(const std::string& name, const std::string& def, const std::string& help,
                  const std::string& env = "");
  void add_int(const std::string& name, int64_t def, const std::string& help,
               const std::string& env = "");
  void add_double(const std::string& name, double def, const std::string& help,
                  const std::string& env = "");
  // A switch: false unless given.
  void add_bool(const std::string& name, const std::string& help);
  // Text appended to --help (examples, notes).
  void set_epilog(std::string text) { epilog_ = std::move(text); }

  // Parses argv[first..argc). Unknown flags, missing values and malformed numbers
  // are errors that name the flag. "--help"/"-h" sets help_requested().
  Status parse(int argc, char** argv, int first = 1);
  // Same as parse() over a vector (tests).
  Status parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_; }
  std::string usage() const;

  const std::string& get_string(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  // True when given on the command line or through its environment variable.
  bool was_set(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    Kind kind;
    std::string help;
    std::string env;
    std::string text;  // current value as text
    int64_t i = 0;
    double d = 0;
    bool set = false;
  };
  Status assign(const std::string& name, Flag& f, const std::string& value,
                const std::string& origin);
  const Flag& find(const std::string& name, Kind kind) const;

  std::string command_;
  std::string summary_;
  std::string epilog_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace msinfer
