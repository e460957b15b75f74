#include "msinfer/runtime/router.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "internal/line_io.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/comm/tcp.h"

extern char** environ;

namespace msinfer::runtime {
namespace {

// The role of bootstrap rank r (0 .. processes()-1): attention processes come
// first, then expert processes. The local router, the launched one and a
// joining worker all name roles this way. Attention replica a's tp ranks are
// consecutive ranks (a * tp_attention + r), and so are expert worker w's
// shards (attention processes + w * tp_expert + shard).
struct Role {
  bool attention;
  int index;    // among the workers of its kind
  int tp_rank;  // the process within its tp group (0 without tensor parallelism)
  const char* name() const { return attention ? "attention" : "expert"; }
};
Role role_of(const WorkerConfig& c, int r) {
  if (r < c.attention_processes()) return Role{true, r / c.tp_attention, r % c.tp_attention};
  const int e = r - c.attention_processes();
  return Role{false, e / c.tp_expert, e % c.tp_expert};
}

}  // namespace
using internal::read_line;
using internal::write_line;

StatusOr<std::unique_ptr<Router>> Router::start(const WorkerConfig& c, const std::string& exe,
                                                const std::string& placement_file) {
  auto r = std::unique_ptr<Router>(new Router());
  r->c_ = c;
  const int A = c.attention_workers, N = c.expert_workers, P = c.processes();
  MSI_ASSIGN_OR_RETURN(r->server_, comm::BootstrapServer::start(P));
  ::signal(SIGPIPE, SIG_IGN);
  for (int rank = 0; rank < P; ++rank) {
    Worker w;
    const Role role = role_of(c, rank);
    w.role = role.name();
    w.index = role.index;
    w.tp_rank = role.tp_rank;
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      return internal_error("router: pipe failed");
    }
    std::vector<std::string> args = {exe,
                                     "worker",
                                     "--role",
                                     w.role,
                                     "--index",
                                     std::to_string(w.index),
                                     "--model",
                                     c.model_dir,
                                     "--attention-workers",
                                     std::to_string(A),
                                     "--expert-workers",
                                     std::to_string(N),
                                     "--micro-batches",
                                     std::to_string(c.micro_batches),
                                     "--kv-cache-mb",
                                     std::to_string(c.kv_cache_bytes >> 20),
                                     "--fabric-provider",
                                     c.provider,
                                     "--timeout-ms",
                                     std::to_string(c.timeout_ms),
                                     "--weights",
                                     kernels::cpu::weight_format_name(c.weights),
                                     "--attention-device",
                                     c.attention_device,
                                     "--expert-device",
                                     c.expert_device,
                                     "--tp-expert",
                                     std::to_string(c.tp_expert),
                                     "--tp-expert-reduce",
                                     expert_reduce_name(c.tp_expert_reduce),
                                     "--tp-attention",
                                     std::to_string(c.tp_attention),
                                     "--tp-rank",
                                     std::to_string(w.tp_rank)};
    if (c.attention_cost_per_token > 0 || c.attention_cost_per_position > 0) {
      char cost[64];
      std::snprintf(cost, sizeof cost, "%.17g,%.17g", c.attention_cost_per_token,
                    c.attention_cost_per_position);
      args.push_back("--attention-cost");
      args.push_back(cost);
    }
    if (!placement_file.empty()) {
      args.push_back("--placement");
      args.push_back(placement_file);
    }
    // Share the cores: each worker gets nproc / workers OpenMP threads that
    // sleep when idle (spinning OpenMP threads of one process starve another
    // process's M2N polling; measured 100 ms per step instead of ~1 ms).
    // Explicit settings in the environment win.
    const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
    }
    env.emplace("OMP_NUM_THREADS", std::to_string(std::max(1L, cores / P)));
    env.emplace("OMP_WAIT_POLICY", "PASSIVE");
    env["MSINFER_BOOTSTRAP"] = r->server_->address();
    env["MSINFER_JOB_SECRET"] = r->server_->secret();  // as NCCL hands out its unique id
    env["MSINFER_RANK"] = std::to_string(rank);
    env["MSINFER_WORLD_SIZE"] = std::to_string(P);
    std::vector<std::string> env_lines;
    for (const auto& [k, v] : env) env_lines.push_back(k + "=" + v);
    // Everything the child needs is built here: between fork and exec it only
    // makes system calls (the bootstrap server's thread may hold the
    // allocator's lock at the fork).
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_lines) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return internal_error("router: fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the router dies
      if (::getppid() != parent) ::_exit(1);
      // Commands and answers use fds 3 and 4, so nothing a library prints on
      // stdout (sent to stderr here) can corrupt the protocol. A source may
      // already sit on a target number, or on another target's (with stdin
      // closed, fd 0 goes to the bootstrap listener and the first pipe end
      // is fd 3: dup2(3, 3) does nothing and leaves close-on-exec set), so
      // every source is first moved above the targets, then put in place;
      // dup2 from another fd clears close-on-exec.
      const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      int sources[4] = {devnull, 2, to_child[0], from_child[1]};
      for (int& fd : sources) fd = fd >= 0 ? ::fcntl(fd, F_DUPFD_CLOEXEC, 10) : -1;
      if (sources[1] < 0) sources[1] = sources[0];  // no stderr: stdout to /dev/null
      const int targets[4] = {0, 1, 3, 4};
      for (int i = 0; i < 4; ++i) {
        if (sources[i] < 0 || ::dup2(sources[i], targets[i]) < 0) ::_exit(126);
      }
      ::execve(exe.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    w.pid = pid;
    ::close(to_child[0]);
    ::close(from_child[1]);
    w.in = to_child[1];
    w.out = from_child[0];
    r->workers_.push_back(w);
  }
  MSI_RETURN_IF_ERROR(r->wait_ready());
  return r;
}

