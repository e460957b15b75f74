#include "msinfer/runtime/router.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "internal/line_io.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/comm/tcp.h"
#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/device_backend.h"

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
// The one event of a request the deployment lost (TokenEvent::error).
TokenEvent error_event(int64_t id, std::string why) {
  TokenEvent ev;
  ev.request_id = id;
  ev.finished = true;
  ev.finish_reason = "error";
  ev.error = std::move(why);
  return ev;
}

// Sets close-on-exec on every fd from `first` on. Async-signal-safe (only
// system calls): for a forked child before its exec. close_range (Linux 5.11)
// in one call; else each fd up to the limit.
bool close_on_exec_from(int first) {
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, CLOSE_RANGE_CLOEXEC) == 0) {
    return true;
  }
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
  const rlim_t end = r.rlim_cur == RLIM_INFINITY ? rlim_t{1} << 20 : r.rlim_cur;
  for (rlim_t fd = static_cast<rlim_t>(first); fd < end; ++fd) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // EBADF for the unused: fine
  }
  return true;
}

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
  r->exe_ = exe;
  r->placement_file_ = placement_file;
  MSI_RETURN_IF_ERROR(r->init_rebalancing());
  MSI_RETURN_IF_ERROR(r->spawn());
  return r;
}

// Forks this host's workers for c_ (placement_file_ when set, else round
// robin) and waits until each is ready.
Status Router::spawn() {
  workers_.clear();
  serving_ = false;
  MSI_ASSIGN_OR_RETURN(server_, comm::BootstrapServer::start(c_.processes()));
  ::signal(SIGPIPE, SIG_IGN);
  for (int rank = 0; rank < c_.processes(); ++rank) {
    MSI_ASSIGN_OR_RETURN(Worker w, fork_worker(rank, placement_file_, /*join=*/false));
    workers_.push_back(w);
  }
  return wait_ready();
}

// Bootstrap rank `rank` of c_, reading `placement_file` (when set): through
// the bootstrap server, or (`join`) through the router's pipes as a
// replacement joining the running deployment (router_pipe_bootstrap).
StatusOr<Router::Worker> Router::fork_worker(int rank, const std::string& placement_file,
                                             bool join) {
  const WorkerConfig& c = c_;
  const std::string& exe = exe_;
  const int A = c.attention_workers, N = c.expert_workers, P = c.processes();
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
  if (join) {
    env.erase("MSINFER_BOOTSTRAP");
    env["MSINFER_JOIN"] = "1";
  } else {
    env["MSINFER_BOOTSTRAP"] = server_->address();
    env["MSINFER_JOB_SECRET"] = server_->secret();  // as NCCL hands out its unique id
    env.erase("MSINFER_JOIN");
  }
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
    // Fds 0-4 are all a worker gets: whatever else the router holds without
    // close-on-exec (the HTTP listener of `serve`, which asio opens without
    // it; a library's files) must not outlive the exec in the worker.
    if (!close_on_exec_from(5)) ::_exit(126);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  w.pid = pid;
  // The router waits for an answer or any child's exit at once (pidfd,
  // Linux 5.3); without one it looks at the children every 50 ms.
  w.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (w.pidfd >= 0) ::fcntl(w.pidfd, F_SETFD, FD_CLOEXEC);
  ::close(to_child[0]);
  ::close(from_child[1]);
  w.in = to_child[1];
  w.out = from_child[0];
  return w;
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
  serving_ = true;
  return ok_status();
}

Status Router::send_command(Worker& w, const std::string& command) {
  if (!w.dead && write_line(w.in, command)) return ok_status();
  // A closed channel: the worker is going; give its death up to a second to
  // become visible (a SIGKILLed child is reaped a moment after its pipe
  // closes), so it is reported, or dropped, as a death.
  for (int i = 0; i < 100 && !w.dead; ++i) {
    MSI_RETURN_IF_ERROR(check_children());
    if (!w.dead) ::usleep(10000);
  }
  return Status(StatusCode::kUnavailable, name_of(w) + (w.dead ? " died" : " is gone"));
}

// The worker's next line; while waiting, a worker that died is reported (and
// everything stopped, or it dropped or the deployment restarted) instead. A
// negative timeout waits as long as it takes. The wait ends at the answer or
// at the exit of any forked worker (its pidfd), and the children are looked
// at then and every 50 ms: a worker's death is noticed as it happens, not
// at the next look (docs/benchmarks-history.md: an expert worker dropped in place
// costs a client 12-15 ms; 50 ms with looks alone).
StatusOr<std::string> Router::read_answer(Worker& w, std::chrono::milliseconds timeout,
                                          StatusCode code, const std::string& late) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  std::vector<pollfd> fds;
  while (timeout.count() < 0 || std::chrono::steady_clock::now() < deadline) {
    bool eof = false;
    if (!w.dead && read_line(w.out, &w.buf, &line, 0, &eof)) return line;
    fds.clear();
    if (!w.dead && !eof) fds.push_back({w.out, POLLIN, 0});
    for (const Worker& o : workers_) {
      if (o.pidfd >= 0) fds.push_back({o.pidfd, POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), 50);
    if (!w.dead && read_line(w.out, &w.buf, &line, 0)) return line;
    MSI_RETURN_IF_ERROR(check_children());
    if (w.dead) return Status(StatusCode::kUnavailable, name_of(w) + " died");
  }
  return Status(code, name_of(w) + " " + late);
}

