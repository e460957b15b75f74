// The router <-> worker line protocol's I/O (src/runtime/internal/line_io.h)
// under signals: an interrupted write or read is not a closed pipe.
#include "../../src/runtime/internal/line_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace msinfer::runtime::internal {
namespace {

std::atomic<int> signals_seen{0};
void count_signal(int) { signals_seen.fetch_add(1); }

// Counts SIGUSR1 in signals_seen while it lives, with a handler that does not
// restart system calls (no SA_RESTART: a blocked call returns EINTR); puts the
// old action back when it goes.
class CountSigusr1 {
 public:
  CountSigusr1() {
    struct sigaction sa {};
    sa.sa_handler = count_signal;
    sa.sa_flags = 0;
    sigemptyset(&sa.sa_mask);
    installed_ = ::sigaction(SIGUSR1, &sa, &old_) == 0;
  }
  ~CountSigusr1() {
    if (installed_) ::sigaction(SIGUSR1, &old_, nullptr);
  }
  bool installed() const { return installed_; }

 private:
  struct sigaction old_ {};
  bool installed_ = false;
};

// The system calls a read_line's wait can block in.
#ifdef SYS_poll
const std::vector<long> kPollCalls = {SYS_poll, SYS_ppoll};
#else
const std::vector<long> kPollCalls = {SYS_ppoll};
#endif

// The thread with kernel id `tid` sits in one of `calls` (system call
// numbers), blocked: /proc/self/task/<tid>/syscall starts with the number of
// the call a thread is blocked in.
bool blocked_in(pid_t tid, const std::vector<long>& calls) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  if (!(f >> nr)) return false;  // "running", or gone
  return std::find(calls.begin(), calls.end(), nr) != calls.end();
}

// A thread and its kernel id (for /proc/self/task/<tid>).
struct TrackedThread {
  std::thread thread;
  pid_t tid = 0;
};

// Starts `body` on a thread; returns once the thread's kernel id is known.
template <class Body>
TrackedThread start_tracked(Body body) {
  std::atomic<pid_t> tid{0};
  std::thread t([&tid, body]() mutable {
    tid = ::gettid();  // the last use of `tid`: start_tracked waits for it
    body();
  });
  while (tid.load() == 0) std::this_thread::yield();
  return {std::move(t), tid.load()};
}

// Sends the thread `target` up to `times` SIGUSR1s while
// `waiting()` holds. Each is sent only once the thread is blocked in one of
// `calls`, and the next only after the one before was handled: a signal
// that lands in the blocked call is the case under test, and it is the one
// ThreadSanitizer delivers at once (one that lands elsewhere it may hold
// until the thread's next call). Each wait is bounded (5 s); the sending
// stops at one that runs out. Returns the number of signals handled.
template <class Waiting>
int interrupt(TrackedThread& target, const std::vector<long>& calls, int times, Waiting waiting) {
  const pid_t tid = target.tid;
  const int before = signals_seen.load();
  for (int i = 0; i < times && waiting(); ++i) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!blocked_in(tid, calls) && waiting() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!waiting() || !blocked_in(tid, calls)) break;
    ::pthread_kill(target.thread.native_handle(), SIGUSR1);
    until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (signals_seen.load() == before + i && waiting() &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    if (signals_seen.load() == before + i) break;  // not handled yet
  }
  return signals_seen.load() - before;
}

// A write_line blocked on a full pipe, hit by signals whose handler does not
// restart system calls (no SA_RESTART: write returns EINTR), still writes
// the whole line once the reader drains the pipe.
TEST(LineIoTest, SignalsDoNotBreakAWrite) {
  CountSigusr1 counting;
  ASSERT_TRUE(counting.installed());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  // Fill the pipe so that the next write blocks.
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  const std::string filler(4096, 'f');
  size_t filled = 0;
  while (true) {
    const ssize_t n = ::write(fds[1], filler.data(), filler.size());
    if (n <= 0) break;
    filled += static_cast<size_t>(n);
  }
  ::fcntl(fds[1], F_SETFL, 0);
  std::atomic<int> result{-1};
  TrackedThread writer = start_tracked([&] { result = write_line(fds[1], "the line") ? 1 : 0; });
  // Interrupt the writer many times while it is blocked in write; the drain
  // below lets the write return.
  const int handled = interrupt(writer, {SYS_write}, 200, [&] { return result.load() == -1; });
  // Drain: the filler, then the line.
  std::string got;
  char buf[65536];
  while (got.size() < filled + 9) {
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  writer.thread.join();
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_GT(handled, 0) << "no signal reached the blocked write";
  EXPECT_EQ(result.load(), 1) << "write_line gave up on a signal";
  EXPECT_EQ(got.substr(filled), "the line\n");
}

// A read_line waiting for its line (in poll, no timeout) and hit by signals
// whose handler does not restart system calls keeps waiting, and returns the
// line when it comes: an interrupted wait is neither end of file nor a
// timeout.
TEST(LineIoTest, SignalsDoNotEndARead) {
  CountSigusr1 counting;
  ASSERT_TRUE(counting.installed());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::atomic<int> result{-1};
  std::atomic<bool> eof{false};
  std::string line;
  TrackedThread reader = start_tracked([&] {
    std::string buf;
    bool e = false;
    result = read_line(fds[0], &buf, &line, -1, &e) ? 1 : 0;
    eof = e;
  });
  const int handled = interrupt(reader, kPollCalls, 50, [&] { return result.load() == -1; });
  const int still_waiting = result.load();
  ASSERT_EQ(::write(fds[1], "late line\n", 10), 10);
  reader.thread.join();
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_GT(handled, 0) << "no signal reached the waiting read";
  EXPECT_EQ(still_waiting, -1) << "read_line returned on a signal";
  EXPECT_EQ(result.load(), 1);
  EXPECT_FALSE(eof.load());
  EXPECT_EQ(line, "late line");
}

TEST(LineIoTest, ReadLineKeepsPartialLinesAndReportsEndOfFile) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "ab", 2), 2);
  std::string buf, line;
  bool eof = false;
  EXPECT_FALSE(read_line(fds[0], &buf, &line, 0, &eof));
  EXPECT_FALSE(eof);
  ASSERT_EQ(::write(fds[1], "c\nd", 3), 3);
  ASSERT_TRUE(read_line(fds[0], &buf, &line, 1000));
  EXPECT_EQ(line, "abc");
  ::close(fds[1]);
  EXPECT_FALSE(read_line(fds[0], &buf, &line, 1000, &eof));
  EXPECT_TRUE(eof);
  ::close(fds[0]);
}

// Peer cards cross the control pipes as hex: every byte value round-trips,
// and odd lengths or non-digits are refused.
TEST(LineIoTest, HexRoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::string h = to_hex(all);
  EXPECT_EQ(h.size(), 512u);
  EXPECT_EQ(h.substr(0, 6), "000102");
  EXPECT_EQ(h.substr(506), "fdfeff");
  std::string back;
  ASSERT_TRUE(from_hex(h, &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(from_hex("abc", &back));
  EXPECT_FALSE(from_hex("0g", &back));
  EXPECT_FALSE(from_hex("0A", &back));
  ASSERT_TRUE(from_hex("", &back));
  EXPECT_TRUE(back.empty());
}

}  // namespace
}  // namespace msinfer::runtime::internal