// Every worker says "ready" (with its resident memory) once its weights are
// loaded and the M2N wiring (which needs every worker) is done.
Status Router::wait_ready() {
  for (Worker& w : workers_) {
    MSI_ASSIGN_OR_RETURN(std::string line,
                         read_answer(w, std::chrono::seconds(300), StatusCode::kUnavailable,
                                     "did not start within 300 s"));
    auto j = parse_json(line, name_of(w));
    if (!j.ok() || !j->contains("ready")) {
      return Status(StatusCode::kUnavailable, name_of(w) + ": " + line);
    }
    w.rss_mb = j->value("rss_mb", 0.0);
  }
  return ok_status();
}

Status Router::send_command(Worker& w, const std::string& command) {
  if (write_line(w.in, command)) return ok_status();
  MSI_RETURN_IF_ERROR(check_children());
  return Status(StatusCode::kUnavailable, name_of(w) + " is gone");
}

// The worker's next line; while waiting, a worker that died is reported (and
// everything stopped) instead. A negative timeout waits as long as it takes.
StatusOr<std::string> Router::read_answer(Worker& w, std::chrono::milliseconds timeout,
                                          StatusCode code, const std::string& late) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  while (timeout.count() < 0 || std::chrono::steady_clock::now() < deadline) {
    if (read_line(w.out, &w.buf, &line, 200)) return line;
    MSI_RETURN_IF_ERROR(check_children());
  }
  return Status(code, name_of(w) + " " + late);
}

std::string Router::name_of(const Worker& w) const {
  if (w.role == "expert") return expert_process_name(w.index, w.tp_rank, c_.tp_expert);
  return attention_process_name(w.index, w.tp_rank, c_.tp_attention);
}

// ---- under a launcher (mpirun / srun) ----
//
// Rank 0 (router) listens on this host's address for control connections and
// runs the bootstrap server of the workers' M2N wiring; one launcher allgather
// tells every rank both addresses. Each worker connects, says who it is
// ({"rank", "pid", "host"}), then bootstraps its M2N endpoint through the
// router's server as rank (launcher rank - 1) and serves commands on the
// socket exactly as over the pipes of a local deployment.