StatusOr<std::string> Router::ask(Worker& w, const std::string& command,
                                  std::chrono::milliseconds timeout, const std::string& late) {
  MSI_RETURN_IF_ERROR(send_command(w, command));
  return read_answer(w, timeout, StatusCode::kDeadlineExceeded, late);
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
  MSI_RETURN_IF_ERROR(r->init_rebalancing());
  const int A = c.attention_processes(), N = c.expert_processes();
  const std::string host = comm::local_address();
  MSI_ASSIGN_OR_RETURN(r->server_, comm::BootstrapServer::start(A + N, host));
  int port = 0;
  MSI_ASSIGN_OR_RETURN(const int listen_fd, comm::tcp_listen(host, 0, &port));
  ::signal(SIGPIPE, SIG_IGN);
  // The launcher's own channel (MPI / PMIx) carries the job's secret to the
  // ranks; the bootstrap server and the control socket require it.
  // It carries rank 0's choice of expert reduction too, which may come from a
  // probe of rank 0's machine (the ranks must agree; `msinfer` decides on rank 0).
  auto gathered =
      launcher.allgather(r->server_->address() + " " + host + ":" + std::to_string(port) + " " +
                         r->server_->secret() + " " + expert_reduce_name(c.tp_expert_reduce));
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
  std::string bootstrap, control, secret, reduce;
  addrs >> bootstrap >> control >> secret >> reduce;
  MSI_ASSIGN_OR_RETURN(const ExpertReduce rank0_reduce,
                       parse_expert_reduce(reduce, "rank 0's expert reduction"));
  MSI_ASSIGN_OR_RETURN(const int fd, comm::tcp_connect(control, std::chrono::seconds(60)));
  write_line(fd, Json{{"rank", rank},
                      {"pid", ::getpid()},
                      {"host", host_name()},
                      {"address", comm::local_address()},
                      {"secret", secret}}
                     .dump());
  WorkerConfig c = config;
  c.tp_expert_reduce = rank0_reduce;
  if (c.tp_expert > 1) c.placement.tp_expert_reduce = rank0_reduce;
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

Router::~Router() {
  shutdown();
  if (!own_placement_file_.empty()) ::unlink(own_placement_file_.c_str());
  if (!join_placement_file_.empty()) ::unlink(join_placement_file_.c_str());
}

void Router::shutdown(bool graceful) {
  if (joining_) abandon_join("the deployment stops");
  for (auto& w : workers_) {
    if (w.in >= 0 && graceful) write_line(w.in, R"({"op": "exit"})");
  }
  for (auto& w : workers_) {
    if (w.pid > 0) {
      int st = 0;
      for (int i = 0; graceful && i < 200 && ::waitpid(w.pid, &st, WNOHANG) == 0; ++i) {
        ::usleep(10000);
      }
      if (::waitpid(w.pid, &st, WNOHANG) == 0) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &st, 0);
      }
      w.reaped();
    } else if (w.out >= 0) {
      // A launcher's rank: it closes the socket as it exits.
      std::string line;
      bool eof = false;
      for (int i = 0; i < 20 && !eof; ++i) read_line(w.out, &w.buf, &line, 100, &eof);
    }
    w.close_channel();
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
      w.reaped();
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
    if (w.role == "attention" && tolerates_attention_loss() && live_attention_workers() > 1) {
      drop_attention_worker(w.index, who);
      continue;
    }
    if (w.role == "expert" && code != StatusCode::kInvalidArgument &&
        (tolerates_expert_loss(w) || awaits_replacement(w))) {
      drop_expert_worker(w, who, /*keep_placement=*/!tolerates_expert_loss(w));
      continue;
    }
    if (code != StatusCode::kInvalidArgument && can_recover(w)) {
      // The caller's operation ends here; the public call that made it
      // restarts the deployment (recover()) and goes on.
      restart_why_ = who;
      restart_without_ = w.role == "expert" && !c_.respawn ? w.index : -1;
      shutdown(/*graceful=*/false);
      return Status(StatusCode::kUnavailable, who + "; the deployment restarts");
    }
    shutdown();
    stopped_ = Status(code, who);
    return stopped_;
  }
  return ok_status();
}

// A death the router recovers from by restarting its workers (only those it
// forked: a launcher's ranks are not its to start): any, with --respawn; an
// expert worker's, when every expert it held has a replica on another one.
// At most kMaxRestarts times, so a worker that keeps dying stops the
// deployment.
bool Router::can_recover(const Worker& w) const {
  if (exe_.empty() || !w.where.empty() || restarts_ >= kMaxRestarts) return false;
  if (c_.respawn) return true;
  return w.role == "expert" && c_.expert_workers > 1 && c_.placement.without(w.index).ok();
}

// The workers read their placement from a file: this router's own,
// $TMPDIR/msinfer-router-<pid>-<name>.json (removed when the router goes).
StatusOr<std::string> Router::write_placement_file(const std::string& name,
                                                   const Placement& p) const {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                           "/msinfer-router-" + std::to_string(::getpid()) + "-" + name + ".json";
  std::ofstream f(path, std::ios::trunc);
  f << p.to_json().dump() << "\n";
  f.close();
  if (!f) return unavailable("cannot write " + path);
  return path;
}

