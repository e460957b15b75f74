// What every msinfer command shares: one definition of how a failure is
// reported, checks of output paths before any work, figures that must be finite,
// progress lines on stderr, and the signal handling that removes this process's
// shared-memory objects.
//
// Exit codes (docs/ARCHITECTURE.md, tools/msinfer), everywhere: 0 success; 2 bad input (a flag,
// a file or its contents: INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE,
// UNIMPLEMENTED); 1 a failure at run time (anything else). A failure prints one
// line "msinfer CMD: message" on stderr; under --json stdout also carries
// {"error": {"message": ..., "code": "INVALID_ARGUMENT", "exit_code": 2}}.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "msinfer/core/flags.h"
#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::cli {

// 2 for bad input, 1 for a runtime failure (0 for OK).
int exit_code_for(const Status& s);

// Set once by main() when the command line has --json: errors also go to stdout
// as JSON.
void set_json_errors(bool on);
bool json_errors();

// Reports `s` (see above) and returns its exit code.
int report_error(const char* command, const Status& s);

// Every command's preamble: parses the words after the first `skip` ("msinfer
// CMD": 2, "msinfer bench serve": 3) into `flags`; with --help prints the
// usage; an argument that is not a flag is bad input. Returns the exit code
// when the command is done here (0 after the usage, 2 after an error), nullopt
// when it goes on.
std::optional<int> parse_command_line(FlagSet& flags, const char* command, int argc, char** argv,
                                      int skip);

// `text` with control bytes and invalid UTF-8 shown as \xNN, so a message that
// quotes a file's bytes never writes raw bytes to a terminal.
std::string printable(const std::string& text);

// Checks, before any expensive work, that `path` can be written: its directory
// exists and is writable, and the path is not a directory (nothing is created).
// `flag` names it in the error ("--out").
Status check_output_path(const std::string& flag, const std::string& path);

// Writes `text` to `path` and checks every step (open, write, close); a failure
// names the path.
Status write_text_file(const std::string& path, const std::string& text);

// Non-OK (INTERNAL) if any number in `j` is NaN or infinite, or negative where
// every figure must be >= 0 (`non_negative`), naming the field: the last guard
// that keeps a bad figure from being printed.
Status check_figures(const Json& j, bool non_negative, const std::string& what);

// Progress on stderr for long work: silent for the first `quiet_s` seconds,
// then at most one line every `every_s` seconds.
class Progress {
 public:
  Progress(std::string command, double quiet_s = 2.0, double every_s = 2.0);
  // Prints "msinfer COMMAND: <line>" if it is time to.
  void update(const std::string& line);

 private:
  std::string command_;
  std::chrono::steady_clock::time_point start_, last_;
  double quiet_s_, every_s_;
  bool printed_ = false;
};

// Opens /dev/null on each of fds 0, 1 and 2 that is closed, so that no file,
// socket or eventfd the process opens later takes the number of stdin,
// stdout or stderr (and gets printed into, or handed to workers as their
// output). main() calls it first.
void open_closed_standard_fds();

// OpenMP's idle threads spin for GOMP_SPINCOUNT iterations before they sleep,
// 300,000 by default: on a machine whose cores other work keeps busy (serve's
// own HTTP loop, other processes, a CI runner) a spinning thread holds a core
// the thread it waits for needs, and an engine step stretches from
// milliseconds to seconds (a tiny model's 3,000-token stream: 8 s alone, 154
// s beside two busy loops; 21 s at 10,000 spins, same speed alone). libgomp
// reads its environment when it is loaded, before main(): so for the commands
// that run kernels, when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set,
// this sets GOMP_SPINCOUNT to kernels::cpu::kOpenmpSpinCount and executes
// the binary again (same pid, same arguments). A failed exec leaves OpenMP's
// default.
void exec_again_with_bounded_openmp_spin(int argc, char** argv);

// Installs handlers for SIGINT, SIGTERM, SIGHUP and SIGQUIT that remove this
// process's and its children's msinfer shared-memory objects from /dev/shm
// (comm names them "msinfer-<pid>-<random>", comm/fabric_transport.h; whose
// they are is told by who holds their ".live" lock open, not by the pid,
// which another PID namespace may share) and then die of the same signal (as
// pid 1 of a PID namespace: exit 128 + signal). Async-signal-safe. Objects
// of a process killed by SIGKILL are removed by the next msinfer process that
// opens a transport (comm::remove_dead_shm_endpoints).
void install_shm_cleanup_on_signals();

}  // namespace msinfer::cli
