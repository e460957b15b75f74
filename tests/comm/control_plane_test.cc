// The control plane's sockets (tcp.h) and the bootstrap rendezvous
// (bootstrap.h) against peers that do not behave: a listener that never
// accepts, a client that connects and says nothing.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/tcp.h"

namespace msinfer::comm {
namespace {

// Runs `body` in a child process and waits up to `limit` for it to exit;
// returns its exit status, or -1 if it was still running (then it is killed).
template <typename F>
int run_in_child(F body, std::chrono::milliseconds limit) {
  int fds[2];
  if (::pipe(fds) != 0) return -2;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    const int rc = body();
    const char c = static_cast<char>(rc);
    (void)!::write(fds[1], &c, 1);
    ::_exit(rc);
  }
  ::close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  int result = -1;
  if (::poll(&p, 1, static_cast<int>(limit.count())) == 1) {
    char c = 0;
    if (::read(fds[0], &c, 1) == 1) result = c;
  }
  ::close(fds[0]);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return result;
}

// A listener that never accepts, its accept queue filled by other
// connections: a further SYN is dropped and connect() would retry for ~127 s.
TEST(TcpTest, ConnectHonoursItsTimeoutAgainstAFullBacklog) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::vector<int> fillers;
  for (int i = 0; i < 8; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    fillers.push_back(fd);
  }
  const std::string where = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  // 0: gave up with an error; 1: connected (the backlog was not full).
  const int rc = run_in_child(
      [&] {
        auto fd = tcp_connect(where, std::chrono::milliseconds(500));
        return fd.ok() ? 1 : 0;
      },
      std::chrono::seconds(20));
  for (int fd : fillers) ::close(fd);
  ::close(listener);
  EXPECT_NE(rc, -1) << "tcp_connect with a 500 ms timeout was still blocked after 20 s";
  EXPECT_EQ(rc, 0);
}

TEST(TcpTest, ConnectToNobodyFailsAfterTheTimeout) {
  int port = 0;
  auto fd = tcp_listen("127.0.0.1", 0, &port);
  ASSERT_TRUE(fd.ok());
  ::close(*fd);  // nobody listens there now
  auto c = tcp_connect("127.0.0.1:" + std::to_string(port), std::chrono::milliseconds(100));
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
}

std::string framed(const std::string& s) {
  const uint64_t n = s.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + s;
}

// A client that connects to the bootstrap server and says nothing must not
// hold up the ranks (the server served one client at a time, with 10 s each).
TEST(BootstrapServerTest, ASilentClientDelaysNobody) {
  auto server = BootstrapServer::start(2);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto silent = tcp_connect((*server)->address(), std::chrono::seconds(2));
  ASSERT_TRUE(silent.ok());
  std::vector<std::string> got[2];
  Status status[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto b = make_tcp_bootstrap(r, 2, (*server)->address(), (*server)->secret(),
                                  std::chrono::seconds(5));
      if (!b.ok()) {
        status[r] = b.status();
        return;
      }
      auto all = (*b)->allgather("blob of " + std::to_string(r));
      status[r] = all.status();
      if (all.ok()) got[r] = *all;
    });
  }
  for (auto& t : ranks) t.join();
  ::close(*silent);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r].to_string();
    EXPECT_EQ(got[r], (std::vector<std::string>{"blob of 0", "blob of 1"}));
  }
}

