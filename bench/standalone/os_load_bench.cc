// A load of one kind of system call, to run on one cpu while something is
// timed on another: what that kind of work costs the other cpu through what
// they share (the caches, the kernel, a VM's hypervisor). Run it beside the
// offline engine to see which of a server's system calls slow the engine's
// steps (docs/BENCHMARKS.md, "What the other cpu's system calls cost").
//
//   os_load_bench KIND [OPS_PER_S]
//
// Repeats one operation until killed, OPS_PER_S times a second (spinning
// between them), or as fast as it can with 0 or nothing:
//   spin      nothing (a busy cpu)
//   syscall   getppid() twice
//   tcp       a 186-byte write to a loopback TCP connection and its read
//   fault     touches 16 new pages of a mapping (first-touch faults)
//   grow      mprotect()s the next 8 KiB of a PROT_NONE mapping read-write
//             and touches it (how glibc grows a thread's heap)
//   mprotect  mprotect()s 16 touched pages read-only and back (their page
//             table entries change)
//   dontneed  madvise(MADV_DONTNEED)s 16 touched pages and touches them again
//             (how glibc trims a thread's heap)
//   munmap    mmap()s 16 pages, touches and munmap()s them (how glibc frees a
//             block over its mmap threshold)
// Standalone: POSIX only; g++ -std=c++20 -O2 os_load_bench.cc -o os_load_bench
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kPages = 16;

char* map(size_t bytes, int prot) {
  void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return static_cast<char*>(p);
}

void touch(char* p, size_t pages) {
  for (size_t i = 0; i < pages; ++i) p[i * kPage] = 1;
}

// A loopback TCP connection to itself: {writer, reader}.
std::pair<int, int> loopback_pair() {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 1) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
    std::perror("listen");
    std::exit(1);
  }
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::perror("connect");
    std::exit(1);
  }
  const int s = ::accept(l, nullptr, nullptr);
  const int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::close(l);
  return {s, c};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: os_load_bench KIND [OPS_PER_S]\n");
    return 2;
  }
  const std::string kind = argv[1];
  const double rate = argc > 2 ? std::atof(argv[2]) : 0;
  char* pages = map(kPages * kPage, PROT_READ | PROT_WRITE);
  touch(pages, kPages);
  char* big = nullptr;
  size_t offset = 0;
  // fault and grow walk a 1 GiB mapping, then map a new one (one munmap a
  // GiB: what they touch stays bounded).
  constexpr size_t kBig = size_t{1} << 30;
  const int big_prot = kind == "grow" ? PROT_NONE : PROT_READ | PROT_WRITE;
  auto advance = [&](size_t bytes) {
    offset += bytes;
    if (offset + bytes > kBig) {
      ::munmap(big, kBig);
      big = map(kBig, big_prot);
      offset = 0;
    }
  };
  if (kind == "fault" || kind == "grow") big = map(kBig, big_prot);
  int writer = -1, reader = -1;
  if (kind == "tcp") std::tie(writer, reader) = loopback_pair();
  char buf[4096] = {};
  volatile long spins = 0;
  std::function<void()> op;
  if (kind == "spin") {
    op = [&] { spins = spins + 1; };
  } else if (kind == "syscall") {
    op = [] {
      ::getppid();
      ::getppid();
    };
  } else if (kind == "tcp") {
    op = [&] {
      if (::write(writer, buf, 186) != 186 || ::read(reader, buf, sizeof buf) <= 0) std::exit(1);
    };
  } else if (kind == "fault") {
    op = [&] {
      touch(big + offset, kPages);
      advance(kPages * kPage);
    };
  } else if (kind == "grow") {
    op = [&] {
      ::mprotect(big + offset, 2 * kPage, PROT_READ | PROT_WRITE);
      touch(big + offset, 1);
      advance(2 * kPage);
    };
  } else if (kind == "mprotect") {
    op = [&] {
      ::mprotect(pages, kPages * kPage, PROT_READ);
      ::mprotect(pages, kPages * kPage, PROT_READ | PROT_WRITE);
    };
  } else if (kind == "dontneed") {
    op = [&] {
      ::madvise(pages, kPages * kPage, MADV_DONTNEED);
      touch(pages, kPages);
    };
  } else if (kind == "munmap") {
    op = [] {
      char* p = map(kPages * kPage, PROT_READ | PROT_WRITE);
      touch(p, kPages);
      ::munmap(p, kPages * kPage);
    };
  } else {
    std::fprintf(stderr, "os_load_bench: unknown kind '%s'\n", kind.c_str());
    return 2;
  }
  using clock = std::chrono::steady_clock;
  auto next = clock::now();
  const auto gap = std::chrono::duration_cast<clock::duration>(
      std::chrono::duration<double>(rate > 0 ? 1 / rate : 0));
  for (;;) {
    op();
    if (rate > 0) {
      next += gap;
      while (clock::now() < next) {
      }
    }
  }
}
