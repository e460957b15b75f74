#include "internal/worker_set.h"

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
#include <cstdlib>
#include <cstring>
#include <map>

#include "internal/line_io.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/comm/tcp.h"
#include "msinfer/kernels/cpu/threads.h"

extern char** environ;

namespace msinfer::runtime::internal {

void WorkerProcess::close_channel() {
  if (in >= 0) ::close(in);
  if (out >= 0 && out != in) ::close(out);
  in = out = -1;
}

void WorkerProcess::reaped() {
  pid = -1;
  if (pidfd >= 0) ::close(pidfd);
  pidfd = -1;
}

RankRole role_of(const WorkerConfig& c, int r) {
  if (r >= c.processes()) return RankRole{WorkerRole::kPrefill, r - c.processes(), 0};
  if (r < c.attention_processes()) {
    return RankRole{WorkerRole::kAttention, r / c.tp_attention, r % c.tp_attention};
  }
  const int e = r - c.attention_processes();
  return RankRole{WorkerRole::kExpert, e / c.tp_expert, e % c.tp_expert};
}

namespace {

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

// The environment of a worker of `role`: this process's, plus for bootstrap
// rank `rank` (none for a prefill worker: rank < 0) the rendezvous (the
// bootstrap server, or MSINFER_JOIN for a replacement).
std::vector<std::string> worker_env(const WorkerConfig& c, WorkerRole role, int rank, bool join,
                                    const comm::BootstrapServer* server) {
  const int P = c.processes() + c.prefill_workers;
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
  if (env.emplace("OMP_WAIT_POLICY", "PASSIVE").second) {
    // msinfer's own bounded spin (kernels/cpu/threads.h), which this
    // process got from main(), would win over PASSIVE's none in libgomp:
    // the workers sleep at once, as measured.
    auto spin = env.find("GOMP_SPINCOUNT");
    if (spin != env.end() && spin->second == kernels::cpu::kOpenmpSpinCount) env.erase(spin);
  }
  // A plan's per-role thread counts (msinfer plan --devices cpu) win over both.
  const int role_threads = role == WorkerRole::kAttention ? c.attention_threads
                           : role == WorkerRole::kExpert  ? c.expert_threads
                                                          : 0;
  if (role_threads > 0) env["OMP_NUM_THREADS"] = std::to_string(role_threads);
  if (rank < 0) {
    env.erase("MSINFER_BOOTSTRAP");
    env.erase("MSINFER_JOIN");
    env.erase("MSINFER_RANK");
    env.erase("MSINFER_WORLD_SIZE");
  } else if (join) {
    env.erase("MSINFER_BOOTSTRAP");
    env["MSINFER_JOIN"] = "1";
  } else {
    env["MSINFER_BOOTSTRAP"] = server->address();
    env["MSINFER_JOB_SECRET"] = server->secret();  // as NCCL hands out its unique id
    env.erase("MSINFER_JOIN");
  }
  if (rank >= 0) {
    env["MSINFER_RANK"] = std::to_string(rank);
    env["MSINFER_WORLD_SIZE"] = std::to_string(c.processes());
  }
  std::vector<std::string> env_lines;
  for (const auto& [k, v] : env) env_lines.push_back(k + "=" + v);
  return env_lines;
}

}  // namespace

Status WorkerSet::spawn(const std::string& exe) {
  workers_.clear();
  MSI_ASSIGN_OR_RETURN(server_, comm::BootstrapServer::start(c_.processes()));
  ::signal(SIGPIPE, SIG_IGN);
  for (int rank = 0; rank < c_.processes(); ++rank) {
    MSI_ASSIGN_OR_RETURN(WorkerProcess w, fork_worker(rank, exe, c_.placement, /*join=*/false));
    workers_.push_back(w);
  }
  // Prefill workers after the ranks (prefill(p)): no bootstrap of theirs.
  for (int p = 0; p < c_.prefill_workers; ++p) {
    MSI_ASSIGN_OR_RETURN(WorkerProcess w, fork_prefill_worker(p, exe));
    workers_.push_back(w);
  }
  return ok_status();
}

StatusOr<WorkerProcess> WorkerSet::fork_prefill_worker(int p, const std::string& exe) {
  const RankRole role{WorkerRole::kPrefill, p, 0};
  control::Configure configure{c_, role.role, p, 0};
  return fork_process(role, exe, control::encode(configure),
                      worker_env(c_, role.role, /*rank=*/-1, /*join=*/false, nullptr));
}

StatusOr<WorkerProcess> WorkerSet::fork_worker(int rank, const std::string& exe,
                                               const Placement& placement, bool join) {
  const RankRole role = role_of(c_, rank);
  // Its configuration is the first line on its command pipe (fork_process):
  // the pipe holds it until the worker reads it.
  control::Configure configure{c_, role.role, role.index, role.tp_rank};
  configure.config.placement = placement;
  return fork_process(role, exe, control::encode(configure),
                      worker_env(c_, role.role, rank, join, server_.get()));
}

StatusOr<WorkerProcess> WorkerSet::fork_process(const RankRole& role, const std::string& exe,
                                                const std::string& configuration,
                                                std::vector<std::string> env_lines) {
  WorkerProcess w;
  w.role = role.role;
  w.index = role.index;
  w.tp_rank = role.tp_rank;
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    return internal_error("router: pipe failed");
  }
  std::vector<std::string> args = {exe, "worker"};
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
  if (!write_line(w.in, configuration)) {
    // It died before reading a line (next_death reports how).
    std::fprintf(stderr, "msinfer: router: cannot configure %s\n", name_of(w).c_str());
  }
  return w;
}