Status Router::recover() {
  // A recovery that cannot go on stops the deployment with the death's cause.
  auto give_up = [&](const std::string& why, const std::string& because) {
    shutdown();
    stopped_ = Status(StatusCode::kUnavailable, why + " (no restart: " + because + ")");
    return stopped_;
  };
  while (!restart_why_.empty()) {
    const std::string why = restart_why_;
    restart_why_.clear();
    if (restarts_ >= kMaxRestarts) {
      return give_up(why, std::to_string(kMaxRestarts) + " restarts already");
    }
    ++restarts_;
    pending_.reset();  // the new workers hold the placement in effect
    steps_since_look_ = 0;
    routed_.clear();
    routed_steps_ = 0;
    const auto t0 = std::chrono::steady_clock::now();
    // Left out: the dead expert worker (restart_without_), and those dropped
    // in place before (they hold nothing), highest index first so that the
    // others' numbers stay right until they are removed.
    std::vector<int> gone;
    if (restart_without_ >= 0) gone.push_back(restart_without_);
    for (const Worker& w : workers_) {
      if (w.role == "expert" && w.dead && w.index != restart_without_) gone.push_back(w.index);
    }
    std::sort(gone.rbegin(), gone.rend());
    for (int g : gone) {
      auto p = c_.placement.without(g);
      if (!p.ok()) return give_up(why, p.status().message());
      c_.placement = std::move(p).value();
      c_.expert_workers -= 1;
    }
    experts_lost_ = 0;
    to_replace_.clear();  // the restart starts every worker
    awaited_.clear();
    before_loss_.reset();
    // The workers read their placement from a file: this router's own.
    auto file = write_placement_file("placement", c_.placement);
    if (!file.ok()) return give_up(why, file.status().message());
    placement_file_ = own_placement_file_ = *file;
    std::fprintf(
        stderr, "msinfer: router: %s; restarting the deployment %s (restart %d of at most %d)\n",
        why.c_str(),
        restart_without_ >= 0 ? "without it (its experts on their replicas)" : "with a replacement",
        restarts_, kMaxRestarts);
    Status s = spawn();
    if (!s.ok()) {
      if (!restart_why_.empty()) continue;  // another death while starting
      shutdown();
      stopped_ = s.with_context("restarting the deployment after " + why);
      return stopped_;
    }
    // Every request in flight starts again from prompt + delivered tokens.
    for (const auto& [id, a] : in_flight_) lost_.push_back(id);
    in_flight_.clear();
    load_of_.clear();
    std::fprintf(stderr, "msinfer: router: restarted in %.2f s; resubmitting %zu request(s)\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 lost_.size());
    s = resubmit_lost();
    if (!s.ok() && restart_why_.empty()) return s;
  }
  return ok_status();
}

// Dropping one attention worker leaves the others' exchange with the expert
// workers intact when the worker is one process (no attention tp group whose
// other ranks would wait for it) and each expert shard answers the attention
// workers itself (under allreduce, shard 0 checks the row counts of its
// shards' partials, and shards could disagree on the step the worker left).
bool Router::tolerates_attention_loss() const {
  return c_.tp_attention == 1 &&
         (c_.tp_expert == 1 || c_.tp_expert_reduce == ExpertReduce::kAttentionSum);
}

// Dropping an expert worker in place needs: a running deployment; one
// process per attention worker (the leader alone talks to the experts) and per
// expert worker (no shard group to break); msinfer's own transports: the
// `direct` one's writes to a dead process land in its shared memory
// harmlessly, the `socket` one forgets a dead peer (tolerate_peer_loss),
// where a libfabric connection to it fails in the attention workers'
// progress first; and no placement switch half done.
bool Router::can_drop_expert_in_place() const {
  return serving_ && !switching_ && c_.tp_attention == 1 && c_.tp_expert == 1 &&
         (c_.provider == "direct" || c_.provider == "socket");
}

// A replacement can be started for `w`: --respawn, and a worker this router forked.
bool Router::replaceable(const Worker& w) const {
  return c_.respawn && !exe_.empty() && w.where.empty();
}

// ... and every expert it held has a replica elsewhere.
bool Router::tolerates_expert_loss(const Worker& w) const {
  return can_drop_expert_in_place() && c_.placement.emptied(w.index).ok();
}

// ... or, without one, a replacement can be waited for.
bool Router::awaits_replacement(const Worker& w) const {
  return can_drop_expert_in_place() && replaceable(w) &&
         replacements_ + static_cast<int>(to_replace_.size()) < kMaxRestarts;
}

void Router::drop_expert_worker(Worker& w, const std::string& why, bool keep_placement) {
  w.dead = true;
  w.close_channel();
  if (experts_lost_ == 0) before_loss_ = c_.placement;
  ++experts_lost_;
  if (keep_placement) {
    // Its replacement is awaited first: serving waits for it.
    to_replace_.insert(to_replace_.begin(), w.index);
    awaited_.push_back(w.index);
    std::fprintf(stderr,
                 "msinfer: router: %s; some of its experts have no replica: serving pauses until "
                 "its replacement joins, and a step it was in runs again\n",
                 why.c_str());
  } else {
    c_.placement = c_.placement.emptied(w.index).value();  // tolerates_expert_loss checked it
    if (replaceable(w)) to_replace_.push_back(w.index);
    std::fprintf(stderr,
                 "msinfer: router: %s; its experts' rows go to their replicas on the other expert "
                 "workers, a step it was in runs again\n",
                 why.c_str());
  }
  // An attention worker reads it mid-step (waiting for the dead worker's
  // answer) or before its next command; a closed pipe here is its own death,
  // which the next check reports. With keep_placement it routes as before:
  // no step runs until the replacement is back.
  Json drop{{"op", "drop_expert"}, {"worker", w.index}};
  if (keep_placement) drop["keep_placement"] = true;
  const std::string line = drop.dump();
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (!lead(a).dead) write_line(lead(a).in, line);
  }
  if (c_.rebalance_every > 0 && experts_lost_ == 1) {
    std::fprintf(stderr,
                 "msinfer: router: online rebalancing stops (it would place experts on "
                 "every expert worker, the lost one too)\n");
  }
}

