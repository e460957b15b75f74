// Runs a shell command and returns its stdout, for tests that compare with an
// independent implementation in another language.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "shm_objects.h"

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

// What a command-line run of the msinfer binary gave: its exit code (-1 when
// it did not exit normally), stdout and stderr.
struct CliRun {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `binary args` through the shell, as a user would.
inline CliRun run_cli(const std::string& binary, const std::string& args) {
  // Per process: ctest runs a file's tests as parallel processes.
  const std::string err_path =
      ::testing::TempDir() + "/cli_stderr_" + std::to_string(::getpid()) + ".txt";
  const std::string cmd = binary + " " + args + " 2>" + err_path;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  r.err.assign(std::istreambuf_iterator<char>(err), {});
  std::remove(err_path.c_str());
  return r;
}

// A deployment's router run as a child process (argv[0] is the binary), its
// stdout discarded and its stderr read line by line until it exits. The
// workers' pid lines fill `pids`: "<role> worker <i>: pid <p>" as
// "<role><i>" (e.g. "attention1"), "<role> worker <i> tp rank <r>: pid <p>"
// as "<role><i>.<r>" (e.g. "expert1.1"). `on_line` sees every line once its
// pid (if any) is recorded, with the pids so far: tests kill or stop a worker
// from there.
struct RouterRun {
  std::string stderr_text;  // everything the router and its workers wrote
  int status = 0;           // from waitpid
  std::map<std::string, pid_t> pids;
};

inline RouterRun watch_router(
    const std::vector<std::string>& argv,
    const std::function<void(const char* line, const std::map<std::string, pid_t>& pids)>&
        on_line) {
  RouterRun run;
  int err[2];
  if (::pipe(err) != 0) return run;
  const pid_t router = ::fork();
  if (router == 0) {
    ::dup2(err[1], 2);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(err[1]);
  FILE* f = ::fdopen(err[0], "r");
  char line[4096];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    run.stderr_text += line;
    int idx = 0, rank = 0, pid = 0;
    char role[32];
    if (std::sscanf(line, "%31s worker %d tp rank %d: pid %d", role, &idx, &rank, &pid) == 4) {
      run.pids[std::string(role) + std::to_string(idx) + "." + std::to_string(rank)] = pid;
    } else if (std::sscanf(line, "%31s worker %d: pid %d", role, &idx, &pid) == 3) {
      run.pids[std::string(role) + std::to_string(idx)] = pid;
    }
    on_line(line, run.pids);
  }
  std::fclose(f);
  ::waitpid(router, &run.status, 0);
  return run;
}

// After a router run that stopped its deployment: every worker it named has
// exited (reaped by the router, or gone); with `no_shm`, none left a /dev/shm
// object behind either (a 16 MiB shm endpoint must not outlive its process).
inline void expect_workers_gone(const std::map<std::string, pid_t>& pids, bool no_shm) {
  for (const auto& [name, pid] : pids) {
    EXPECT_FALSE(::kill(pid, 0) == 0) << name << " is still running";
    if (!no_shm) continue;
    for (const auto& left : shm_objects_of(pid)) ADD_FAILURE() << name << " left /dev/shm/" << left;
  }
}

}  // namespace msinfer::testing