bool WorkerSet::send(WorkerProcess& w, const control::Command& c) {
  return !w.dead && w.in >= 0 && write_line(w.in, control::encode(c));
}

void WorkerSet::wait(const WorkerProcess* w, int ms) const {
  std::vector<pollfd> fds;
  if (w != nullptr && !w->dead && w->out >= 0) fds.push_back({w->out, POLLIN, 0});
  for (const WorkerProcess& o : workers_) {
    if (o.pidfd >= 0) fds.push_back({o.pidfd, POLLIN, 0});
  }
  ::poll(fds.data(), fds.size(), ms);
}

std::optional<WorkerDeath> WorkerSet::next_death() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerProcess& w = workers_[i];
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
      char ch;
      const ssize_t n = ::recv(w.out, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n != 0 && !(n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) continue;
      how = "(" + w.where + ") closed its connection: it exited or its host is unreachable";
    } else {
      continue;
    }
    return WorkerDeath{i, name_of(w) + " " + how, code};
  }
  return std::nullopt;
}

void WorkerSet::stop(bool graceful) {
  for (auto& w : workers_) {
    if (w.in >= 0 && graceful) send(w, control::Exit{});
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
      for (int i = 0; i < 20 && !eof; ++i) internal::read_line(w.out, &w.buf, &line, 100, &eof);
    }
    w.close_channel();
  }
  comm::remove_dead_shm_endpoints();  // those of workers that were killed
}

int WorkerSet::live_attention_workers() const {
  int n = 0;
  for (int a = 0; a < c_.attention_workers; ++a) n += lead(a).dead ? 0 : 1;
  return n;
}

pid_t WorkerSet::pid_of(WorkerRole role, int index) const {
  for (const WorkerProcess& w : workers_) {
    if (w.role == role && w.index == index && w.tp_rank == 0) return w.pid;  // -1 once reaped
  }
  return -1;
}

int WorkerSet::live_prefill_workers() const {
  int n = 0;
  for (int p = 0; p < c_.prefill_workers; ++p) n += prefill(p).dead ? 0 : 1;
  return n;
}

std::string WorkerSet::name_of(const WorkerProcess& w) const {
  if (w.role == WorkerRole::kPrefill) return "prefill worker " + std::to_string(w.index);
  if (w.role == WorkerRole::kExpert) return expert_process_name(w.index, w.tp_rank, c_.tp_expert);
  return attention_process_name(w.index, w.tp_rank, c_.tp_attention);
}

