#include "msinfer/comm/bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "internal/socket_wire.h"
#include "msinfer/comm/tcp.h"
#include "msinfer/comm/transport.h"
#include "msinfer/core/logging.h"

#ifdef MSINFER_HAVE_MPI
#include <mpi.h>
#endif

namespace msinfer::comm {
namespace {

// Full reads/writes with a deadline; false on error, EOF or timeout.
bool io_all(int fd, void* buf, size_t n, bool write, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    ssize_t r = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (r <= 0) {
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_blob(int fd, const std::string& s, std::chrono::steady_clock::time_point d) {
  uint64_t n = s.size();
  return io_all(fd, &n, 8, true, d) && io_all(fd, const_cast<char*>(s.data()), s.size(), true, d);
}

// Blobs are an address and a region (~100 bytes); a hello is "rank round".
constexpr uint64_t kMaxBlobBytes = 64 << 10, kMaxHelloBytes = 256;

bool recv_blob(int fd, std::string* s, std::chrono::steady_clock::time_point d) {
  uint64_t n = 0;
  if (!io_all(fd, &n, 8, false, d) || n > kMaxBlobBytes) return false;
  s->resize(n);
  return io_all(fd, s->data(), n, false, d);
}

class TcpBootstrap : public Bootstrap {
 public:
  TcpBootstrap(int rank, int world, std::string server, std::string secret,
               std::chrono::milliseconds t)
      : rank_(rank),
        world_(world),
        server_(std::move(server)),
        secret_(std::move(secret)),
        timeout_(t) {}
  int rank() const override { return rank_; }
  int size() const override { return world_; }

  StatusOr<std::vector<std::string>> allgather(const std::string& blob) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    // The server may not be up yet: tcp_connect retries until the deadline.
    auto c = tcp_connect(server_, timeout_);
    if (!c.ok()) return c.status().with_context("bootstrap");
    const int fd = *c;
    const std::string hello =
        std::to_string(rank_) + " " + std::to_string(round_++) + " " + secret_;
    std::vector<std::string> all(world_);
    bool ok = send_blob(fd, hello, deadline) && send_blob(fd, blob, deadline);
    for (int r = 0; ok && r < world_; ++r) ok = recv_blob(fd, &all[r], deadline);
    ::close(fd);
    if (!ok) {
      return Status(StatusCode::kDeadlineExceeded,
                    "bootstrap: rank " + std::to_string(rank_) +
                        " did not get every rank's address within " +
                        std::to_string(timeout_.count()) + " ms (a rank missing or dead?)");
    }
    return all;
  }

 private:
  int rank_, world_;
  std::string server_;  // host:port
  std::string secret_;
  std::chrono::milliseconds timeout_;
  int round_ = 0;
};

#ifdef MSINFER_HAVE_MPI
class MpiBootstrap : public Bootstrap {
 public:
  MpiBootstrap() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  StatusOr<std::vector<std::string>> allgather(const std::string& blob) override {
    int len = static_cast<int>(blob.size());
    std::vector<int> lens(size_), displs(size_);
    MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    std::string buf(total, '\0');
    MPI_Allgatherv(blob.data(), len, MPI_BYTE, buf.data(), lens.data(), displs.data(), MPI_BYTE,
                   MPI_COMM_WORLD);
    std::vector<std::string> out(size_);
    for (int r = 0; r < size_; ++r) out[r] = buf.substr(displs[r], lens[r]);
    return out;
  }

 private:
  int rank_ = 0, size_ = 1;
};
#endif

}  // namespace

Status Bootstrap::barrier() {
  auto r = allgather("");
  return r.ok() ? ok_status() : r.status();
}

std::string new_job_secret() {
  uint8_t b[16];
  size_t got = 0;
  while (got < sizeof(b)) {
    const ssize_t n = ::getrandom(b + got, sizeof(b) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else {
      MSI_CHECK(errno == EINTR) << "getrandom: " << std::strerror(errno);
    }
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t v : b) {
    s += hex[v >> 4];
    s += hex[v & 15];
  }
  return s;
}

bool is_job_secret(const std::string& presented, const std::string& secret) {
  return !secret.empty() && internal::same_secret(presented, secret);
}

StatusOr<std::unique_ptr<BootstrapServer>> BootstrapServer::start(int world,
                                                                  const std::string& host, int port,
                                                                  const std::string& secret) {
  if (world < 1) return invalid_argument("bootstrap server: world must be >= 1");
  auto s = std::unique_ptr<BootstrapServer>(new BootstrapServer());
  s->secret_ = secret.empty() ? new_job_secret() : secret;
  s->world_ = world;
  s->host_ = host;
  auto fd = tcp_listen(host, port, &s->port_);
  if (!fd.ok()) return fd.status().with_context("bootstrap server");
  s->listen_fd_ = *fd;
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

BootstrapServer::~BootstrapServer() {
  stop_ = true;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string BootstrapServer::address() const { return host_ + ":" + std::to_string(port_); }

// One client connection of the server: it sends two length-prefixed blobs
// (hello "rank round", then the rank's blob) and waits for the round's answer.
// Read without blocking, all connections at once, so a silent or slow one
// delays nobody; each must have sent both within kClientDeadline. At most
// kMaxClients wait so (further ones are refused); out of fds at accept, the
// oldest waiting one is closed to make room, or, with none, accepting pauses
// for kAcceptBackoff: the server never spins on a listener it cannot take from.
namespace {
constexpr auto kClientDeadline = std::chrono::seconds(30);
constexpr size_t kMaxClients = 1024;
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

struct Client {
  int fd = -1;
  std::chrono::steady_clock::time_point deadline;
  std::string in;  // bytes received so far
  // The two blobs, once whole; false while incomplete, an error when the
  // client breaks the framing (then it is dropped).
  StatusOr<bool> parse(std::string* hello, std::string* blob) const {
    size_t at = 0;
    std::string* outs[2] = {hello, blob};
    for (int i = 0; i < 2; ++i) {
      if (in.size() - at < 8) return false;
      uint64_t n = 0;
      std::memcpy(&n, in.data() + at, 8);
      if (n > (i == 0 ? kMaxHelloBytes : kMaxBlobBytes)) {
        return invalid_argument("a " + std::to_string(n) + "-byte " + (i == 0 ? "hello" : "blob"));
      }
      if (in.size() - at - 8 < n) return false;
      outs[i]->assign(in, at + 8, n);
      at += 8 + n;
    }
    return true;
  }
};
}  // namespace

// "rank round secret" with a rank of this world and the job's secret.
bool BootstrapServer::parse_hello(const std::string& hello, int* rank, int* round) const {
  char secret[64] = {};
  if (std::sscanf(hello.c_str(), "%d %d %63s", rank, round, secret) != 3) return false;
  return *rank >= 0 && *rank < world_ && *round >= 0 &&
         internal::same_secret(std::string(secret), secret_);
}

void BootstrapServer::serve() {
  // Rounds are kept apart by the round number each client sends.
  struct Round {
    std::vector<int> fds;
    std::vector<std::string> blobs;
    int count = 0;
  };
  std::map<int, Round> rounds;
  std::vector<Client> clients;
  std::vector<pollfd> pfds;
  auto accept_paused_until = std::chrono::steady_clock::time_point{};
  bool warned_fd_limit = false;
  while (!stop_) {
    const bool paused = std::chrono::steady_clock::now() < accept_paused_until;
    pfds.assign(1, pollfd{paused ? -1 : listen_fd_, POLLIN, 0});  // -1: poll skips it
    for (const Client& c : clients) pfds.push_back({c.fd, POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), paused ? 50 : 200) < 0 && errno != EINTR)
      break;  // then look at stop_
    const auto now = std::chrono::steady_clock::now();
    if (pfds[0].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      const int e = fd < 0 ? errno : 0;
      if (fd >= 0 && clients.size() >= kMaxClients) {
        ::close(fd);
      } else if (fd >= 0) {
        clients.push_back({fd, now + kClientDeadline, {}});
      } else if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        if (!warned_fd_limit) {
          MSI_LOG(WARNING) << "bootstrap server: accept: " << errno_text(e)
                           << "; closing the oldest clients without a blob, else pausing accepts "
                           << kAcceptBackoff.count() << " ms at a time (logged once)";
          warned_fd_limit = true;
        }
        if (!clients.empty()) {
          clients.front().deadline = now - std::chrono::seconds(1);  // dropped below
        } else {
          accept_paused_until = now + kAcceptBackoff;
        }
      }
    }
    std::vector<Client> next;
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      bool drop = now > c.deadline;
      if (!drop && i + 1 < pfds.size() && (pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          drop = true;
        }
      }
      std::string hello, blob;
      auto whole = drop ? StatusOr<bool>(false) : c.parse(&hello, &blob);
      int rank = -1, round = -1;
      if (!whole.ok() || (*whole && !parse_hello(hello, &rank, &round))) drop = true;
      if (drop) {
        ::close(c.fd);
        continue;
      }
      if (!*whole) {
        next.push_back(std::move(c));
        continue;
      }
      Round& r = rounds[round];
      if (r.fds.empty()) {
        r.fds.assign(world_, -1);
        r.blobs.assign(world_, "");
      }
      if (r.fds[rank] >= 0)
        ::close(r.fds[rank]);  // a retry replaces the earlier connection
      else
        ++r.count;
      r.fds[rank] = c.fd;
      r.blobs[rank] = std::move(blob);
      if (r.count == world_) {
        // Small answers (every rank's address): the socket buffers take them.
        const auto d = now + std::chrono::seconds(2);
        for (int k = 0; k < world_; ++k) {
          for (int j = 0; j < world_; ++j) send_blob(r.fds[k], r.blobs[j], d);
          ::close(r.fds[k]);
        }
        rounds.erase(round);
      }
    }
    clients = std::move(next);
  }
  for (const Client& c : clients) ::close(c.fd);
  for (auto& [_, r] : rounds) {
    for (int fd : r.fds) {
      if (fd >= 0) ::close(fd);
    }
  }
}

StatusOr<std::unique_ptr<Bootstrap>> make_tcp_bootstrap(int rank, int world,
                                                        const std::string& server,
                                                        const std::string& secret,
                                                        std::chrono::milliseconds timeout) {
  if (server.rfind(':') == std::string::npos) {
    return invalid_argument("bootstrap: expected host:port, got '" + server + "'");
  }
  if (rank < 0 || rank >= world) return invalid_argument("bootstrap: rank out of range");
  return std::unique_ptr<Bootstrap>(new TcpBootstrap(rank, world, server, secret, timeout));
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_RANK") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

int local_process_count(int world) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local == nullptr) local = std::getenv("SLURM_NTASKS_PER_NODE");
  return local != nullptr ? std::max(1, std::atoi(local)) : std::max(1, world);
}

bool oversubscribed(int local_processes) {
  return local_processes > std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

std::string local_address() {
  if (const char* a = std::getenv("MSINFER_ADDRESS"); a != nullptr && *a != '\0') return a;
  std::string found = "127.0.0.1";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) {
      found = buf;
      break;
    }
  }
  ::freeifaddrs(list);
  return found;
}

