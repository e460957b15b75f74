#include "cli_common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "msinfer/kernels/cpu/threads.h"

namespace msinfer::cli {
namespace {

bool g_json_errors = false;

}  // namespace

int exit_code_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented:
      return 2;
    default:
      return 1;
  }
}

void set_json_errors(bool on) { g_json_errors = on; }
bool json_errors() { return g_json_errors; }

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02X", c);
    out += buf;
  };
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        hex(c);
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (no overlong forms, no surrogates) passes.
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char d = s[i + k];
      ok = k == 1 ? d >= lo && d <= hi : d >= 0x80 && d <= 0xBF;
    }
    if (!ok) {
      hex(c);
      ++i;
      continue;
    }
    out.append(text, i, len);
    i += len;
  }
  return out;
}

std::optional<int> parse_command_line(FlagSet& flags, const char* command, int argc, char** argv,
                                      int skip) {
  if (Status s = flags.parse(argc, argv, skip); !s.ok()) return report_error(command, s);
  if (flags.help_requested()) {
    std::cout << flags.usage();
    return 0;
  }
  if (!flags.positional().empty()) {
    return report_error(command, invalid_argument("unexpected argument '" +
                                                  printable(flags.positional().front()) + "'"));
  }
  return std::nullopt;
}

int report_error(const char* command, const Status& s) {
  const std::string message = printable(s.message());
  const int code = exit_code_for(s);
  std::fflush(stdout);
  std::fprintf(stderr, "msinfer%s%s: %s\n", *command ? " " : "", command, message.c_str());
  if (g_json_errors) {
    Json j{{"error",
            {{"message", message}, {"code", status_code_name(s.code())}, {"exit_code", code}}}};
    std::cout << j.dump(2) << std::endl;
  }
  return code;
}

Status check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return invalid_argument(flag + ": empty path");
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return invalid_argument(flag + " " + path + ": is a directory");
  fs::path dir = p.parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    return not_found(flag + " " + path + ": directory " + dir.string() + " does not exist");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return invalid_argument(flag + " " + path + ": cannot write into " + dir.string() + " (" +
                            std::strerror(errno) + ")");
  }
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0) {
    return invalid_argument(flag + " " + path + ": not writable (" + std::strerror(errno) + ")");
  }
  return ok_status();
}

Status write_text_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr)
    return not_found(path + ": cannot open for writing (" + std::strerror(errno) + ")");
  const size_t n = std::fwrite(text.data(), 1, text.size(), f);
  const int werr = n == text.size() ? 0 : errno;
  const bool flushed = std::fflush(f) == 0;
  const int ferr = flushed ? 0 : errno;
  const bool closed = std::fclose(f) == 0;
  if (n != text.size() || !flushed || !closed) {
    const int e = werr ? werr : ferr ? ferr : errno;
    return internal_error(path + ": write failed (" + std::strerror(e) + ")");
  }
  return ok_status();
}

namespace {

Status walk_figures(const Json& j, bool non_negative, const std::string& path) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      MSI_RETURN_IF_ERROR(walk_figures(v, non_negative, path.empty() ? k : path + "." + k));
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      MSI_RETURN_IF_ERROR(walk_figures(j[i], non_negative, path + "[" + std::to_string(i) + "]"));
    }
  } else if (j.is_number_float()) {
    const double v = j.get<double>();
    if (!std::isfinite(v)) return internal_error(path + " is not a finite number");
    if (non_negative && v < 0) return internal_error(path + " is negative (" + j.dump() + ")");
  } else if (j.is_number_integer() && non_negative && j.get<int64_t>() < 0) {
    return internal_error(path + " is negative (" + j.dump() + ")");
  }
  return ok_status();
}

}  // namespace

Status check_figures(const Json& j, bool non_negative, const std::string& what) {
  Status s = walk_figures(j, non_negative, "");
  if (s.ok()) return s;
  return internal_error(what + ": " + s.message() +
                        "; the inputs are outside the range this model is valid for");
}

Progress::Progress(std::string command, double quiet_s, double every_s)
    : command_(std::move(command)),
      start_(std::chrono::steady_clock::now()),
      last_(start_),
      quiet_s_(quiet_s),
      every_s_(every_s) {}

void Progress::update(const std::string& line) {
  const auto now = std::chrono::steady_clock::now();
  const double since_start = std::chrono::duration<double>(now - start_).count();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (since_start < quiet_s_ || (printed_ && since_last < every_s_)) return;
  std::fprintf(stderr, "msinfer %s: %s (%.0f s)\n", command_.c_str(), line.c_str(), since_start);
  last_ = now;
  printed_ = true;
}

