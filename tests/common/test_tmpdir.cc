// Linked into every test executable (tests/CMakeLists.txt, msinfer_test_main):
// gives the process a private temporary directory and removes it when the
// process exits, so that the files tests write (models, plans, stderr
// captures) do not pile up in /tmp run after run.
//
// ::testing::TempDir() returns $TEST_TMPDIR on Linux, read at each call; this
// sets TEST_TMPDIR before main() to a fresh directory made under the one it
// names (or /tmp). Worker processes the tests start inherit it. Only the
// process that made the directory removes it: a forked child that calls exit()
// (a death test, a pre-exec failure) leaves it to its parent.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

pid_t g_owner = 0;
std::string g_dir;

void remove_dir() {
  if (g_dir.empty() || ::getpid() != g_owner) return;
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

bool make_dir() {
  const char* parent = std::getenv("TEST_TMPDIR");
  if (parent == nullptr || parent[0] == '\0') parent = std::getenv("TMPDIR");
  std::string pattern = (parent != nullptr && parent[0] != '\0') ? parent : "/tmp";
  pattern += "/msinfer-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("msinfer tests: mkdtemp");
    return false;  // TempDir() stays as it was
  }
  g_dir = pattern;
  g_owner = ::getpid();
  ::setenv("TEST_TMPDIR", g_dir.c_str(), 1);
  std::atexit(remove_dir);
  return true;
}

const bool kMade = make_dir();

}  // namespace