// step() while an expert worker without replicas is being replaced: the
// join's steps until it is back; a replacement that is given up restarts
// the deployment (recover()) instead.
Status Router::wait_for_replacement() {
  const auto t0 = std::chrono::steady_clock::now();
  while (!awaited_.empty()) {
    MSI_RETURN_IF_ERROR(join_tick());
    if (awaited_.empty()) break;
    MSI_RETURN_IF_ERROR(check_children());
    if (!joining_ && to_replace_.empty()) {
      restart_why_ =
          "expert worker " + std::to_string(awaited_.front()) + "'s replacement did not join";
      restart_without_ = -1;
      shutdown(/*graceful=*/false);
      return Status(StatusCode::kUnavailable, restart_why_ + "; the deployment restarts");
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(300) && joining_) {
      abandon_join("not ready within 300 s");
      continue;
    }
    ::usleep(2000);
  }
  return ok_status();
}

int Router::live_attention_workers() const {
  int n = 0;
  for (int a = 0; a < c_.attention_workers; ++a) n += lead(a).dead ? 0 : 1;
  return n;
}

pid_t Router::pid_of(const std::string& role, int index) const {
  for (const Worker& w : workers_) {
    if (w.role == role && w.index == index && w.tp_rank == 0) return w.pid;  // -1 once reaped
  }
  return -1;
}

void Router::drop_attention_worker(int a, const std::string& why) {
  Worker& w = lead(a);
  w.dead = true;
  w.close_channel();
  w.load = 0;
  std::fprintf(stderr, "msinfer: router: %s; %d attention worker(s) go on%s\n", why.c_str(),
               live_attention_workers(),
               c_.resubmit ? ", its requests are resubmitted to them" : "");
  // The expert processes stop waiting for it (a closed pipe here is an
  // expert's death, which the next check reports).
  const std::string drop = Json{{"op", "drop_attention"}, {"worker", a}}.dump();
  for (Worker& e : workers_) {
    if (e.role == "expert" && e.in >= 0) write_line(e.in, drop);
  }
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second != a) {
      ++it;
      continue;
    }
    const int64_t id = it->first;
    load_of_.erase(id);
    it = in_flight_.erase(it);
    if (c_.resubmit) {
      lost_.push_back(id);
      continue;
    }
    requests_.erase(id);
    failed_.push_back(error_event(id, "request " + std::to_string(id) + " was lost: " + why));
  }
}

Status Router::resubmit_lost() {
  // submit() may find another worker dead and add to lost_ and failed_.
  while (!lost_.empty()) {
    const int64_t id = lost_.back();
    lost_.pop_back();
    auto t = requests_.find(id);
    if (t == requests_.end()) continue;  // cancelled meanwhile
    GenerationRequest r = t->second.request;
    r.prompt.insert(r.prompt.end(), t->second.delivered.begin(), t->second.delivered.end());
    r.sampling.max_tokens -= static_cast<int>(t->second.delivered.size());
    Status s = submit(r);
    if (s.ok()) continue;
    if (!restart_why_.empty()) {  // recover() resubmits it after the restart
      lost_.push_back(id);
      return s;
    }
    MSI_RETURN_IF_ERROR(stopped_);  // the deployment stopped: every request fails with it
    requests_.erase(t);
    failed_.push_back(error_event(
        id, "request " + std::to_string(id) + " could not be resubmitted: " + s.message()));
  }
  return ok_status();
}

// Runs `op` (add, cancel or stats); when it failed on a death the router
// recovers from, restarts the deployment and runs it once more.
template <typename Op>
auto Router::retried_after_restart(Op op) -> decltype(op()) {
  auto result = op();
  if (result.ok() || restart_why_.empty()) return result;
  MSI_RETURN_IF_ERROR(recover());
  return op();
}

Status Router::add(const GenerationRequest& r) {
  MSI_RETURN_IF_ERROR(stopped_);
  MSI_RETURN_IF_ERROR(retried_after_restart([&] { return submit(r); }));
  requests_[r.id] = Tracked{r, {}};
  return ok_status();
}

