#include "msinfer/runtime/router.h"

#include "internal/line_io.h"
#include "msinfer/comm/fabric_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstring>

namespace msinfer::runtime {
using internal::read_line;
using internal::write_line;

StatusOr<std::unique_ptr<Router>> Router::start(const WorkerConfig& c, const std::string& exe,
                                                const std::string& placement_file) {
  auto r = std::unique_ptr<Router>(new Router());
  r->c_ = c;
  const int A = c.attention_workers, N = c.expert_workers;
  MSI_ASSIGN_OR_RETURN(r->server_, comm::BootstrapServer::start(A + N));
  ::signal(SIGPIPE, SIG_IGN);
  for (int rank = 0; rank < A + N; ++rank) {
    Worker w;
    w.role = rank < A ? "attention" : "expert";
    w.index = rank < A ? rank : rank - A;
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    if (rank < A && (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0)) {
      return internal_error("router: pipe failed");
    }
    std::vector<std::string> args = {exe, "worker", "--role", w.role, "--index", std::to_string(w.index),
                                     "--model", c.model_dir,
                                     "--attention-workers", std::to_string(A),
                                     "--expert-workers", std::to_string(N),
                                     "--micro-batches", std::to_string(c.micro_batches),
                                     "--kv-cache-mb", std::to_string(c.kv_cache_bytes >> 20),
                                     "--fabric-provider", c.provider,
                                     "--timeout-ms", std::to_string(c.timeout_ms)};
    if (!placement_file.empty()) {
      args.push_back("--placement");
      args.push_back(placement_file);
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return internal_error("router: fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the router dies
      if (::getppid() != parent) ::_exit(1);
      // Commands and answers use fds 3 and 4, so nothing a library prints on
      // stdout (sent to stderr here) can corrupt the protocol.
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::dup2(2, 1);
      if (rank < A) {
        ::dup2(to_child[0], 3);
        ::dup2(from_child[1], 4);
      }
      // Share the cores: each worker gets nproc / workers OpenMP threads that
      // sleep when idle (spinning OpenMP threads of one process starve another
      // process's M2N polling; measured 100 ms per step instead of ~1 ms).
      // Explicit settings in the environment win.
      const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
      ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1L, cores / (A + N))).c_str(), 0);
      ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
      ::setenv("MSINFER_BOOTSTRAP", r->server_->address().c_str(), 1);
      ::setenv("MSINFER_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("MSINFER_WORLD_SIZE", std::to_string(A + N).c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    w.pid = pid;
    if (rank < A) {
      ::close(to_child[0]);
      ::close(from_child[1]);
      w.in = to_child[1];
      w.out = from_child[0];
    }
    r->workers_.push_back(w);
  }
  // Attention workers say "ready" once their weights are loaded and the M2N
  // wiring (which needs every worker) is done.
  for (int a = 0; a < A; ++a) {
    std::string line;
    if (!read_line(r->workers_[a].out, &r->workers_[a].buf, &line, 120000)) {
      MSI_RETURN_IF_ERROR(r->check_children());
      return Status(StatusCode::kUnavailable, "attention worker " + std::to_string(a) + " did not start");
    }
    auto j = parse_json(line, "attention worker");
    if (!j.ok() || !j->contains("ready")) {
      return Status(StatusCode::kUnavailable, "attention worker " + std::to_string(a) + ": " + line);
    }
    r->workers_[a].rss_mb = j->value("rss_mb", 0.0);
  }
  return r;
}

Router::~Router() { shutdown(); }

void Router::shutdown() {
  for (auto& w : workers_) {
    if (w.in >= 0) {
      write_line(w.in, R"({"op": "exit"})");
      ::close(w.in);
      w.in = -1;
    }
  }
  for (auto& w : workers_) {
    if (w.pid <= 0) continue;
    if (w.role == "expert") ::kill(w.pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 200 && ::waitpid(w.pid, &st, WNOHANG) == 0; ++i) ::usleep(10000);
    if (::waitpid(w.pid, &st, WNOHANG) == 0) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, &st, 0);
    }
    w.pid = -1;
    if (w.out >= 0) ::close(w.out);
    w.out = -1;
  }
  comm::remove_dead_shm_endpoints();  // those of workers that were killed
}

