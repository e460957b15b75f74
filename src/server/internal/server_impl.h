// The HTTP server's shared state (HttpServer::Impl): the event loop and its
// acceptor, the connections, the prompt pool, and the rounds of tokens the
// engine thread hands to the loop. Which thread may touch each field is
// written beside it. Its out-of-line parts: http_loop.cc (rounds, the
// loop's polling, accepting), http_server.cc (start, stop, signals).
#pragma once

#include <malloc.h>

// Before Boost.Asio, whose awaitable.hpp (Debian's 1.74) uses std::exchange
// without including it.
// clang-format off
#include <utility>
// clang-format on

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "msinfer/server/batch_send.h"
#include "msinfer/server/http_server.h"
#include "prompt_pool.h"

namespace msinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// The calling thread's CPU time (the HTTP loop's, for /metrics).
double thread_cpu_s();

class Session;

struct HttpServer::Impl {
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  ServerOptions options;
  ApiContext ctx;
  Metrics* metrics = nullptr;
  std::atomic<Scheduler*> scheduler{nullptr};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> connections{0};
  bool stopping = false;  // event-loop thread only
  std::optional<net::steady_timer> stop_timer;
  std::optional<net::signal_set> signals;
  std::list<std::weak_ptr<Session>> sessions;  // event-loop thread only
  size_t prune_sessions_at = 64;               // event-loop thread only
  int nodelay_inherited = -1;                  // event-loop thread only: -1 not yet known
  std::time_t created = std::time(nullptr);
  // Responses' system_fingerprint: this build and the served model's shape
  // (a client compares it to see whether the backend changed).
  std::string system_fingerprint;
  std::mt19937_64 id_rng{std::random_device{}()};  // event-loop thread only
  // 32 random hex digits (128 bits) for a response id. Event-loop thread only.
  std::string random_hex() {
    char buf[33];
    std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(id_rng()),
                  static_cast<unsigned long long>(id_rng()));
    return buf;
  }
  // Connections per client address (event-loop thread only).
  std::unordered_map<std::string, int64_t> per_client;
  // A connection that read much (a large body, a header flood) was closed:
  // freed heap pages go back to the system a little later, once (event-loop
  // thread only). The engine thread does the same after requests.
  std::optional<net::steady_timer> trim_timer;
  void trim_soon() {
    if (trim_timer) return;
    trim_timer.emplace(ioc, std::chrono::seconds(2));
    trim_timer->async_wait([this](beast::error_code ec) {
      trim_timer.reset();
      if (!ec) ::malloc_trim(0);
    });
  }
  // Closes the longest-idle connection that waits for a request (none in
  // progress), to make room for a new one at max_connections; false if none.
  bool evict_idle();
  // Tokens and errors from the engine thread go to the loop a round (one
  // engine step) at a time: one post, one wake-up of the loop and no
  // allocation per request. The engine thread gathers a round into
  // `gathering`; end_round() hands it over; run_rounds() runs on the loop.
  struct Delivery {
    int64_t id = 0;             // the request's; its connection is in `streams`
    size_t begin = 0, end = 0;  // its events in the round's `events`
    std::optional<Status> error;
  };
  struct Round {
    std::vector<runtime::TokenEvent> events;
    std::vector<Delivery> deliveries;
    // Streams send their held text at this round (every stream_interval-th
    // round, for all streams together).
    bool flush = false;
    // Something in it cannot wait for the next flush round: a stream's first
    // tokens, an end, an error, a stream with logprobs.
    bool urgent = false;
    // When the engine thread handed it over (end_round).
    std::chrono::steady_clock::time_point at;
  };
  class Batch final : public SinkBatch {
   public:
    explicit Batch(Impl& srv) : srv_(srv) {}
    void end_round() override { srv_.end_round(); }

   private:
    Impl& srv_;
  };
  Batch batch{*this};
  Round gathering;      // engine thread only
  uint64_t rounds = 0;  // engine thread only: rounds handed over
  std::mutex rounds_mu;
  std::vector<Round> ready;  // GUARDED_BY(rounds_mu): handed over, not yet run
  std::vector<Round> spare;  // GUARDED_BY(rounds_mu): run, emptied, capacity kept
  bool posted = false;       // GUARDED_BY(rounds_mu): run_rounds() will take `ready`
  bool polling = false;      // GUARDED_BY(rounds_mu): the loop takes `ready` itself
  int64_t wakeups = 0;       // GUARDED_BY(rounds_mu): posts that woke the loop for rounds
  // The engine thread is never more than options.max_rounds_ahead rounds
  // ahead of the loop: end_round() waits for the loop to take them
  // (rounds_taken).
  std::condition_variable rounds_taken;
  bool engine_waiting = false;  // GUARDED_BY(rounds_mu)
  int64_t engine_waits = 0;     // GUARDED_BY(rounds_mu): rounds after which the engine waited
  bool loop_ended = false;      // GUARDED_BY(rounds_mu): run() returned; nobody takes rounds
  double poll_wait_cpu_s = 0;   // event-loop thread only: CPU time spent polling idle
  // Anticipation (the loop without busy_poll; event-loop thread only): the
  // rounds that wake the loop come at the engine's pace, so the loop sleeps
  // on a timer until just before the next is due and then polls for it; the
  // engine thread hands it over without a wake-up (~16 us of its time on a
  // VM, where waking a sleeping cpu goes through the hypervisor). The pace:
  // a moving average of the gaps between those rounds.
  std::chrono::steady_clock::time_point last_round_at{};
  std::chrono::nanoseconds round_gap{0};
  uint64_t rounds_delivered = 0;
  bool alarm_rang = false;
  void anticipate_loop();
  std::vector<Round> running;  // event-loop thread only
  // The connection of each request in flight, by request id (event-loop thread
  // only): deliveries name the request, so the engine thread touches no
  // connection's reference count.
  std::unordered_map<int64_t, std::weak_ptr<Session>> streams;
  // The writes of the rounds deliver() runs go out together, one io_uring
  // submit for every stream written (BatchSend); null or broken(): a send()
  // each (the kernel refused io_uring, a submit failed, or
  // ServerOptions::io_uring is off). Event-loop thread only.
  std::unique_ptr<BatchSend> sender;
  // Declared after ioc: destroyed (its threads joined) before it.
  std::unique_ptr<PromptPool> prompts;
  bool batching = false;  // inside deliver(): Session::flush() joins `batched`
  std::vector<std::shared_ptr<Session>> batched;
  std::vector<BatchSend::Item> batch_items;
  std::vector<long> batch_results;
  int64_t batched_writes = 0;
  // Sends `batched` and hands each session its result.
  void send_batch();

  void accept();
  // Engine thread: one request's tokens (moved from) or failure, this round.
  void gather(int64_t id, std::span<runtime::TokenEvent> events, bool urgent) {
    // An end (of any of the request's sequences) cannot wait either.
    gathering.urgent |= urgent || std::any_of(events.begin(), events.end(),
                                              [](const auto& ev) { return ev.finished; });
    Delivery& d = gathering.deliveries.emplace_back();
    d.id = id;
    d.begin = gathering.events.size();
    for (auto& ev : events) gathering.events.push_back(std::move(ev));
    d.end = gathering.events.size();
  }
  void gather_error(int64_t id, const Status& st) {
    gathering.urgent = true;
    Delivery& d = gathering.deliveries.emplace_back();
    d.id = id;
    d.error = st;
  }
  // Engine thread: the round goes to the loop, after the rounds before it.
  // The loop is woken for a flush round or an urgent one only: with
  // --stream-interval N, once per N steps while streams just decode (waking
  // an idle loop's cpu costs this thread, docs/BENCHMARKS.md); rounds between
  // wait in `ready`, at most kMaxWaitingRounds of them before one wakes it.
  // A loop that is woken but short of cpu gets at most
  // options.max_rounds_ahead rounds behind: then the engine thread waits.
  static constexpr size_t kMaxWaitingRounds = 16;
  void end_round() {
    if (gathering.deliveries.empty()) return;
    gathering.flush = ++rounds % static_cast<uint64_t>(options.stream_interval) == 0;
    bool post, behind;
    {
      std::lock_guard<std::mutex> l(rounds_mu);
      const bool urgent = gathering.urgent, flush = gathering.flush;
      gathering.at = std::chrono::steady_clock::now();
      ready.push_back(std::move(gathering));
      gathering = Round{};
      if (!spare.empty()) {
        gathering = std::move(spare.back());
        spare.pop_back();
      }
      behind = ready.size() >= rounds_ahead_limit() && !loop_ended;
      // (Behind: the loop must come for them.)
      const bool wake = flush || urgent || ready.size() >= kMaxWaitingRounds || behind;
      post = wake && !posted && !polling;
      posted = posted || post;
      wakeups += post ? 1 : 0;
    }
    if (post) net::post(ioc, [this] { run_rounds(); });
    if (behind) wait_for_loop();
  }
  size_t rounds_ahead_limit() const {
    return static_cast<size_t>(std::max<int64_t>(options.max_rounds_ahead, 1));
  }
  void wait_for_loop() {
    std::unique_lock<std::mutex> l(rounds_mu);
    ++engine_waits;
    engine_waiting = true;
    rounds_taken.wait(l, [this] { return ready.size() < rounds_ahead_limit() || loop_ended; });
    engine_waiting = false;
  }
  // Loop: `ready` was taken; an engine thread waiting for that goes on.
  void took_rounds(std::unique_lock<std::mutex>& l) {
    const bool waiting = engine_waiting;
    l.unlock();
    if (waiting) rounds_taken.notify_one();
  }
  // Loop: run() returns; an engine thread waiting for it goes on.
  void end_loop() {
    {
      std::lock_guard<std::mutex> l(rounds_mu);
      loop_ended = true;
    }
    rounds_taken.notify_all();
  }
  void run_rounds();
  // The loop takes what is ready without a post (busy poll); true if any.
  bool poll_rounds();
  bool rounds_waiting() {
    std::lock_guard<std::mutex> l(rounds_mu);
    return !ready.empty();
  }
  // While set, the engine thread leaves its rounds in `ready` without a post
  // and the loop takes them itself; clearing it takes what came meanwhile
  // (later rounds post).
  void set_polling(bool on) {
    {
      std::lock_guard<std::mutex> l(rounds_mu);
      polling = on;
    }
    if (!on && !ioc.stopped()) poll_rounds();
  }
  // The loop's CPU time in stretches of polling with nothing to do, added to
  // poll_wait_cpu_s (what its CPU counter leaves out): idle() at the end of
  // a pass that found nothing, work() once a pass did (or the polling ends).
  // The stretch ends where the last empty pass did, so the working pass's
  // own CPU (the handlers it ran, the rounds it delivered) counts as work:
  // ending it at work() counted that as waiting, and the loop's counter
  // left out part of its work.
  struct IdleStretch {
    Impl& srv;
    double since = -1, last = -1;  // CPU clock at the first and latest empty pass's end
    void idle() {
      last = thread_cpu_s();
      if (since < 0) since = last;
    }
    void work() {
      if (since >= 0) srv.poll_wait_cpu_s += last - since;
      since = -1;
    }
  };
  void deliver(std::vector<Round>& rounds);
  // The event loop: io_context::run(), or with options.busy_poll, polling
  // while streams are in flight.
  void run_loop();
};

}  // namespace msinfer::server