namespace {

Status check_launcher_size(const WorkerConfig& c, const comm::Bootstrap& launcher) {
  const int need = 1 + c.processes();
  if (launcher.size() != need) {
    return invalid_argument("the launcher started " + std::to_string(launcher.size()) +
                            " ranks; this deployment needs 1 router + " +
                            std::to_string(c.attention_processes()) + " attention + " +
                            std::to_string(c.expert_processes()) +
                            " expert worker processes = " + std::to_string(need) +
                            " (e.g. mpirun -np " + std::to_string(need) + ")");
  }
  return ok_status();
}

std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

}  // namespace

StatusOr<std::unique_ptr<Router>> Router::start_launched(const WorkerConfig& c,
                                                         comm::Bootstrap& launcher) {
  MSI_RETURN_IF_ERROR(check_launcher_size(c, launcher));
  auto r = std::unique_ptr<Router>(new Router());
  r->c_ = c;
  const int A = c.attention_processes(), N = c.expert_processes();
  const std::string host = comm::local_address();
  MSI_ASSIGN_OR_RETURN(r->server_, comm::BootstrapServer::start(A + N, host));
  int port = 0;
  MSI_ASSIGN_OR_RETURN(const int listen_fd, comm::tcp_listen(host, 0, &port));
  ::signal(SIGPIPE, SIG_IGN);
  // The launcher's own channel (MPI / PMIx) carries the job's secret to the
  // ranks; the bootstrap server and the control socket require it.
  auto gathered = launcher.allgather(r->server_->address() + " " + host + ":" +
                                     std::to_string(port) + " " + r->server_->secret());
  if (!gathered.ok()) {
    ::close(listen_fd);
    return gathered.status();
  }
  r->workers_.resize(A + N);
  for (int i = 0; i < A + N; ++i) {
    const Role role = role_of(c, i);
    r->workers_[i].role = role.name();
    r->workers_[i].index = role.index;
    r->workers_[i].tp_rank = role.tp_rank;
  }
  // Control connections are accepted and their hellos read all at once,
  // without blocking: a silent stray connection delays no worker's join and
  // is dropped after 30 s (or 64 KiB without a line).
  using clock = std::chrono::steady_clock;
  struct Pending {
    int fd;
    std::string buf;
    clock::time_point deadline;
  };
  std::vector<Pending> pending;
  Status s = ok_status();
  int joined = 0;
  auto next_join_by = clock::now() + std::chrono::seconds(120);
  while (joined < A + N && s.ok()) {
    if (clock::now() > next_join_by) {
      s = Status(StatusCode::kDeadlineExceeded, "router: only " + std::to_string(joined) + " of " +
                                                    std::to_string(A + N) +
                                                    " workers connected (none in the last 120 s)");
      break;
    }
    auto fd = comm::tcp_accept(listen_fd, std::chrono::milliseconds(50));
    if (fd.ok()) {
      pending.push_back({*fd, "", clock::now() + std::chrono::seconds(30)});
    } else if (fd.status().code() != StatusCode::kDeadlineExceeded) {
      s = fd.status().with_context("router: accepting workers");
      break;
    }
    for (size_t i = 0; i < pending.size() && s.ok();) {
      std::string line;
      bool eof = false;
      if (!read_line(pending[i].fd, &pending[i].buf, &line, 0, &eof)) {
        if (eof || clock::now() > pending[i].deadline || pending[i].buf.size() > (64u << 10)) {
          ::close(pending[i].fd);  // not one of the job's ranks (or gone): ignored
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
        continue;
      }
      const int cfd = pending[i].fd;
      std::string buf = std::move(pending[i].buf);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      auto hello = parse_json(line, "worker hello");
      const std::string secret = hello.ok() && hello->is_object() && (*hello)["secret"].is_string()
                                     ? (*hello)["secret"].get<std::string>()
                                     : "";
      if (!hello.ok() || !comm::is_job_secret(secret, r->server_->secret())) {
        ::close(cfd);  // not one of the job's ranks: ignored
        continue;
      }
      const int64_t rank =
          (*hello)["rank"].is_number_integer() ? (*hello)["rank"].get<int64_t>() : -1;
      if (rank < 1 || rank > A + N || r->workers_[rank - 1].in >= 0) {
        ::close(cfd);
        s = invalid_argument("router: a worker connected with a bad hello (rank " +
                             std::to_string(rank) + ")");
        break;
      }
      Worker& w = r->workers_[rank - 1];
      w.in = w.out = cfd;
      w.buf = buf;
      const auto text = [&](const char* key) {
        return (*hello)[key].is_string() ? (*hello)[key].get<std::string>() : std::string("?");
      };
      const int64_t pid =
          (*hello)["pid"].is_number_integer() ? (*hello)["pid"].get<int64_t>() : int64_t{0};
      w.where = "rank " + std::to_string(rank) + " on " + text("host") + " (" + text("address") +
                ", pid " + std::to_string(pid) + ")";
      ++joined;
      next_join_by = clock::now() + std::chrono::seconds(120);
    }
  }
  for (const Pending& p : pending) ::close(p.fd);
  ::close(listen_fd);
  MSI_RETURN_IF_ERROR(s);
  MSI_RETURN_IF_ERROR(r->wait_ready());
  return r;
}

Status join_launched_deployment(const WorkerConfig& config, comm::Bootstrap& launcher) {
  MSI_RETURN_IF_ERROR(check_launcher_size(config, launcher));
  const int rank = launcher.rank();
  if (rank < 1) return invalid_argument("join_launched_deployment: rank 0 is the router");
  MSI_ASSIGN_OR_RETURN(auto all, launcher.allgather(""));
  std::istringstream addrs(all[0]);
  std::string bootstrap, control, secret;
  addrs >> bootstrap >> control >> secret;
  MSI_ASSIGN_OR_RETURN(const int fd, comm::tcp_connect(control, std::chrono::seconds(60)));
  write_line(fd, Json{{"rank", rank},
                      {"pid", ::getpid()},
                      {"host", host_name()},
                      {"address", comm::local_address()},
                      {"secret", secret}}
                     .dump());
  WorkerConfig c = config;
  // Transports that cross hosts bind the address peers reach this host by.
  if (c.address.empty() && !comm::transport_within_host(c.provider)) {
    c.address = comm::local_address();
  }
  // As the local router does for its children: share this host's cores among
  // the ranks on it, with OpenMP threads that sleep when idle (before the
  // first parallel region reads them). Explicit settings win.
  const long per_host = comm::local_process_count(1);
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1L, cores / per_host)).c_str(), 0);
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  const int A = c.attention_processes(), N = c.expert_processes();
  MSI_ASSIGN_OR_RETURN(auto boot, comm::make_tcp_bootstrap(rank - 1, A + N, bootstrap, secret));
  const Role role = role_of(c, rank - 1);  // launcher rank 0 is the router
  Status s = role.attention ? run_attention_worker(c, role.index, role.tp_rank, *boot, fd, fd)
                            : run_expert_worker(c, role.index, role.tp_rank, *boot, fd, fd);
  ::close(fd);
  return s;
}