std::string WorkerSet::describe() const {
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

// ---- under a launcher (mpirun / srun) ----
//
// Rank 0 (router) listens on this host's address for control connections and
// runs the bootstrap server of the workers' M2N wiring; one launcher allgather
// tells every rank both addresses. Each worker connects, says who it is
// (control::Hello), then bootstraps its M2N endpoint through the router's
// server as rank (launcher rank - 1) and serves commands on the socket
// exactly as over the pipes of a local deployment.

Status check_launcher_size(const WorkerConfig& c, const comm::Bootstrap& launcher) {
  const int need = 1 + c.processes() + c.prefill_workers;
  if (launcher.size() != need) {
    return invalid_argument(
        "the launcher started " + std::to_string(launcher.size()) +
        " ranks; this deployment needs 1 router + " + std::to_string(c.attention_processes()) +
        " attention + " + std::to_string(c.expert_processes()) + " expert worker processes" +
        (c.prefill_workers > 0 ? " + " + std::to_string(c.prefill_workers) + " prefill workers"
                               : std::string()) +
        " = " + std::to_string(need) + " (e.g. mpirun -np " + std::to_string(need) + ")");
  }
  return ok_status();
}

namespace {

std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

}  // namespace

// A control connection whose Hello has not arrived yet.
struct WorkerSet::PendingHello {
  int fd;
  std::string buf;
  std::chrono::steady_clock::time_point deadline;
};

// The Hello on `p`: the rank it names takes the connection. Connections that
// do not present the job's secret are ignored (closed); a bad rank or protocol
// is an error.
Status WorkerSet::take_hello(PendingHello& p, const std::string& line, int* joined) {
  const int P = c_.processes() + c_.prefill_workers;
  auto hello = control::decode_hello(line, "worker hello");
  if (!hello.ok() || !comm::is_job_secret(hello->secret, server_->secret())) {
    ::close(p.fd);  // not one of the job's ranks: ignored
    return ok_status();
  }
  const int64_t rank = hello->rank;
  if (rank < 1 || rank > P || workers_[rank - 1].in >= 0) {
    ::close(p.fd);
    return invalid_argument("router: a worker connected with a bad hello (rank " +
                            std::to_string(rank) + ")");
  }
  WorkerProcess& w = workers_[rank - 1];
  w.where = "rank " + std::to_string(rank) + " on " + (hello->host.empty() ? "?" : hello->host) +
            " (" + (hello->address.empty() ? "?" : hello->address) + ", pid " +
            std::to_string(hello->pid) + ")";
  Status version = control::check_protocol(hello->protocol, name_of(w) + " (" + w.where + ")");
  if (!version.ok()) {
    ::close(p.fd);
    return version;
  }
  w.in = w.out = p.fd;
  w.buf = std::move(p.buf);
  ++*joined;
  return ok_status();
}

Status WorkerSet::accept_launched(comm::Bootstrap& launcher) {
  MSI_RETURN_IF_ERROR(check_launcher_size(c_, launcher));
  // The M2N ranks bootstrap through the server; prefill workers (the last
  // ranks) only connect for commands.
  const int P = c_.processes() + c_.prefill_workers;
  const std::string host = comm::local_address();
  MSI_ASSIGN_OR_RETURN(server_, comm::BootstrapServer::start(c_.processes(), host));
  int port = 0;
  MSI_ASSIGN_OR_RETURN(const int listen_fd, comm::tcp_listen(host, 0, &port));
  ::signal(SIGPIPE, SIG_IGN);
  // The launcher's own channel (MPI / PMIx) carries the job's secret to the
  // ranks; the bootstrap server and the control socket require it.
  // It carries rank 0's choice of expert reduction too, which may come from a
  // probe of rank 0's machine (the ranks must agree; `msinfer` decides on rank 0).
  auto gathered =
      launcher.allgather(server_->address() + " " + host + ":" + std::to_string(port) + " " +
                         server_->secret() + " " + expert_reduce_name(c_.tp_expert_reduce));
  if (!gathered.ok()) {
    ::close(listen_fd);
    return gathered.status();
  }
  workers_.assign(static_cast<size_t>(P), WorkerProcess{});
  for (int i = 0; i < P; ++i) {
    const RankRole role = role_of(c_, i);
    workers_[i].role = role.role;
    workers_[i].index = role.index;
    workers_[i].tp_rank = role.tp_rank;
  }
  // Control connections are accepted and their hellos read all at once,
  // without blocking: a silent stray connection delays no worker's join and
  // is dropped after 30 s (or 64 KiB without a line). At most
  // kMaxPendingHellos wait so; a new one closes the oldest, so a flood of
  // them cannot use up the fds (a rank sends its hello as it connects: it
  // waits one pass of this loop, not 30 s).
  constexpr size_t kMaxPendingHellos = 256;
  using clock = std::chrono::steady_clock;
  std::vector<PendingHello> pending;
  Status s = ok_status();
  int joined = 0;
  auto next_join_by = clock::now() + std::chrono::seconds(120);
  while (joined < P && s.ok()) {
    if (clock::now() > next_join_by) {
      s = Status(StatusCode::kDeadlineExceeded, "router: only " + std::to_string(joined) + " of " +
                                                    std::to_string(P) +
                                                    " workers connected (none in the last 120 s)");
      break;
    }
    auto fd = comm::tcp_accept(listen_fd, std::chrono::milliseconds(50));
    if (fd.ok()) {
      if (pending.size() >= kMaxPendingHellos) {
        ::close(pending.front().fd);
        pending.erase(pending.begin());
      }
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
      PendingHello p = std::move(pending[i]);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      const int before = joined;
      s = take_hello(p, line, &joined);
      if (joined > before) next_join_by = clock::now() + std::chrono::seconds(120);
    }
  }
  for (const PendingHello& p : pending) ::close(p.fd);
  ::close(listen_fd);
  return s;
}

}  // namespace msinfer::runtime::internal