Status Router::submit(const GenerationRequest& r) {
  if (!restart_why_.empty())
    return Status(StatusCode::kUnavailable, "the deployment is restarting");
  // The live attention worker with the least load; one that dies while
  // taking the request is dropped and the next one tried.
  int best = -1;
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (!lead(a).dead && (best < 0 || lead(a).load < lead(best).load)) best = a;
  }
  if (best < 0) return Status(StatusCode::kUnavailable, "no attention worker is alive");
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
         {"min_p", r.sampling.min_p},
         {"repetition_penalty", r.sampling.repetition_penalty},
         {"min_tokens", r.sampling.min_tokens},
         {"logprobs", r.sampling.logprobs}};
  auto line = ask(lead(best), j.dump(), std::chrono::milliseconds(-1), "");
  if (!line.ok()) {
    if (lead(best).dead) return submit(r);  // it died: try the others
    return line.status();
  }
  MSI_ASSIGN_OR_RETURN(Json ans, parse_json(*line, name_of(lead(best))));
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
  return retried_after_restart([&] { return cancel_once(id); });
}

Status Router::cancel_once(int64_t id) {
  requests_.erase(id);  // a lost request waiting for resubmission goes with it
  auto forget = [&] {
    lost_.erase(std::remove(lost_.begin(), lost_.end(), id), lost_.end());
    failed_.erase(std::remove_if(failed_.begin(), failed_.end(),
                                 [&](const TokenEvent& e) { return e.request_id == id; }),
                  failed_.end());
  };
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) {
    forget();
    return ok_status();
  }
  Worker& w = lead(it->second);
  auto line = ask(w, Json{{"op", "cancel"}, {"id", id}}.dump(),
                  std::chrono::milliseconds(c_.timeout_ms), "did not answer a cancel");
  if (!line.ok() && w.dead) {  // it died meanwhile: the request went with it
    forget();
    return ok_status();
  }
  MSI_RETURN_IF_ERROR(line.status());
  MSI_ASSIGN_OR_RETURN(Json ans, parse_json(*line, name_of(w)));
  if (!ans.contains("cancelled")) {
    return internal_error(name_of(w) + ": expected cancelled, got " + *line);
  }
  w.kv_usage = ans.value("kv_usage", w.kv_usage);
  w.load -= load_of_[id];
  load_of_.erase(id);
  in_flight_.erase(it);
  return ok_status();
}

double Router::kv_usage() const {
  double s = 0;
  for (int a = 0; a < c_.attention_workers; ++a) s += lead(a).dead ? 0 : lead(a).kv_usage;
  const int live = live_attention_workers();
  return live > 0 ? s / live : 0;
}

int64_t Router::preemptions() const {
  int64_t s = 0;
  for (int a = 0; a < c_.attention_workers; ++a) s += lead(a).preemptions;
  return s;
}

StatusOr<std::vector<TokenEvent>> Router::step() {
  std::vector<TokenEvent> events;
  Status s = awaited_.empty() ? step_once(&events) : wait_for_replacement();
  if (s.ok()) s = rebalance_tick();
  if (s.ok()) s = join_tick();
  if (!s.ok()) {
    if (restart_why_.empty()) return s;
    MSI_RETURN_IF_ERROR(recover());  // the events delivered before the death stand
  }
  for (auto& ev : failed_) events.push_back(std::move(ev));  // lost requests end here
  failed_.clear();
  return events;
}

Status Router::step_once(std::vector<TokenEvent>* events) {
  MSI_RETURN_IF_ERROR(stopped_);
  MSI_RETURN_IF_ERROR(resubmit_lost());
  std::vector<char> stepping(static_cast<size_t>(c_.attention_workers), 0);
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (lead(a).dead) continue;
    Status s = send_command(lead(a), R"({"op": "step"})");
    if (!s.ok() && !lead(a).dead) return s;
    stepping[static_cast<size_t>(a)] = s.ok();
  }
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (!stepping[static_cast<size_t>(a)]) continue;
    // A step waits at most the M2N timeout per layer; check for dead workers while waiting.
    auto line = read_answer(lead(a), std::chrono::milliseconds(c_.timeout_ms * 4 + 10000),
                            StatusCode::kDeadlineExceeded, "did not answer a step");
    if (!line.ok() && lead(a).dead)
      continue;  // dropped: its requests are resubmitted or failed below
    MSI_RETURN_IF_ERROR(line.status());
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(*line, name_of(lead(a))));
    if (j.contains("error")) {
      shutdown();
      stopped_ = Status(StatusCode::kUnavailable, j["error"].get<std::string>());
      return stopped_;
    }
    if (j.value("discarded", false)) ++steps_rerun_;
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
      if (auto t = requests_.find(ev.request_id); t != requests_.end()) {
        t->second.delivered.push_back(ev.token);
        if (ev.finished) requests_.erase(t);
      }
      if (ev.finished) {
        in_flight_.erase(ev.request_id);
        auto l = load_of_.find(ev.request_id);
        if (l != load_of_.end()) {
          lead(a).load -= l->second;
          load_of_.erase(l);
        }
      }
      events->push_back(ev);
    }
  }
  return resubmit_lost();
}

// ---- a replacement joins (--respawn after an in-place drop) ----

void Router::abandon_join(const std::string& why) {
  Joining& j = *joining_;
  std::fprintf(stderr, "msinfer: router: the replacement for expert worker %d is given up: %s\n",
               j.w.index, why.c_str());
  if (j.w.pid > 0) {
    ::kill(j.w.pid, SIGKILL);
    int st = 0;
    ::waitpid(j.w.pid, &st, 0);
  }
  j.w.reaped();
  j.w.close_channel();
  joining_.reset();
}