Router::~Router() { shutdown(); }

void Router::shutdown() {
  for (auto& w : workers_) {
    if (w.in >= 0) write_line(w.in, R"({"op": "exit"})");
  }
  for (auto& w : workers_) {
    if (w.pid > 0) {
      int st = 0;
      for (int i = 0; i < 200 && ::waitpid(w.pid, &st, WNOHANG) == 0; ++i) ::usleep(10000);
      if (::waitpid(w.pid, &st, WNOHANG) == 0) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &st, 0);
      }
      w.pid = -1;
    } else if (w.out >= 0) {
      // A launcher's rank: it closes the socket as it exits.
      std::string line;
      bool eof = false;
      for (int i = 0; i < 20 && !eof; ++i) read_line(w.out, &w.buf, &line, 100, &eof);
    }
    if (w.in >= 0) ::close(w.in);
    if (w.out >= 0 && w.out != w.in) ::close(w.out);
    w.in = w.out = -1;
  }
  comm::remove_dead_shm_endpoints();  // those of workers that were killed
}

Status Router::check_children() {
  for (auto& w : workers_) {
    std::string how;
    StatusCode code = StatusCode::kUnavailable;
    if (w.pid > 0) {
      int st = 0;
      if (::waitpid(w.pid, &st, WNOHANG) != w.pid) continue;
      how = "(pid " + std::to_string(w.pid) + ") " +
            (WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                             : "exited with status " + std::to_string(WEXITSTATUS(st)));
      // Exit 2 is the CLI's bad input (the model it was given): the same error
      // class as the co-located engine reports for it.
      if (WIFEXITED(st) && WEXITSTATUS(st) == 2) {
        code = StatusCode::kInvalidArgument;
        how += " (bad input: see its message above)";
      }
      w.pid = -1;
    } else if (w.out >= 0 && !w.where.empty()) {
      // A launcher's rank on any host: its socket ends when the process does.
      char c;
      const ssize_t n = ::recv(w.out, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n != 0 && !(n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) continue;
      how = "(" + w.where + ") closed its connection: it exited or its host is unreachable";
    } else {
      continue;
    }
    const std::string who = name_of(w) + " " + how;
    shutdown();
    return Status(code, who);
  }
  return ok_status();
}

Status Router::add(const GenerationRequest& r) {
  // The attention worker with the least load.
  int best = 0;
  for (int a = 1; a < c_.attention_workers; ++a) {
    if (lead(a).load < lead(best).load) best = a;
  }
  Json j{{"op", "add"},
         {"id", r.id},
         {"prompt", r.prompt},
         {"max_tokens", r.sampling.max_tokens},
         {"temperature", r.sampling.temperature},
         {"top_k", r.sampling.top_k},
         {"top_p", r.sampling.top_p},
         {"seed", r.sampling.seed},
         {"ignore_eos", r.sampling.ignore_eos},
         {"stop_token_ids", r.sampling.stop_token_ids},
         {"frequency_penalty", r.sampling.frequency_penalty},
         {"presence_penalty", r.sampling.presence_penalty},
         {"logprobs", r.sampling.logprobs}};
  MSI_RETURN_IF_ERROR(send_command(lead(best), j.dump()));
  MSI_ASSIGN_OR_RETURN(std::string line, read_answer(lead(best), std::chrono::milliseconds(-1),
                                                     StatusCode::kDeadlineExceeded, ""));
  MSI_ASSIGN_OR_RETURN(Json ans, parse_json(line, name_of(lead(best))));
  if (ans.contains("refused")) {
    return Status(StatusCode::kResourceExhausted, ans.value("error", std::string("refused")));
  }
  const int64_t load = static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
  lead(best).load += load;
  in_flight_[r.id] = best;
  load_of_[r.id] = load;
  return ok_status();
}

Status Router::cancel(int64_t id) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return ok_status();
  Worker& w = lead(it->second);
  MSI_RETURN_IF_ERROR(send_command(w, Json{{"op", "cancel"}, {"id", id}}.dump()));
  MSI_ASSIGN_OR_RETURN(std::string line,
                       read_answer(w, std::chrono::milliseconds(c_.timeout_ms),
                                   StatusCode::kDeadlineExceeded, "did not answer a cancel"));
  MSI_ASSIGN_OR_RETURN(Json ans, parse_json(line, name_of(w)));
  if (!ans.contains("cancelled")) {
    return internal_error(name_of(w) + ": expected cancelled, got " + line);
  }
  w.kv_usage = ans.value("kv_usage", w.kv_usage);
  w.load -= load_of_[id];
  load_of_.erase(id);
  in_flight_.erase(it);
  return ok_status();
}