Status Router::check_children() {
  for (auto& w : workers_) {
    if (w.pid <= 0) continue;
    int st = 0;
    if (::waitpid(w.pid, &st, WNOHANG) == w.pid) {
      const std::string how = WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                                              : "exited with status " + std::to_string(WEXITSTATUS(st));
      const std::string who = w.role + " worker " + std::to_string(w.index);
      const pid_t pid = w.pid;
      w.pid = -1;
      shutdown();
      return Status(StatusCode::kUnavailable, who + " (pid " + std::to_string(pid) + ") " + how);
    }
  }
  return ok_status();
}

Status Router::add(const GenerationRequest& r) {
  // The attention worker with the least load.
  int best = 0;
  for (int a = 1; a < c_.attention_workers; ++a) {
    if (workers_[a].load < workers_[best].load) best = a;
  }
  Json j{{"op", "add"}, {"id", r.id}, {"prompt", r.prompt},
         {"max_tokens", r.sampling.max_tokens}, {"temperature", r.sampling.temperature},
         {"top_k", r.sampling.top_k}, {"top_p", r.sampling.top_p}, {"seed", r.sampling.seed},
         {"ignore_eos", r.sampling.ignore_eos}, {"stop_token_ids", r.sampling.stop_token_ids}};
  if (!write_line(workers_[best].in, j.dump())) {
    MSI_RETURN_IF_ERROR(check_children());
    return Status(StatusCode::kUnavailable, "attention worker " + std::to_string(best) + " is gone");
  }
  std::string line;
  bool got = false;
  while (!got) {
    got = read_line(workers_[best].out, &workers_[best].buf, &line, 200);
    if (!got) MSI_RETURN_IF_ERROR(check_children());
  }
  MSI_ASSIGN_OR_RETURN(Json ans, parse_json(line, "attention worker " + std::to_string(best)));
  if (ans.contains("refused")) {
    return Status(StatusCode::kResourceExhausted, ans.value("error", std::string("refused")));
  }
  workers_[best].load += static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
  in_flight_[r.id] = best;
  return ok_status();
}

StatusOr<std::vector<TokenEvent>> Router::step() {
  std::vector<TokenEvent> events;
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (!write_line(workers_[a].in, R"({"op": "step"})")) {
      MSI_RETURN_IF_ERROR(check_children());
      return Status(StatusCode::kUnavailable, "attention worker " + std::to_string(a) + " is gone");
    }
  }
  for (int a = 0; a < c_.attention_workers; ++a) {
    std::string line;
    // A step waits at most the M2N timeout per layer; check for dead workers while waiting.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(c_.timeout_ms * 4 + 10000);
    bool got = false;
    while (!got && std::chrono::steady_clock::now() < deadline) {
      got = read_line(workers_[a].out, &workers_[a].buf, &line, 200);
      if (!got) MSI_RETURN_IF_ERROR(check_children());
    }
    if (!got) return Status(StatusCode::kDeadlineExceeded, "attention worker " + std::to_string(a) + " did not answer a step");
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(line, "attention worker " + std::to_string(a)));
    if (j.contains("error")) {
      shutdown();
      return Status(StatusCode::kUnavailable, j["error"].get<std::string>());
    }
    for (const auto& e : j["events"]) {
      TokenEvent ev{e["id"].get<int64_t>(), e["token"].get<int32_t>(), e["finished"].get<bool>(),
                    e["reason"].get<std::string>()};
      if (ev.finished) {
        in_flight_.erase(ev.request_id);
      }
      events.push_back(ev);
    }
  }
  return events;
}

std::string Router::describe() const {
  std::string s;
  for (const auto& w : workers_) {
    s += w.role + " worker " + std::to_string(w.index) + ": pid " + std::to_string(w.pid) + "\n";
  }
  return s;
}

}  // namespace msinfer::runtime
