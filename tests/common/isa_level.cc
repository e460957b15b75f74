// Linked into the tests that CMake registers once per CPU kernel level
// (ENVIRONMENT MSINFER_ISA=<level>): skips the whole run when this CPU cannot
// run the level, so a Zen 3 machine reports the avx512 runs as skipped rather
// than quietly repeating avx2.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "msinfer/kernels/cpu/isa.h"

namespace {

class IsaLevelEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    namespace k = msinfer::kernels::cpu;
    auto want = k::isa_from_env();
    if (!want.ok()) return;  // not a per-level run
    if (!k::isa_supported(*want)) {
      // gtest 1.12 reports a skip in a global environment as a pass; ctest
      // marks this run skipped from the line and the exit code instead.
      // exit(), not _Exit(): test_tmpdir.cc removes its directory at exit.
      std::printf("[  SKIPPED ] MSINFER_ISA=%s: this CPU runs at most %s\n", k::isa_name(*want),
                  k::isa_name(k::detected_isa()));
      std::fflush(stdout);
      std::exit(77);
    }
    ASSERT_EQ(k::active_isa(), *want);
  }
};

const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new IsaLevelEnvironment);

}  // namespace