double Router::kv_usage() const {
  double s = 0;
  for (int a = 0; a < c_.attention_workers; ++a) s += lead(a).kv_usage;
  return c_.attention_workers > 0 ? s / c_.attention_workers : 0;
}

int64_t Router::preemptions() const {
  int64_t s = 0;
  for (int a = 0; a < c_.attention_workers; ++a) s += lead(a).preemptions;
  return s;
}

StatusOr<std::vector<TokenEvent>> Router::step() {
  std::vector<TokenEvent> events;
  for (int a = 0; a < c_.attention_workers; ++a) {
    MSI_RETURN_IF_ERROR(send_command(lead(a), R"({"op": "step"})"));
  }
  for (int a = 0; a < c_.attention_workers; ++a) {
    // A step waits at most the M2N timeout per layer; check for dead workers while waiting.
    MSI_ASSIGN_OR_RETURN(std::string line,
                         read_answer(lead(a), std::chrono::milliseconds(c_.timeout_ms * 4 + 10000),
                                     StatusCode::kDeadlineExceeded, "did not answer a step"));
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(line, name_of(lead(a))));
    if (j.contains("error")) {
      shutdown();
      return Status(StatusCode::kUnavailable, j["error"].get<std::string>());
    }
    lead(a).kv_usage = j.value("kv_usage", 0.0);
    lead(a).preemptions = j.value("preemptions", int64_t{0});
    for (const auto& e : j["events"]) {
      TokenEvent ev;
      ev.request_id = e["id"].get<int64_t>();
      ev.token = e["token"].get<int32_t>();
      ev.finished = e["finished"].get<bool>();
      ev.finish_reason = e["reason"].get<std::string>();
      if (e.contains("logprob")) {
        ev.logprob = e["logprob"].get<float>();
        ev.top_logprobs = e["top"].get<std::vector<std::pair<int32_t, float>>>();
      }
      if (ev.finished) {
        in_flight_.erase(ev.request_id);
        auto l = load_of_.find(ev.request_id);
        if (l != load_of_.end()) {
          lead(a).load -= l->second;
          load_of_.erase(l);
        }
      }
      events.push_back(ev);
    }
  }
  return events;
}

