// Runs a shell command and returns its stdout, for tests that compare with an
// independent implementation in another language.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace msinfer::testing {

// stdout of `cmd`, or "" when it could not start or exited non-zero.
inline std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

}  // namespace msinfer::testing
