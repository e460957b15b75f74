// Command-line flags of one subcommand, declared once with default, valid range,
// help and an optional environment variable. Precedence: flag > environment > default.
// Accepts "--name value" and "--name=value"; boolean flags take no value.
// Anything not starting with "--" is a positional argument.
//
// Values are read strictly: an integer is an optional '-' and decimal digits
// (no "0x10", "1.5", "+3" or spaces), parsed as 64 bits and checked against its
// range before anyone narrows it; an integer flag declared without a range
// accepts 32-bit values only. A number is decimal (no hex, inf or nan) and in
// its range. A flag given twice on the command line with different values is an
// error ("--gpu H20 --gpu H800"); the same value twice is accepted.
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
  // Integer in [INT32_MIN, INT32_MAX] (so a static_cast<int> never truncates).
  void add_int(const std::string& name, int64_t def, const std::string& help,
               const std::string& env = "");
  // Integer in [min_value, max_value] (inclusive; shown in --help).
  void add_int(const std::string& name, int64_t def, int64_t min_value, int64_t max_value,
               const std::string& help, const std::string& env = "");
  // Finite number (any).
  void add_double(const std::string& name, double def, const std::string& help,
                  const std::string& env = "");
  // Finite number in [min_value, max_value] (inclusive; shown in --help).
  void add_double(const std::string& name, double def, double min_value, double max_value,
                  const std::string& help, const std::string& env = "");
  // A switch: false unless given.
  void add_bool(const std::string& name, const std::string& help);
  // Text appended to --help (examples, notes).
  void set_epilog(std::string text) { epilog_ = std::move(text); }

  // Parses argv[first..argc). Unknown flags, missing values, malformed or
  // out-of-range numbers and conflicting repeats are INVALID_ARGUMENT errors that
  // name the flag (or its environment variable). "--help"/"-h" sets help_requested().
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
  // True when this command declares the flag (code shared by commands asks).
  bool declared(const std::string& name) const { return flags_.count(name) != 0; }
  // Where the value came from, for errors about what it names: "--catalog",
  // "MSINFER_CATALOG (environment)", or "--catalog (default)".
  std::string origin(const std::string& name) const;
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
    bool from_env = false;
    bool on_command_line = false;
    int64_t min_i = 0, max_i = 0;
    double min_d = 0, max_d = 0;
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