StatusOr<std::vector<Json>> Router::stats(bool reset) {
  for (auto& w : workers_) {
    MSI_RETURN_IF_ERROR(send_command(w, Json{{"op", "stats"}, {"reset", reset}}.dump()));
  }
  std::vector<Json> out;
  for (auto& w : workers_) {
    MSI_ASSIGN_OR_RETURN(std::string line,
                         read_answer(w, std::chrono::milliseconds(c_.timeout_ms),
                                     StatusCode::kDeadlineExceeded, "did not report its stats"));
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(line, name_of(w)));
    if (!j.contains("stats")) return internal_error(name_of(w) + ": expected stats, got " + line);
    Json st = j["stats"];
    st["role"] = w.role;
    st["index"] = w.index;
    if (c_.tp_expert > 1 && w.role == "expert") st["tp_rank"] = w.tp_rank;
    if (c_.tp_attention > 1 && w.role == "attention") st["tp_rank"] = w.tp_rank;
    out.push_back(std::move(st));
  }
  return out;
}

std::string Router::describe() const {
  std::string s;
  for (const auto& w : workers_) {
    char rss[64];
    std::snprintf(rss, sizeof(rss), ", RSS %.0f MiB", w.rss_mb);
    s += name_of(w) + ": " + (w.where.empty() ? "pid " + std::to_string(w.pid) : w.where) + rss +
         "\n";
  }
  return s;
}

}  // namespace msinfer::runtime