Status Router::join_tick() {
  if (!joining_) {
    if (to_replace_.empty() || !serving_) return ok_status();
    const int w = to_replace_.front();
    to_replace_.erase(to_replace_.begin());
    if (replacements_ >= kMaxRestarts) {
      std::fprintf(stderr,
                   "msinfer: router: no replacement for expert worker %d (%d started already)\n", w,
                   replacements_);
      return ok_status();
    }
    // It reads the placement from before the loss (a valid one: every worker
    // holds experts), of which it loads its own experts.
    auto file = write_placement_file("join", *before_loss_);
    if (!file.ok()) {
      std::fprintf(stderr, "msinfer: router: no replacement: %s\n",
                   file.status().message().c_str());
      return ok_status();
    }
    join_placement_file_ = *file;
    auto forked = fork_worker(c_.attention_processes() + w, join_placement_file_, /*join=*/true);
    if (!forked.ok()) {
      std::fprintf(stderr, "msinfer: router: no replacement for expert worker %d: %s\n", w,
                   forked.status().message().c_str());
      return ok_status();
    }
    ++replacements_;
    joining_ = Joining{std::move(forked).value(), 0, before_loss_->shares_on(w), "",
                       std::chrono::steady_clock::now()};
    std::fprintf(stderr,
                 "msinfer: router: starting a replacement for expert worker %d (pid %d); it "
                 "joins once it has loaded its experts\n",
                 w, joining_->w.pid);
    return ok_status();
  }
  Joining& j = *joining_;
  int st = 0;
  if (::waitpid(j.w.pid, &st, WNOHANG) == j.w.pid) {
    j.w.reaped();
    abandon_join("it died while joining");
    return ok_status();
  }
  const int A = c_.attention_workers, P = c_.processes();
  std::string line;
  while (joining_ && read_line(j.w.out, &j.w.buf, &line, 0)) {
    auto msg = parse_json(line, "the replacement for expert worker " + std::to_string(j.w.index));
    if (!msg.ok()) {
      abandon_join(msg.status().message());
      return ok_status();
    }
    if (msg->contains("allgather")) {
      // The first allgather wires its answers to the attention workers'
      // combine regions (a dead one's card is a live one's: nothing is ever
      // sent to it, drop_attention below); the second is a barrier.
      std::vector<std::string> blobs(static_cast<size_t>(P));
      if (j.stage == 0) {
        j.card = (*msg)["allgather"].get<std::string>();
        std::string live_card;
        for (int a = 0; a < A; ++a) {
          if (lead(a).dead) continue;
          auto ans = ask_json(lead(a), R"({"op": "card"})");
          if (!ans.ok() || !ans->contains("card")) {
            abandon_join(ans.ok() ? ans->dump() : ans.status().message());
            return ok_status();
          }
          blobs[static_cast<size_t>(a)] = (*ans)["card"].get<std::string>();
          live_card = blobs[static_cast<size_t>(a)];
        }
        for (int a = 0; a < A; ++a) {
          if (lead(a).dead) blobs[static_cast<size_t>(a)] = live_card;
        }
      }
      ++j.stage;
      if (!write_line(j.w.in, Json{{"blobs", blobs}}.dump())) {
        abandon_join("its pipe closed");
        return ok_status();
      }
      continue;
    }
    if (!msg->contains("ready")) {
      abandon_join(line);
      return ok_status();
    }
    // Ready: it serves no dead attention worker, continues the sequence
    // numbers from the units exchanged so far, and from the next step the
    // attention workers send it its experts' share of the rows.
    for (int a = 0; a < A; ++a) {
      if (lead(a).dead) write_line(j.w.in, Json{{"op", "drop_attention"}, {"worker", a}}.dump());
    }
    Json units;
    for (int a = 0; a < A && units.is_null(); ++a) {
      if (lead(a).dead) continue;
      auto ans = ask_json(lead(a), R"({"op": "card"})");
      if (ans.ok() && ans->contains("units")) units = (*ans)["units"];
    }
    auto set = units.is_null() ? StatusOr<Json>(unavailable("no attention worker answered"))
                               : ask_json(j.w, Json{{"op", "units"}, {"served", units}}.dump());
    if (!set.ok() || !set->contains("units_set")) {
      abandon_join(set.ok() ? set->dump() : set.status().message());
      return ok_status();
    }
    Worker& slot = workers_[static_cast<size_t>(c_.attention_processes() + j.w.index)];
    const int w = j.w.index;
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - j.since).count();
    const auto shares = j.shares;
    const std::string card = j.card;
    slot = j.w;  // watched from now on: a death is dropped (or reported) as any worker's
    slot.dead = false;
    slot.rss_mb = msg->value("rss_mb", 0.0);
    joining_.reset();
    c_.placement = c_.placement.with_worker(w, shares).value();
    --experts_lost_;
    ++joined_;
    awaited_.erase(std::remove(awaited_.begin(), awaited_.end(), w), awaited_.end());
    const std::string add =
        Json{{"op", "add_expert"}, {"worker", w}, {"card", card}, {"shares", shares}}.dump();
    for (int a = 0; a < A; ++a) {
      if (lead(a).dead) continue;
      auto ans = ask_json(lead(a), add);
      if (!ans.ok() && lead(a).dead) continue;  // dropped meanwhile
      MSI_RETURN_IF_ERROR(ans.status());
      if (!ans->contains("expert_added")) {
        return internal_error(name_of(lead(a)) + ": " + ans->dump());
      }
    }
    std::fprintf(stderr,
                 "msinfer: router: expert worker %d is back (pid %d, %.2f s after it was "
                 "started): its experts' rows go to it again\n",
                 w, slot.pid, took);
    return ok_status();
  }
  return ok_status();
}