#ifdef MSINFER_HAVE_MPI
StatusOr<std::unique_ptr<Bootstrap>> make_mpi_bootstrap() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    // MPI_Finalize is collective: when a rank died (a deployment that
    // survived it, under mpirun --enable-recovery) it can wait for that rank
    // forever. It gets 5 s (it takes milliseconds otherwise); then the
    // process exits with its own status without it.
    ::on_exit(
        [](int status, void*) {
          int fin = 0;
          MPI_Finalized(&fin);
          if (fin) return;
          auto done = std::make_shared<std::atomic<bool>>(false);
          std::thread([done] {
            MPI_Finalize();
            *done = true;
          }).detach();
          for (int i = 0; i < 500 && !*done; ++i) ::usleep(10000);
          if (!*done) {
            std::fflush(nullptr);
            ::_exit(status);
          }
        },
        nullptr);
  }
  return std::unique_ptr<Bootstrap>(new MpiBootstrap());
}
#endif

StatusOr<std::unique_ptr<Bootstrap>> make_bootstrap_from_env() {
  const char* server = std::getenv("MSINFER_BOOTSTRAP");
  if (server != nullptr) {
    const char* rank = std::getenv("MSINFER_RANK");
    const char* world = std::getenv("MSINFER_WORLD_SIZE");
    const char* secret = std::getenv("MSINFER_JOB_SECRET");
    if (!rank || !world || !secret) {
      return invalid_argument(
          "MSINFER_BOOTSTRAP needs MSINFER_RANK, MSINFER_WORLD_SIZE and MSINFER_JOB_SECRET");
    }
    return make_tcp_bootstrap(std::atoi(rank), std::atoi(world), server, secret);
  }
#ifdef MSINFER_HAVE_MPI
  if (launched_by_mpi()) return make_mpi_bootstrap();
#endif
  return failed_precondition(
      "no bootstrap: set MSINFER_BOOTSTRAP=host:port, MSINFER_RANK, MSINFER_WORLD_SIZE, or launch "
      "with mpirun / srun");
}

}  // namespace msinfer::comm
