// libFuzzer target for the flag parser: the input is an argv, arguments
// separated by NUL bytes. Run by fuzz/run.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "msinfer/core/flags.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back().push_back(static_cast<char>(data[i]));
  }
  msinfer::FlagSet f("fuzz", "fuzz target");
  f.add_string("model", "", "model");
  f.add_int("plain", 0, "32-bit integer");
  f.add_int("ranged", 4, 1, 64, "ranged integer");
  f.add_int("seed", 0, 0, INT64_MAX, "64-bit integer");
  f.add_double("number", 1.5, "number");
  f.add_double("fraction", 0.5, 0, 1, "ranged number");
  f.add_bool("json", "switch");
  msinfer::Status s = f.parse(args);
  if (s.ok()) {
    // Whatever was accepted is in range.
    if (f.get_int("ranged") < 1 || f.get_int("ranged") > 64) __builtin_trap();
    if (f.get_int("plain") < INT32_MIN || f.get_int("plain") > INT32_MAX) __builtin_trap();
    if (!(f.get_double("fraction") >= 0 && f.get_double("fraction") <= 1)) __builtin_trap();
    (void)f.get_string("model");
    (void)f.get_bool("json");
    (void)f.origin("seed");
  }
  (void)f.usage();
  return 0;
}