// ---- online rebalancing ----

Status check_rebalancing(const WorkerConfig& c, int experts) {
  if (c.rebalance_every <= 0) return ok_status();
  if (!is_cpu_device(c.expert_device)) {
    return unimplemented("online rebalancing (--rebalance-every) runs on CPU expert workers only");
  }
  if (!(c.rebalance_gain >= 1.0)) return invalid_argument("--rebalance-gain must be >= 1");
  if (!(c.rebalance_fixed_rows >= 0)) {
    return invalid_argument("--rebalance-fixed-rows must be >= 0");
  }
  if (c.rebalance_slots > 0 &&
      static_cast<int64_t>(c.rebalance_slots) * c.expert_workers < experts) {
    return invalid_argument("--rebalance-slots " + std::to_string(c.rebalance_slots) + " x " +
                            std::to_string(c.expert_workers) +
                            " expert workers hold fewer than the " + std::to_string(experts) +
                            " experts");
  }
  return ok_status();
}

Status Router::init_rebalancing() {
  if (c_.rebalance_every <= 0) return ok_status();
  MSI_ASSIGN_OR_RETURN(ModelConfig mc, load_model_config(c_.model_dir));
  MSI_RETURN_IF_ERROR(check_rebalancing(c_, static_cast<int>(mc.experts)));
  layers_ = static_cast<int>(mc.layers);
  moe_layers_ = static_cast<int>(mc.moe_layers);
  experts_ = static_cast<int>(mc.experts);
  slots_ = c_.rebalance_slots;
  for (int w = 0; w < c_.placement.workers; ++w) {
    slots_ = std::max(slots_, static_cast<int>(c_.placement.experts_on(w).size()));
  }
  return ok_status();
}

Status Router::rebalance_tick() {
  if (c_.rebalance_every <= 0) return ok_status();
  // A new placement would put experts on every worker, a dropped one too:
  // rebalancing stops once an expert worker was lost (docs/RUNTIME.md).
  const int lost = experts_lost_;
  if (lost > 0) {
    if (pending_) abandon_rebalance("an expert worker was lost; online rebalancing stops");
    return ok_status();
  }
  Status s = ok_status();
  if (pending_) {
    s = switch_when_loaded();
  } else if (++steps_since_look_ >= c_.rebalance_every) {
    steps_since_look_ = 0;
    s = consider_rebalance();
  }
  if (!s.ok() && experts_lost_ > lost) {  // a worker asked was dropped meanwhile
    if (pending_) abandon_rebalance("an expert worker was lost; online rebalancing stops");
    return ok_status();
  }
  return s;
}

Status Router::consider_rebalance() {
  const int L = layers_, E = experts_, N = c_.expert_workers;
  // Rows per (layer, expert) since the last look (shard 0 of each expert
  // worker counts its experts' rows), added to those since the last decision.
  std::vector<int64_t>& counts = routed_;
  counts.resize(static_cast<size_t>(L) * E, 0);
  routed_steps_ += c_.rebalance_every;
  for (Worker& w : workers_) {
    if (w.role != "expert" || w.tp_rank != 0) continue;
    MSI_ASSIGN_OR_RETURN(Json j, ask_json(w, R"({"op": "routed"})"));
    if (!j.contains("routed") || !j["routed"].is_array() || j["routed"].size() != counts.size()) {
      return internal_error(name_of(w) + ": expected routed rows, got " + j.dump());
    }
    for (size_t i = 0; i < counts.size(); ++i) counts[i] += j["routed"][i].get<int64_t>();
  }
  // Decide on enough rows only: a placement fitted to a handful of rows is
  // fitted to their noise (a window of 16 rows per layer moved experts back
  // and forth at every look).
  // Layers without routed experts (DeepSeek's dense ones) count for nothing.
  int64_t rows = 0;
  for (int64_t n : counts) rows += n;
  if (rows < kRebalanceMinRows * moe_layers_ * N) return ok_status();
  const std::vector<int64_t> window = std::move(counts);
  const int64_t window_steps = routed_steps_;
  counts.assign(window.size(), 0);
  routed_steps_ = 0;
  std::vector<double> totals(static_cast<size_t>(E), 0.0);
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) totals[e] += static_cast<double>(window[l * E + e]);
  }
  // A replica's fixed cost over the window: per layer, and over all layers.
  const double fixed = c_.rebalance_fixed_rows * static_cast<double>(window_steps);
  auto before = balancedness(predicted_worker_loads(window, L, c_.placement, fixed), L, N);
  if (!before) return ok_status();  // nothing routed
  auto candidate = balance_placement(totals, N, slots_, fixed * moe_layers_);
  if (!candidate.ok()) return ok_status();  // e.g. a worker would be left without an expert
  Placement next = std::move(candidate).value();
  next.tp_expert = c_.placement.tp_expert;
  next.tp_expert_reduce = c_.placement.tp_expert_reduce;
  next.tp_attention = c_.placement.tp_attention;
  auto after = balancedness(predicted_worker_loads(window, L, next, fixed), L, N);
  if (!after || *before < *after * c_.rebalance_gain) return ok_status();
  const std::string prepare = Json{{"op", "prepare"}, {"placement", next.to_json()}}.dump();
  int64_t loading = 0;
  for (Worker& w : workers_) {
    if (w.role != "expert") continue;
    MSI_ASSIGN_OR_RETURN(Json j, ask_json(w, prepare));
    if (!j.contains("preparing")) {
      abandon_rebalance(j.value("error", j.dump()));
      return ok_status();
    }
    loading += j["preparing"].get<int64_t>();
  }
  std::fprintf(stderr,
               "msinfer: router: rebalancing: max/mean expert-worker load %.3f -> %.3f "
               "(predicted over the last %lld steps); the expert processes load the %lld expert "
               "slice(s) they lack while serving\n",
               *before, *after, static_cast<long long>(window_steps),
               static_cast<long long>(loading));
  pending_ = std::move(next);
  return ok_status();
}

