// A `msinfer serve` child process for the end-to-end server tests, and curl
// and raw-socket helpers to talk to it. Needs MSINFER_BINARY and
// MSINFER_SOURCE_DIR defined by the test target. Every server a test starts
// is stopped by its destructor (SIGTERM, then SIGKILL of its process group),
// also when the test fails.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "loopback_http.h"
#include "subprocess.h"

namespace msinfer::testing {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

inline const std::string kBin = MSINFER_BINARY;
inline fs::path source_dir() { return fs::path(MSINFER_SOURCE_DIR); }
inline fs::path node_modules() { return source_dir() / ".cache" / "npm" / "node_modules"; }

inline fs::path model_dir() {
  static const fs::path dir = [] {
    fs::path d =
        fs::path(::testing::TempDir()) / ("msinfer-serve-model-" + std::to_string(::getpid()));
    std::system(
        (kBin + " make-model --preset tiny-mixtral --out " + d.string() + " >/dev/null 2>&1")
            .c_str());
    return d;
  }();
  return dir;
}

// A `msinfer serve` child process of `model` (tiny-mixtral unless given).
// The destructor stops it (SIGTERM, then SIGKILL after a grace period)
// whatever happened in the test.
class Server {
 public:
  explicit Server(const std::string& args, const fs::path& model = model_dir()) {
    err_path_ = fs::path(::testing::TempDir()) / ("msinfer-serve-" + std::to_string(::getpid()) +
                                                  "-" + std::to_string(counter_++) + ".err");
    int out[2];
    if (::pipe(out) != 0) return;
    const std::string cmd = kBin + " serve --model " + model.string() + " --port 0 " + args +
                            " 2>" + err_path_.string();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    out_ = out[0];
    // The ready line carries the port.
    std::string line;
    const auto deadline = clock_type::now() + std::chrono::seconds(120);
    while (clock_type::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char c;
      if (::read(out_, &c, 1) != 1) break;
      if (c != '\n') {
        line += c;
        continue;
      }
      std::smatch m;
      if (std::regex_search(line, m, std::regex("ready at (http://[^ ]+:([0-9]+))"))) {
        url_ = m[1];
        port_ = std::stoi(m[2]);
        ready_line_ = line;
        break;
      }
      line.clear();
    }
  }
  ~Server() {
    stop(SIGTERM, std::chrono::seconds(30));
    if (out_ >= 0) ::close(out_);
    std::error_code ec;
    fs::remove(err_path_, ec);
  }
  // Sends `sig` and waits for the exit; SIGKILL (the whole group) after `grace`.
  int stop(int sig, std::chrono::seconds grace) {
    if (pid_ <= 0) return exit_status_;
    ::kill(pid_, sig);
    const auto deadline = clock_type::now() + grace;
    int st = 0;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (clock_type::now() > deadline) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return exit_status_;
  }
  // Waits up to `limit` for the server to exit by itself: its exit status
  // (128 + signal when killed), or -1 when it still runs.
  int wait_exit(std::chrono::seconds limit) {
    if (pid_ <= 0) return exit_status_;
    const auto deadline = clock_type::now() + limit;
    int st = 0;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (clock_type::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return exit_status_;
  }
  int port() const { return port_; }
  // The line that said the server is ready (empty if it never did).
  const std::string& ready_line() const { return ready_line_; }
  pid_t pid() const { return pid_; }
  // As the ready line prints it (http://127.0.0.1:PORT unless --host says).
  std::string url() const { return url_; }
  std::string stderr_text() const {
    std::ifstream f(err_path_);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int out_ = -1, port_ = 0, exit_status_ = -1;
  std::string url_, ready_line_;
  fs::path err_path_;
};

struct HttpResult {
  int status = 0;
  std::string headers, body;
};

// curl with its exit status and the response's status, headers and body.
inline HttpResult curl(const std::string& args) {
  const std::string h =
      (fs::path(::testing::TempDir()) / ("msinfer-curl-h-" + std::to_string(::getpid()))).string();
  const std::string out =
      run_capture("curl -s -D " + h + " -o - -w '\\n%{http_code}' " + args);
  HttpResult r;
  const size_t nl = out.rfind('\n');
  if (nl == std::string::npos) return r;
  r.status = std::atoi(out.c_str() + nl + 1);
  r.body = out.substr(0, nl);
  std::ifstream f(h);
  r.headers.assign(std::istreambuf_iterator<char>(f), {});
  std::remove(h.c_str());
  return r;
}

inline HttpResult post(const Server& s, const std::string& path, const std::string& body,
                const std::string& extra = "-H 'Content-Type: application/json'") {
  const std::string f =
      (fs::path(::testing::TempDir()) / ("msinfer-body-" + std::to_string(::getpid()))).string();
  std::ofstream(f) << body;
  HttpResult r = curl(extra + " --data-binary @" + f + " " + s.url() + path);
  std::remove(f.c_str());
  return r;
}

// Raw bytes over a socket: what came back before the server closed or `wait` passed.
inline std::string raw_exchange(int port, const std::string& bytes, std::chrono::milliseconds wait,
                         bool* closed = nullptr) {
  const int fd = send_request(port, bytes);
  if (fd < 0) return "";
  std::string got = read_from(fd, wait, "", SIZE_MAX, closed);
  ::close(fd);
  return got;
}

// The server's resident memory in bytes (VmRSS), or -1.
inline int64_t rss_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

}  // namespace msinfer::testing