namespace msinfer::runtime {

using internal::host_name;
using internal::RankRole;
using internal::read_line;
using internal::role_of;
using internal::write_line;

Status join_launched_deployment(const WorkerConfig& config, comm::Bootstrap& launcher) {
  MSI_RETURN_IF_ERROR(internal::check_launcher_size(config, launcher));
  const int rank = launcher.rank();
  if (rank < 1) return invalid_argument("join_launched_deployment: rank 0 is the router");
  MSI_ASSIGN_OR_RETURN(auto all, launcher.allgather(""));
  std::istringstream addrs(all[0]);
  std::string bootstrap, control, secret, reduce;
  addrs >> bootstrap >> control >> secret >> reduce;
  MSI_ASSIGN_OR_RETURN(const ExpertReduce rank0_reduce,
                       parse_expert_reduce(reduce, "rank 0's expert reduction"));
  MSI_ASSIGN_OR_RETURN(const int fd, comm::tcp_connect(control, std::chrono::seconds(60)));
  write_line(fd,
             control::encode(control::Hello{rank, ::getpid(), host_name(), comm::local_address(),
                                            secret, control::kProtocolVersion}));
  WorkerConfig c = config;
  c.tp_expert_reduce = rank0_reduce;
  if (c.tp_expert > 1) c.placement.tp_expert_reduce = rank0_reduce;
  // Transports that cross hosts bind the address peers reach this host by.
  if (c.address.empty() && !comm::transport_within_host(c.transport)) {
    c.address = comm::local_address();
  }
  // As the local router does for its children: share this host's cores among
  // the ranks on it; OMP_NUM_THREADS in the environment wins, a plan's
  // per-role count over both. Set through the kernels, not the environment:
  // OpenMP read its environment when the process started. (Its idle threads
  // spin only briefly: msinfer's main() bounds GOMP_SPINCOUNT.)
  const long per_host = comm::local_process_count(1);
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const int A = c.attention_processes(), N = c.expert_processes();
  const RankRole role = role_of(c, rank - 1);  // launcher rank 0 is the router
  const int role_threads = role.role == WorkerRole::kAttention ? c.attention_threads
                           : role.role == WorkerRole::kExpert  ? c.expert_threads
                                                               : 0;
  if (role_threads > 0) {
    kernels::cpu::set_compute_threads(role_threads);
  } else if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    kernels::cpu::set_compute_threads(static_cast<int>(std::max(1L, cores / per_host)));
  }
  if (role.role == WorkerRole::kPrefill) {
    // No M2N rank: the router hands it the attention workers' K/V regions.
    Status s = run_prefill_worker(c, role.index, fd, fd);
    ::close(fd);
    return s;
  }
  MSI_ASSIGN_OR_RETURN(auto boot, comm::make_tcp_bootstrap(rank - 1, A + N, bootstrap, secret));
  Status s = role.role == WorkerRole::kAttention
                 ? run_attention_worker(c, role.index, role.tp_rank, *boot, fd, fd)
                 : run_expert_worker(c, role.index, role.tp_rank, *boot, fd, fd);
  ::close(fd);
  return s;
}

}  // namespace msinfer::runtime