Status Router::switch_when_loaded() {
  for (Worker& w : workers_) {
    if (w.role != "expert") continue;
    MSI_ASSIGN_OR_RETURN(Json j, ask_json(w, R"({"op": "prepared"})"));
    if (!j.contains("ready")) {
      abandon_rebalance(j.value("error", j.dump()));
      return ok_status();
    }
    if (!j["ready"].get<bool>()) return ok_status();  // look again after the next step
  }
  // Every expert process holds its new experts: switch them all, then the
  // attention workers, before the next step sends a row. A death meanwhile
  // is not dropped in place: the workers would hold two placements.
  switching_ = true;
  struct Done {
    bool& b;
    ~Done() { b = false; }
  } done{switching_};
  for (Worker& w : workers_) {
    if (w.role != "expert") continue;
    MSI_ASSIGN_OR_RETURN(Json j, ask_json(w, R"({"op": "switch"})"));
    if (!j.contains("switched")) return internal_error(name_of(w) + ": " + j.dump());
    w.rss_mb = j.value("rss_mb", w.rss_mb);
  }
  const std::string set = Json{{"op", "placement"}, {"placement", pending_->to_json()}}.dump();
  for (int a = 0; a < c_.attention_workers; ++a) {
    if (lead(a).dead) continue;
    auto j = ask_json(lead(a), set);
    if (!j.ok() && lead(a).dead) continue;  // dropped meanwhile
    MSI_RETURN_IF_ERROR(j.status());
    if (!j->contains("placement_set")) return internal_error(name_of(lead(a)) + ": " + j->dump());
  }
  c_.placement = std::move(*pending_);
  pending_.reset();
  ++rebalances_;
  std::fprintf(stderr, "msinfer: router: rebalanced (%d so far):\n%s", rebalances_,
               c_.placement.describe().c_str());
  return ok_status();
}

StatusOr<RoutingStats> Router::routing(const std::vector<Json>& workers, int layers,
                                       int experts) const {
  MSI_ASSIGN_OR_RETURN(RoutingStats s,
                       RoutingStats::from_workers(workers, c_.placement, layers, experts));
  s.placement_switches = rebalances_;
  return s;
}

StatusOr<Json> Router::ask_json(Worker& w, const std::string& command) {
  MSI_ASSIGN_OR_RETURN(std::string line, ask(w, command, std::chrono::milliseconds(c_.timeout_ms),
                                             "did not answer " + command));
  return parse_json(line, name_of(w));
}

void Router::abandon_rebalance(const std::string& why) {
  std::fprintf(stderr, "msinfer: router: rebalancing abandoned: %s\n", why.c_str());
  for (Worker& w : workers_) {
    if (w.role != "expert" || w.dead) continue;
    (void)ask_json(w, R"({"op": "abandon"})");  // a death is reported at the next step
  }
  pending_.reset();
}

StatusOr<std::vector<Json>> Router::stats(bool reset) {
  return retried_after_restart([&] { return stats_once(reset); });
}

StatusOr<std::vector<Json>> Router::stats_once(bool reset) {
  for (auto& w : workers_) {
    if (w.dead) continue;
    MSI_RETURN_IF_ERROR(send_command(w, Json{{"op", "stats"}, {"reset", reset}}.dump()));
  }
  std::vector<Json> out;
  for (auto& w : workers_) {
    if (w.dead) continue;
    auto line = read_answer(w, std::chrono::milliseconds(c_.timeout_ms),
                            StatusCode::kDeadlineExceeded, "did not report its stats");
    if (!line.ok() && w.dead) continue;  // dropped meanwhile
    MSI_RETURN_IF_ERROR(line.status());
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(*line, name_of(w)));
    if (!j.contains("stats")) return internal_error(name_of(w) + ": expected stats, got " + *line);
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
    if (w.dead) {
      s += name_of(w) + ": dead\n";
      continue;
    }
    s += name_of(w) + ": " + (w.where.empty() ? "pid " + std::to_string(w.pid) : w.where) + rss +
         "\n";
  }
  return s;
}

}  // namespace msinfer::runtime