// A blob far larger than any address is refused at its length: the server
// closes the connection instead of waiting for (and buffering) megabytes.
TEST(BootstrapServerTest, AnOversizedBlobIsRefusedAtOnce) {
  auto server = BootstrapServer::start(2);
  ASSERT_TRUE(server.ok());
  auto fd = tcp_connect((*server)->address(), std::chrono::seconds(2));
  ASSERT_TRUE(fd.ok());
  const std::string msg =
      framed("0 0 " + (*server)->secret()) + std::string("\0\0\x20\0\0\0\0\0", 8);  // 2 MiB follow
  ASSERT_EQ(::send(*fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
  pollfd p{*fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the server kept the connection open";
  char c;
  EXPECT_EQ(::recv(*fd, &c, 1, 0), 0) << "expected the server to close the connection";
  ::close(*fd);
}

// Only the job's ranks take part: a client without the job's secret, or with
// another, neither joins a round nor replaces a rank's blob ("a retry").
TEST(BootstrapServerTest, ClientsWithoutTheJobsSecretAreDropped) {
  auto server = BootstrapServer::start(2);
  ASSERT_TRUE(server.ok());
  EXPECT_EQ((*server)->secret().size(), 32u);
  auto other = BootstrapServer::start(1);
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*server)->secret(), (*other)->secret()) << "every job gets a secret of its own";
  // An intruder claims rank 1 of round 0, with no secret and with a wrong one.
  std::vector<int> intruders;
  for (const std::string& hello : {std::string("1 0"), "1 0 " + (*other)->secret()}) {
    auto fd = tcp_connect((*server)->address(), std::chrono::seconds(2));
    ASSERT_TRUE(fd.ok());
    const std::string msg = framed(hello) + framed("intruder's address");
    ASSERT_EQ(::send(*fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    pollfd p{*fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the server kept a connection without the secret";
    char c;
    EXPECT_EQ(::recv(*fd, &c, 1, 0), 0);
    intruders.push_back(*fd);
  }
  // The real ranks still meet, and see each other's blobs only.
  std::vector<std::string> got[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto b = make_tcp_bootstrap(r, 2, (*server)->address(), (*server)->secret(),
                                  std::chrono::seconds(5));
      auto all = b.ok() ? (*b)->allgather("rank " + std::to_string(r))
                        : StatusOr<std::vector<std::string>>(b.status());
      if (all.ok()) got[r] = *all;
    });
  }
  for (auto& t : ranks) t.join();
  for (int fd : intruders) ::close(fd);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(got[r], (std::vector<std::string>{"rank 0", "rank 1"}));
  // A rank with the wrong secret gets nothing.
  auto wrong = make_tcp_bootstrap(0, 1, (*server)->address(), (*other)->secret(),
                                  std::chrono::milliseconds(500));
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE((*wrong)->allgather("x").ok());
}

// ---- Issue 43: out of fds at accept is transient, not the end of a listener.

// Lowers this process's soft RLIMIT_NOFILE so that at most `room` more fds
// can be opened (the kernel hands out the lowest free number; open ones above
// the limit stay valid). For a child process only.
bool leave_fds(int room) {
  const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (lowest_free < 0) return false;
  ::close(lowest_free);
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
  r.rlim_cur = static_cast<rlim_t>(lowest_free + room);
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0;
}

// tcp_accept with no fd to spare waits out its timeout (DEADLINE_EXCEEDED,
// what its callers take for "nobody yet") instead of failing: the launched
// router took "accept: Too many open files" for a fatal error.
TEST(TcpTest, AcceptOutOfFdsIsADeadlineNotAnError) {
  int port = 0;
  auto listener = tcp_listen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok());
  auto client = tcp_connect("127.0.0.1:" + std::to_string(port), std::chrono::seconds(2));
  ASSERT_TRUE(client.ok());
  const int rc = run_in_child(
      [&] {
        if (!leave_fds(0)) return 3;
        auto fd = tcp_accept(*listener, std::chrono::milliseconds(300));
        if (fd.ok()) return 4;  // the limit was not reached
        return fd.status().code() == StatusCode::kDeadlineExceeded ? 0 : 1;
      },
      std::chrono::seconds(20));
  EXPECT_EQ(rc, 0) << "1: an error other than a deadline; 3: setrlimit; 4: accepted";
  // The connection waited in the backlog: with fds to spare it is taken.
  auto fd = tcp_accept(*listener, std::chrono::seconds(5));
  EXPECT_TRUE(fd.ok()) << fd.status().to_string();
  if (fd.ok()) ::close(*fd);
  ::close(*client);
  ::close(*listener);
}

// A bootstrap server whose process runs out of fds to silent connections
// still serves a rank: it closes the oldest silent one to make room, where
// it used to spin on the listener until their 30 s deadline. The server
// runs in a child with room for 10 more fds; 40 silent connections come
// first, then the rank, which must meet within its 10 s timeout.
TEST(BootstrapServerTest, OutOfFdsTheServerStillServesARank) {
  int to_parent[2], hold[2];
  ASSERT_EQ(::pipe2(to_parent, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(hold, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(to_parent[0]);
    ::close(hold[1]);
    auto server = BootstrapServer::start(1);
    if (!server.ok() || !leave_fds(10)) ::_exit(3);
    const std::string line = (*server)->address() + " " + (*server)->secret() + "\n";
    if (::write(to_parent[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      ::_exit(4);
    }
    char c;
    (void)!::read(hold[0], &c, 1);  // serves until the parent closes its end
    ::_exit(0);
  }
  ::close(to_parent[1]);
  ::close(hold[0]);
  struct Reaper {
    pid_t pid;
    int hold;
    ~Reaper() {
      ::close(hold);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{child, hold[1]};
  char buf[256];
  ssize_t n = 0;
  pollfd p{to_parent[0], POLLIN, 0};
  if (::poll(&p, 1, 20000) == 1) n = ::read(to_parent[0], buf, sizeof(buf));
  ::close(to_parent[0]);
  ASSERT_GT(n, 0) << "the child's server did not start";
  std::istringstream words(std::string(buf, static_cast<size_t>(n)));
  std::string address, secret;
  words >> address >> secret;

  std::vector<int> silent;
  for (int i = 0; i < 40; ++i) {
    auto fd = tcp_connect(address, std::chrono::seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    silent.push_back(*fd);
  }
  auto rank = make_tcp_bootstrap(0, 1, address, secret, std::chrono::seconds(10));
  ASSERT_TRUE(rank.ok());
  auto all = (*rank)->allgather("the rank's blob");
  for (int fd : silent) ::close(fd);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(*all, std::vector<std::string>{"the rank's blob"});
}

}  // namespace
}  // namespace msinfer::comm
