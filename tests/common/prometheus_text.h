// The server's /metrics answer read back in tests: the Prometheus text
// format's sample lines, each checked for its shape.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>

namespace msinfer::testing {

// "name{labels} value" per sample: value by "name{labels}".
inline std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  std::string line;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEinfaINF]+)$)");
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch s;
    EXPECT_TRUE(std::regex_match(line, s, sample)) << "not a sample line: " << line;
    if (s.size() == 4) m[s[1].str() + s[2].str()] = std::stod(s[3]);
  }
  return m;
}

// The first sample whose "name{labels}" starts with prefix, or -1.
inline double metric(const std::map<std::string, double>& m, const std::string& prefix) {
  for (const auto& [k, v] : m) {
    if (k.rfind(prefix, 0) == 0) return v;
  }
  return -1;
}

}  // namespace msinfer::testing