namespace {

struct LinuxDirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

// Decimal digits of v into buf (no terminator); returns the count.
size_t put_decimal(long v, char* buf) {
  char digits[24];
  size_t nd = 0;
  do {
    digits[nd++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && nd < sizeof(digits));
  for (size_t i = 0; i < nd; ++i) buf[i] = digits[nd - 1 - i];
  return nd;
}

// The parent pid of `pid` from /proc/<pid>/stat, or -1.
long parent_of(long pid) {
  char path[48] = "/proc/";
  size_t p = 6 + put_decimal(pid, path + 6);
  const char* tail = "/stat";
  for (size_t i = 0; tail[i] != '\0'; ++i) path[p++] = tail[i];
  path[p] = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  // "pid (comm) S ppid ...": comm may hold anything, so search from the last ')'.
  ssize_t i = n - 1;
  while (i >= 0 && buf[i] != ')') --i;
  i += 4;  // ") S "
  if (i >= n) return -1;
  long ppid = 0;
  for (; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) ppid = ppid * 10 + (buf[i] - '0');
  return ppid;
}

// Whether the process whose fd directory is `fd_dir` ("/proc/self/fd",
// "/proc/<pid>/fd") has the file (dev, ino) open.
bool holds_open(const char* fd_dir, dev_t dev, ino_t ino) {
  const int dir = ::open(fd_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  bool found = false;
  alignas(8) char buf[2048];
  for (long n; !found && (n = ::syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0;) {
    for (long off = 0; !found && off < n;) {
      const auto* e = reinterpret_cast<const LinuxDirent64*>(buf + off);
      off += e->d_reclen;
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      struct stat st {};
      // Follows the link to the open file itself, unlinked or not.
      found = ::fstatat(dir, e->d_name, &st, 0) == 0 && st.st_dev == dev && st.st_ino == ino;
    }
  }
  ::close(dir);
  return found;
}

// The length of the token "msinfer-<pid>-<16 hex digits>" that `name` starts
// with (comm::ShmOwner's names), with its pid in *pid; 0 if it has none.
size_t token_length(const char* name, long* pid) {
  if (std::strncmp(name, "msinfer-", 8) != 0) return 0;
  const char* c = name + 8;
  *pid = 0;
  for (; *c >= '0' && *c <= '9' && c - name < 30; ++c) *pid = *pid * 10 + (*c - '0');
  if (c == name + 8 || *c != '-' || *pid <= 0) return 0;
  ++c;
  for (int i = 0; i < 16; ++i, ++c) {
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || (*c >= 'A' && *c <= 'F')))
      return 0;
  }
  return static_cast<size_t>(c - name);
}

// Removes the shared-memory objects of this process and of its children:
// worker processes die with it (the router sets PR_SET_PDEATHSIG), often
// before their own handlers run. The rule is remove_dead_shm_endpoints's
// (comm/fabric_transport.h): the token's lock says whose objects are, not
// the pid in their name, which a process of another PID namespace sharing
// /dev/shm may have too. A token is this process's (or a child's) when that
// process holds the token's "<token>.live" file open. The objects go first,
// the locks in a second pass. Async-signal-safe: raw syscalls, no allocation.
void remove_own_shm_objects() {
  const long self = static_cast<long>(::getpid());
  const int shm = ::open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (shm < 0) return;
  alignas(8) char buf[4096];
  for (int pass = 0; pass < 2; ++pass) {
    if (::lseek(shm, 0, SEEK_SET) != 0) break;
    for (long n; (n = ::syscall(SYS_getdents64, shm, buf, sizeof(buf))) > 0;) {
      for (long off = 0; off < n;) {
        const auto* e = reinterpret_cast<const LinuxDirent64*>(buf + off);
        off += e->d_reclen;
        long pid = 0;
        const size_t len = token_length(e->d_name, &pid);
        if (len == 0) continue;
        const bool is_lock = std::strcmp(e->d_name + len, ".live") == 0;
        if (is_lock != (pass == 1)) continue;
        // A cheap filter first (the pid is a number in our namespace, or in another).
        if (pid != self && parent_of(pid) != self) continue;
        char lock[64];
        std::memcpy(lock, e->d_name, len);
        std::memcpy(lock + len, ".live", 6);
        struct stat st {};
        if (::fstatat(shm, lock, &st, 0) != 0) continue;  // no lock: nobody vouches for it
        char fd_dir[48] = "/proc/self/fd";
        if (pid != self) {
          size_t p = 6 + put_decimal(pid, fd_dir + 6);
          std::memcpy(fd_dir + p, "/fd", 4);
        }
        if (holds_open(fd_dir, st.st_dev, st.st_ino)) ::unlinkat(shm, e->d_name, 0);
      }
    }
  }
  ::close(shm);
}

void on_fatal_signal(int sig) {
  const int saved = errno;
  remove_own_shm_objects();
  errno = saved;
  // SA_RESETHAND restored the default action: die of the same signal once this returns.
  ::kill(::getpid(), sig);
  // Except as pid 1 of a PID namespace (a container's first process): the
  // kernel drops the signals init sends itself whose action is the default.
  // It would run on with its objects removed; it exits as a shell reports a
  // death by that signal.
  if (::getpid() == 1) ::_exit(128 + sig);
}

}  // namespace

void open_closed_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // The lowest free number, which is fd: those below it are open by now.
    const int got = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (got >= 0 && got != fd) {
      ::dup2(got, fd);
      ::close(got);
    }
  }
}

void exec_again_with_bounded_openmp_spin(int argc, char** argv) {
  if (argc < 2) return;
  const std::string cmd = argv[1];
  if (cmd != "generate" && cmd != "serve" && cmd != "bench" && cmd != "profile" &&
      cmd != "worker") {
    return;
  }
  // Empty counts as unset, as libgomp reads it.
  for (const char* v : {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"}) {
    const char* x = std::getenv(v);
    if (x != nullptr && *x != '\0') return;
  }
  if (::setenv("GOMP_SPINCOUNT", kernels::cpu::kOpenmpSpinCount, 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("GOMP_SPINCOUNT");  // not applied: say what this process runs with
}

void install_shm_cleanup_on_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    struct sigaction old {};
    // A signal the parent set to be ignored stays ignored (nohup, background jobs).
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace msinfer::cli
