// The floor under a streaming server's cost per token on this machine: what
// one small write to each of S loopback TCP connections costs, per step, with
// nothing else done (no HTTP, no JSON, no engine). scripts/bench-serve-overhead
// runs it next to `msinfer serve` so that the HTTP loop's CPU time per token
// reads against the kernel's own cost of delivering a token.
//
// On loopback the receiver's TCP processing and its wake-up run inside the
// sender's send(), so the sender's CPU time per write is the cost a server pays
// for each streamed event, whatever its own code does.
//
//   loopback_send_bench STREAMS STEPS BYTES [GAP_US]
//
// Opens STREAMS connections to itself on 127.0.0.1 (TCP_NODELAY on both ends,
// as serve and bench serve set it); the main thread writes BYTES to each
// connection in turn, STEPS times, pausing GAP_US microseconds between steps
// (an engine step: the reader drains and sleeps, as a client between tokens);
// one reader thread drains every connection through epoll, as bench serve's
// client does. Prints one JSON object: the writer's and the reader's CPU time
// per write (CLOCK_THREAD_CPUTIME_ID), the wall time, and the wall time per
// connection of opening them (socket, connect, accept, TCP_NODELAY on both
// ends, one after another on one thread). Standalone: POSIX
// only, built by the script with g++.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "loopback_send_bench: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void no_delay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) die("TCP_NODELAY");
}

long arg(char** argv, int i, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "loopback_send_bench: argument %d: expected %ld..%ld, got '%s'\n", i, lo,
                 hi, argv[i]);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr, "usage: loopback_send_bench STREAMS STEPS BYTES [GAP_US]\n");
    return 2;
  }
  const long streams = arg(argv, 1, 1, 4096), steps = arg(argv, 2, 1, 1 << 24);
  const long bytes = arg(argv, 3, 1, 1 << 20), gap_us = argc > 4 ? arg(argv, 4, 0, 1000000) : 0;

  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0) die("bind");
  if (listen(lfd, static_cast<int>(streams)) != 0) die("listen");
  if (getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) die("getsockname");

  // Opening the connections is timed too: the kernel's work for a client's
  // connect and a server's accept of one connection (the handshake runs
  // inside connect() on loopback), with nothing else done, on one cpu: the
  // floor under what fresh connections add to a server's run.
  std::vector<int> writers, readers;
  const auto o0 = std::chrono::steady_clock::now();
  for (long i = 0; i < streams; ++i) {
    const int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0) die("socket");
    if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) die("connect");
    const int s = accept(lfd, nullptr, nullptr);
    if (s < 0) die("accept");
    no_delay(c);
    no_delay(s);
    readers.push_back(c);
    writers.push_back(s);
  }
  const double open_wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - o0).count();
  close(lfd);

  const long long total = static_cast<long long>(streams) * steps * bytes;
  std::atomic<double> reader_cpu{0};
  std::thread reader([&] {
    const int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    for (int fd : readers) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
    }
    std::vector<char> buf(1 << 16);
    std::vector<epoll_event> evs(256);
    const double c0 = thread_cpu_s();
    long long got = 0;
    while (got < total) {
      const int n = epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), -1);
      if (n < 0 && errno != EINTR) die("epoll_wait");
      for (int i = 0; i < n; ++i) {
        const ssize_t r = read(evs[i].data.fd, buf.data(), buf.size());
        if (r < 0 && errno != EAGAIN && errno != EINTR) die("read");
        if (r == 0) die("peer closed");
        if (r > 0) got += r;
      }
    }
    reader_cpu = thread_cpu_s() - c0;
    close(ep);
  });

  const std::string chunk(static_cast<size_t>(bytes), 'x');
  double send_cpu = 0;
  const auto w0 = std::chrono::steady_clock::now();
  for (long step = 0; step < steps; ++step) {
    const double c0 = thread_cpu_s();
    for (int fd : writers) {
      for (size_t off = 0; off < chunk.size();) {
        const ssize_t r = send(fd, chunk.data() + off, chunk.size() - off, MSG_NOSIGNAL);
        if (r < 0 && errno != EINTR) die("send");
        if (r > 0) off += static_cast<size_t>(r);
      }
    }
    send_cpu += thread_cpu_s() - c0;
    if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
  }
  reader.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  for (int fd : writers) close(fd);
  for (int fd : readers) close(fd);

  const double sends = static_cast<double>(streams) * static_cast<double>(steps);
  std::printf(
      "{\"streams\": %ld, \"steps\": %ld, \"bytes\": %ld, \"gap_us\": %ld, "
      "\"send_cpu_us_per_write\": %.3f, \"reader_cpu_us_per_write\": %.3f, "
      "\"wall_s\": %.3f, \"open_us_per_connection\": %.2f}\n",
      streams, steps, bytes, gap_us, 1e6 * send_cpu / sends, 1e6 * reader_cpu.load() / sends, wall,
      1e6 * open_wall / static_cast<double>(streams));
  return 0;
}
