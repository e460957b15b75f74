#include "msinfer/server/http_server.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <malloc.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "msinfer/core/logging.h"
#include "msinfer/server/batch_send.h"

namespace msinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// The calling thread's CPU time (the HTTP loop's, for /metrics).
double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string dump(const Json& j) {
  // Random models may emit half a character: never let that break the JSON.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string chunk(const std::string& payload) {
  char len[32];
  std::snprintf(len, sizeof(len), "%zx\r\n", payload.size());
  return len + payload + "\r\n";
}

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

ApiError error_of(int status, std::string type, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  return e;
}

// Threads that render chat templates and tokenize prompts for the event loop
// (a long prompt must not hold up other connections or /health). Jobs run in
// the order given; the destructor drops jobs not yet started and joins.
class PromptPool {
 public:
  explicit PromptPool(int threads) {
    for (int i = 0; i < std::max(threads, 1); ++i) {
      threads_.emplace_back([this] {
        ::pthread_setname_np(::pthread_self(), "msinfer-prompt");
        work();
      });
    }
  }
  ~PromptPool() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      dropped.swap(jobs_);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // GUARDED_BY(mu_)
  bool stop_ = false;                       // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

// Compares in time that does not depend on where the strings differ (an
// API key must not be found a byte at a time by timing the answers).
bool equal_constant_time(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// "Authorization: Bearer KEY" with the scheme in any case (RFC 9110: auth
// schemes are case-insensitive) and the key compared in constant time.
bool bearer_matches(beast::string_view field, const std::string& key) {
  std::string_view header(field.data(), field.size());
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() < kScheme.size() ||
      !beast::iequals(beast::string_view(header.data(), kScheme.size()),
                      beast::string_view(kScheme.data(), kScheme.size()))) {
    return false;
  }
  header.remove_prefix(kScheme.size());
  while (!header.empty() && header.front() == ' ') header.remove_prefix(1);
  return equal_constant_time(header, key);
}

// %XX escapes of a URL path segment decoded; anything malformed kept as is.
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// "fp_" and 12 hex digits of FNV-1a over what shapes the answers: the served
// model's name, vocabulary and length, and the deployment's kind.
std::string fingerprint_of(const ApiContext& ctx) {
  const std::string what = "msinfer|" + ctx.served_model_name + "|" + std::to_string(ctx.vocab) +
                           "|" + std::to_string(ctx.max_model_len) + "|" +
                           (ctx.disaggregated ? "disaggregated" : "co-located");
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : what) h = (h ^ c) * 1099511628211ull;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "fp_%012llx",
                static_cast<unsigned long long>(h & 0xffffffffffffull));
  return buf;
}

Json byte_array(const std::string& s) {
  Json a = Json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

}  // namespace

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
  std::vector<Round> ready;    // GUARDED_BY(rounds_mu): handed over, not yet run
  std::vector<Round> spare;    // GUARDED_BY(rounds_mu): run, emptied, capacity kept
  bool posted = false;         // GUARDED_BY(rounds_mu): run_rounds() will take `ready`
  bool polling = false;        // GUARDED_BY(rounds_mu): the loop takes `ready` itself
  int64_t wakeups = 0;         // GUARDED_BY(rounds_mu): posts that woke the loop for rounds
  // The engine thread is never more than options.max_rounds_ahead rounds
  // ahead of the loop: end_round() waits for the loop to take them
  // (rounds_taken).
  std::condition_variable rounds_taken;
  bool engine_waiting = false;  // GUARDED_BY(rounds_mu)
  int64_t engine_waits = 0;     // GUARDED_BY(rounds_mu): rounds after which the engine waited
  bool loop_ended = false;      // GUARDED_BY(rounds_mu): run() returned; nobody takes rounds
  double poll_wait_cpu_s = 0;  // event-loop thread only: CPU time spent polling idle
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

// One client connection. Lives on the event loop's thread; kept alive by the
// handlers of its pending operations.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& srv, tcp::socket sock, std::string client)
      : srv_(srv), sock_(std::move(sock)), timer_(srv.ioc), client_(std::move(client)) {}

  void start() {
    ++srv_.connections;
    ++srv_.per_client[client_];
    do_read();
  }

  // Waiting for a request that has not begun: no byte of it read, nothing in
  // progress or being written (what evict_idle() may close).
  bool idle() const {
    return !closed_ && reading_ && header_bytes_ == 0 && buf_.size() == 0 && !gen_ &&
           !preparing_ && !writing_ && out_queue_.empty();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (auto it = srv_.per_client.find(client_); it != srv_.per_client.end() && --it->second <= 0) {
      srv_.per_client.erase(it);
    }
    // Much read (a large body, a header flood): its buffers' pages go back.
    if (bytes_read_ + static_cast<int64_t>(buf_.capacity()) > (32 << 10)) srv_.trim_soon();
    if (gen_ && !gen_->done) {
      end_generation(*gen_);
      if (Scheduler* s = srv_.scheduler.load()) s->cancel(gen_->id);
    }
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    timer_.cancel();
    // The last connection of a stopping server ends the event loop.
    if (--srv_.connections == 0 && srv_.stopping) srv_.ioc.stop();
  }

  // Stopping: close now, or once what is queued for the client is written
  // (the end of a drained stream, an error event).
  void close_when_flushed() {
    if (closed_) return;
    if (writing_ || !out_queue_.empty()) {
      keep_alive_ = false;
      response_done_ = true;
      return;  // on_write closes
    }
    close();
  }

 private:
  friend struct HttpServer::Impl;  // run_rounds() delivers on_tokens and on_error

  // One sequence of a generation: choices[index] of the answer (with
  // best_of > n, a candidate for one).
  struct Choice {
    std::optional<TextStream> text;
    // A harmony chat (ApiRequest::harmony): splits the tokens by channel;
    // `text` then only looks for stop strings in the content.
    std::optional<HarmonyParser> harmony;
    std::string reasoning;  // non-streaming: the whole reasoning (harmony)
    int64_t completion_tokens = 0;
    double cumulative_logprob = 0;  // of its tokens (best_of ranks by it)
    std::string content;            // non-streaming: the whole text
    Json logprobs;                  // non-streaming: accumulated
    int64_t text_offset = 0;        // characters of the text before the next logprob token
    int32_t logprob_before = -1;    // the token before the next logprob token
    std::string finish;             // OpenAI's finish_reason once it ended
    bool engine_finished = false;   // the engine's sequence ended (not only a stop string)
    // The usual stream chunk (text, no logprobs, no finish) around its text;
    // made once (text_chunk).
    std::string chunk_prefix, chunk_suffix;
    std::string reasoning_prefix, reasoning_suffix;  // the same around reasoning_content
    // Streamed text waiting for the next flush round (every --stream-interval
    // steps; the first text goes out at once: the interval never delays the
    // first token).
    std::string held_text, held_reasoning;
    bool sent_text = false;
    // This round's (on_tokens) text, logprobs and end; the strings keep
    // their capacity from round to round.
    std::string round_text, round_reasoning;
    Json round_logprobs;
    bool round_touched = false, round_ended = false;
  };

  // One generation request in flight on this connection.
  struct Generation {
    int64_t id = 0;
    ApiRequest req;
    std::vector<Choice> choices;  // req.best_of of them, by TokenEvent::index
    int64_t open = 0;             // choices not ended
    std::string object_id;
    std::time_t created = 0;
    bool done = false;
    int64_t cached_tokens = -1;  // from the request's first token event (-1: none yet)
  };

  // Hands tokens from the engine thread to this connection's loop, gathered
  // with every other request's of the same step (Impl::end_round).
  class Sink final : public RequestSink {
   public:
    // every_step: the client sees each step (a stream with logprobs).
    Sink(HttpServer::Impl& srv, int64_t id, bool every_step)
        : srv_(srv), id_(id), every_step_(every_step) {}
    void on_tokens(std::span<runtime::TokenEvent> events) override {
      // The first tokens go out at once (the time to the first token).
      srv_.gather(id_, events, every_step_ || !started_);
      started_ = true;
    }
    void on_error(const Status& st) override { srv_.gather_error(id_, st); }
    SinkBatch* batch() override { return &srv_.batch; }

   private:
    HttpServer::Impl& srv_;
    int64_t id_;
    bool every_step_;
    bool started_ = false;  // engine thread only
  };

  // ---- reading requests ----

  void do_read() {
    if (closed_ || reading_) return;
    reading_ = true;
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(srv_.options.max_body_bytes));
    parser_->header_limit(static_cast<uint32_t>(srv_.options.max_header_bytes));
    timer_.expires_after(srv_.options.request_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      // A request that does not arrive in time (slowloris, idle keep-alive).
      if (!ec && self->reading_) self->close();
    });
    header_bytes_ = 0;
    read_header_part();
  }

  // The header a piece at a time, counting what the parser took, so that
  // max_header_bytes bounds all fields together however they arrive, by our
  // own count (25,000 short fields were reported to pass Beast's; with
  // Debian's Boost 1.74 its limit held in ServeHostileTest too).
  void read_header_part() {
    http::async_read_some(sock_, buf_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            self->on_header_part(ec, n);
                          });
  }

  void on_header_part(beast::error_code ec, size_t n) {
    header_bytes_ += static_cast<int64_t>(n);
    bytes_read_ += static_cast<int64_t>(n);
    if (!ec && !parser_->is_header_done()) {
      if (header_bytes_ > srv_.options.max_header_bytes) {
        ec = http::error::header_limit;
      } else {
        return read_header_part();
      }
    }
    on_header(ec);
  }

  bool read_failed(beast::error_code ec) {
    if (!ec) return false;
    reading_ = false;
    timer_.cancel();
    if (closed_) return true;
    if (ec == http::error::body_limit) {
      respond_error(error_of(413, "invalid_request_error",
                             "the request body exceeds " +
                                 std::to_string(srv_.options.max_body_bytes) + " bytes"),
                    true);
    } else if (ec == http::error::header_limit) {
      respond_error(error_of(431, "invalid_request_error", "the request headers are too large"),
                    true);
    } else if (ec == http::error::end_of_stream || ec == net::error::eof ||
               ec == net::error::connection_reset || ec == net::error::operation_aborted ||
               ec == net::error::bad_descriptor || buf_.size() == 0) {
      close();
    } else {
      respond_error(
          error_of(400, "invalid_request_error", "malformed HTTP request: " + ec.message()), true);
    }
    return true;
  }

  void on_header(beast::error_code ec) {
    if (read_failed(ec)) return;
    auto& h = parser_->get();
    // Answer what the headers already decide before reading a body.
    if (auto len = parser_->content_length();
        len && *len > static_cast<uint64_t>(srv_.options.max_body_bytes)) {
      reading_ = false;
      timer_.cancel();
      respond_error(error_of(413, "invalid_request_error",
                             "the request body exceeds " +
                                 std::to_string(srv_.options.max_body_bytes) + " bytes"),
                    true);
      return;
    }
    if (beast::iequals(h[http::field::expect], "100-continue") && !parser_->is_done()) {
      // Queued like any answer (after what this connection still has to
      // write): a client that does not read cannot block the loop.
      queue_write("HTTP/1.1 100 Continue\r\n\r\n");
      if (closed_) return;
    }
    http::async_read(sock_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t n) {
                       self->bytes_read_ += static_cast<int64_t>(n);
                       self->on_read(ec);
                     });
  }

  void on_read(beast::error_code ec) {
    if (read_failed(ec)) return;
    reading_ = false;
    timer_.cancel();
    guarded("handling the request", [&] { handle(parser_->release()); });
  }

  // Runs f; an exception that escapes it is this request's 500 (logged),
  // never the process's end.
  template <typename F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      internal_failure(what, e.what());
    } catch (...) {
      internal_failure(what, "unknown exception");
    }
  }

  void internal_failure(const char* what, const char* why) {
    std::fprintf(stderr, "msinfer: server: %s failed: %s\n", what, why);
    if (closed_) return;
    preparing_ = false;
    if (gen_) {
      if (!gen_->done) {
        end_generation(*gen_);
        if (Scheduler* s = srv_.scheduler.load()) s->cancel(gen_->id);
      }
      // A stream's status line may be out: nothing sensible can follow.
      if (gen_->req.stream) return close();
      gen_.reset();
    }
    respond_error(
        error_of(500, "internal_error", std::string("internal error while ") + what + ": " + why),
        true);
  }

  // Watches for the client going away while its request runs: the only read
  // outstanding then. Bytes that arrive (a pipelined request) stay in buf_.
  void watch() {
    if (closed_ || watching_ || reading_) return;
    watching_ = true;
    sock_.async_read_some(
        buf_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    if (ec) {
      close();  // the client is gone: its request is cancelled
      return;
    }
    buf_.commit(n);
    if (buf_.size() >
        static_cast<size_t>(srv_.options.max_header_bytes + srv_.options.max_body_bytes)) {
      close();
      return;
    }
    if ((gen_ && !gen_->done) || preparing_) {
      watch();
    } else if (response_done_ && !writing_) {
      do_read();
    }
  }

  // ---- writing ----

  void queue_write(std::string data) {
    if (closed_) return;
    if (batched_) {
      // In this deliver()'s batch, not yet offered to the kernel: one write
      // for every round it runs. (The limit is on what waits behind a write
      // the client has not taken: a loop late by many rounds is no slow
      // reader.)
      out_writing_ += data;
      return;
    }
    out_queue_ += data;
    if (static_cast<int64_t>(out_queue_.size()) > srv_.options.max_pending_bytes) {
      close();  // a reader slower than its tokens: cut off, request cancelled
      return;
    }
    if (!writing_) flush();
  }

  void flush() {
    writing_ = true;
    out_writing_.swap(out_queue_);
    out_queue_.clear();
    if (srv_.batching) {
      batched_ = true;
      srv_.batched.push_back(shared_from_this());
      return;
    }
    start_write();
  }

  void start_write() {
    net::async_write(
        sock_, net::buffer(out_writing_),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  // This session's part of a batch (send_batch).
  BatchSend::Item batch_item() {
    return {closed_ ? -1 : sock_.native_handle(), out_writing_.data(), out_writing_.size()};
  }

  // res: what BatchSend returned for batch_item(): bytes sent or -errno.
  void on_batch_sent(long res) {
    batched_ = false;
    if (closed_ || res == static_cast<long>(out_writing_.size())) return on_write({});
    if (res >= 0 || res == -EAGAIN) {
      // The socket took part (or none) of it: the rest as any write, when
      // the client has read enough.
      out_writing_.erase(0, static_cast<size_t>(std::max(res, 0L)));
      return start_write();
    }
    on_write(beast::error_code(static_cast<int>(-res), boost::system::system_category()));
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    out_writing_.clear();
    if (out_writing_.capacity() > (64 << 10)) out_writing_.shrink_to_fit();
    if (closed_) return;
    if (ec) {
      close();
      return;
    }
    if (!out_queue_.empty()) {
      flush();
      return;
    }
    if (srv_.stopping) {
      close();
      return;
    }
    if (!response_done_) return;
    if (!keep_alive_) {
      close();
    } else if (!watching_) {
      do_read();
    }
  }

  void respond(int status, const std::string& content_type, const std::string& body,
               const std::string& extra_headers = "", bool close_after = false) {
    if (close_after) keep_alive_ = false;
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    r += "Content-Type: " + content_type + "\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    r += extra_headers;
    r += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    r += body;
    srv_.metrics->http_response(status);
    response_done_ = true;
    queue_write(std::move(r));
  }

  void respond_json(int status, const Json& j, const std::string& extra_headers = "") {
    respond(status, "application/json", dump(j), extra_headers);
  }

  void respond_error(const ApiError& e, bool close_after = false,
                     const std::string& extra_headers = "") {
    respond(e.http_status, "application/json", dump(e.body()), extra_headers, close_after);
  }

  // ---- routing ----

  void handle(http::request<http::string_body> req) {
    keep_alive_ = req.keep_alive();
    std::string target(req.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    auto method_not_allowed = [&](const char* allow) {
      respond_error(error_of(405, "invalid_request_error",
                             std::string(req.method_string()) + " is not allowed on " + target),
                    false, std::string("Allow: ") + allow + "\r\n");
    };
    if (target == "/health") {
      if (!get) return method_not_allowed("GET");
      const HealthAnswer h = health_answer(srv_.scheduler.load(), srv_.draining);
      return respond_json(h.status, h.body);
    }
    if (target == "/metrics") {
      if (!get) return method_not_allowed("GET");
      Metrics::Gauges g;
      g.connections = srv_.connections.load();
      // This runs on the loop's thread: its own CPU clock, in ns (what
      // scripts/bench-serve-overhead reads; /proc counts 10 ms ticks).
      // Less the time spent polling for a round (--busy-poll-us, anticipation).
      g.http_loop_cpu_s = thread_cpu_s() - srv_.poll_wait_cpu_s;
      g.http_batched_writes = srv_.batched_writes;
      {
        std::lock_guard<std::mutex> l(srv_.rounds_mu);
        g.http_loop_wakeups = srv_.wakeups;
        g.http_engine_waits = srv_.engine_waits;
      }
      g.http_batch_submits = srv_.sender ? srv_.sender->submits() : 0;
      if (Scheduler* s = srv_.scheduler.load()) {
        auto snap = s->snapshot();
        g.running = snap.running;
        g.waiting = snap.waiting;
        g.kv_usage = snap.kv_usage;
        g.preemptions = snap.counters.preemptions;
        g.prefix_queries = snap.counters.prefix_queries;
        g.prefix_hits = snap.counters.prefix_hits;
        g.engine_busy_s = snap.engine_busy_s;
        g.engine_step_s = snap.engine_step_s;
        g.engine_steps = snap.engine_steps;
        g.workers = std::move(snap.workers);
        g.routing = std::move(snap.routing);
        if (const auto h = s->health().workers) {
          for (const auto& [role, r] :
               {std::pair{"attention", h->attention}, std::pair{"expert", h->expert}}) {
            g.roles.push_back({role, r.live, r.expected, r.deaths, r.restarts});
          }
        }
      }
      return respond(200, "text/plain; version=0.0.4; charset=utf-8", srv_.metrics->render(g));
    }
    const bool models = target == "/v1/models";
    const std::string kModelPrefix = "/v1/models/";
    const bool one_model = target.size() > kModelPrefix.size() &&
                           target.compare(0, kModelPrefix.size(), kModelPrefix) == 0;
    const bool completions = target == "/v1/completions";
    const bool chat = target == "/v1/chat/completions";
    if (!models && !one_model && !completions && !chat) {
      return respond_error(error_of(404, "NotFoundError",
                                    "no route " + std::string(req.method_string()) + " " + target));
    }
    if (!srv_.options.api_key.empty() &&
        !bearer_matches(req[http::field::authorization], srv_.options.api_key)) {
      ApiError e = error_of(401, "authentication_error",
                            "missing or wrong API key (Authorization: Bearer KEY)");
      return respond_error(e, false, "WWW-Authenticate: Bearer\r\n");
    }
    if (models || one_model) {
      if (!get) return method_not_allowed("GET");
      Json m{{"id", srv_.ctx.served_model_name},
             {"object", "model"},
             {"created", static_cast<int64_t>(srv_.created)},
             {"owned_by", "msinfer"},
             {"root", srv_.ctx.served_model_name},
             {"max_model_len", srv_.ctx.max_model_len}};
      if (models) return respond_json(200, {{"object", "list"}, {"data", Json::array({m})}});
      // GET /v1/models/{id}: the id percent-decoded (an id may hold '/').
      const std::string id = percent_decode(target.substr(kModelPrefix.size()));
      if (id == srv_.ctx.served_model_name) return respond_json(200, m);
      ApiError e = error_of(404, "NotFoundError",
                            "the model '" + id + "' does not exist (this server serves '" +
                                srv_.ctx.served_model_name + "')");
      e.param = "model";
      return respond_error(e);
    }
    if (!post) return method_not_allowed("POST");
    const std::string ct(req[http::field::content_type]);
    const std::string media = ct.substr(0, ct.find(';'));
    if (!beast::iequals(beast::string_view(media.data(), media.find_last_not_of(' ') + 1),
                        "application/json")) {
      return respond_error(error_of(415, "invalid_request_error",
                                    "Content-Type must be application/json, got '" + ct + "'"));
    }
    Scheduler* sched = srv_.scheduler.load();
    if (sched == nullptr || srv_.draining) {
      return respond_error(
          error_of(503, "service_unavailable",
                   sched == nullptr ? "the model is loading" : "the server is shutting down"));
    }
    auto gen = std::make_shared<Generation>();
    if (auto err = parse_request_fields(req.body(), chat, srv_.ctx, &gen->req)) {
      return respond_error(*err);
    }
    if (!needs_tokenizer(gen->req)) {
      // Token ids: only the lengths are left to check, here.
      if (auto err = resolve_prompt(srv_.ctx, &gen->req, std::chrono::steady_clock::time_point::max())) {
        return respond_error(*err);
      }
      return submit(std::move(gen));
    }
    // The template and the tokenizer run on the prompt pool; the answer
    // comes back to this loop (prepared). Meanwhile the connection is
    // watched: a client that leaves is noticed.
    preparing_ = true;
    response_done_ = false;
    watch();
    const auto deadline = std::chrono::steady_clock::now() + srv_.options.tokenize_timeout;
    srv_.prompts->run([self = shared_from_this(), gen, deadline] {
      std::optional<ApiError> err;
      try {
        err = resolve_prompt(self->srv_.ctx, &gen->req, deadline);
      } catch (const std::exception& e) {
        err = error_of(500, "internal_error", std::string("internal error: ") + e.what());
      }
      net::post(self->srv_.ioc, [self, gen, err = std::move(err)]() mutable {
        self->guarded("handling the request", [&] { self->prepared(std::move(gen), err); });
      });
    });
  }

  // Loop: the prompt pool is done with gen's prompt.
  void prepared(std::shared_ptr<Generation> gen, const std::optional<ApiError>& err) {
    preparing_ = false;
    if (closed_) return;
    if (err) {
      if (err->http_status >= 500) {
        std::fprintf(stderr, "msinfer: server: %s\n", err->message.c_str());
      }
      return respond_error(*err);
    }
    submit(std::move(gen));
  }

  // Hands a parsed request to the scheduler and starts its answer.
  void submit(std::shared_ptr<Generation> gen) {
    const bool chat = gen->req.chat;
    Scheduler* sched = srv_.scheduler.load();
    if (sched == nullptr || srv_.draining || srv_.stopping) {
      return respond_error(
          error_of(503, "service_unavailable",
                   sched == nullptr ? "the model is loading" : "the server is shutting down"));
    }
    gen->id = sched->next_id();
    TextStreamOptions to;
    to.include_stop_str = gen->req.include_stop_str_in_output;
    to.skip_special_tokens = gen->req.skip_special_tokens;
    to.min_tokens = gen->req.sampling.min_tokens;
    gen->choices.resize(static_cast<size_t>(gen->req.best_of));
    for (Choice& c : gen->choices) {
      c.text.emplace(srv_.ctx.tokenizer, gen->req.stop, to);
      if (gen->req.harmony) c.harmony.emplace(*srv_.ctx.tokenizer, *srv_.ctx.harmony);
    }
    gen->open = gen->req.best_of;
    gen->created = std::time(nullptr);
    // Random (as vLLM's uuid4 ids): unique across restarts too.
    gen->object_id = (chat ? "chatcmpl-" : "cmpl-") + srv_.random_hex();
    runtime::GenerationRequest r;
    r.id = gen->id;
    r.prompt = gen->req.prompt;
    r.sampling = gen->req.sampling;
    r.n = gen->req.best_of;
    Status s = sched->submit(
        std::move(r), std::make_shared<Sink>(srv_, gen->id, gen->req.stream && gen->req.logprobs));
    if (!s.ok()) {
      if (s.code() == StatusCode::kResourceExhausted) {
        return respond_error(error_of(429, "rate_limit_error", s.message()), false,
                             "Retry-After: 1\r\n");
      }
      return respond_error(error_of(503, "service_unavailable", s.message()));
    }
    gen_ = gen;
    srv_.streams[gen->id] = weak_from_this();
    response_done_ = false;
    if (gen->req.stream) {
      srv_.metrics->http_response(200);
      std::string h =
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
          "Transfer-Encoding: chunked\r\n";
      h += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      if (chat) {  // each choice's first chunk names the role, as OpenAI's do
        const Json delta{{"role", "assistant"}, {"content", ""}};
        std::string first;
        for (int i = 0; i < gen->req.n; ++i) {
          first += sse(stream_chunk(*gen, i, delta, Json(nullptr), Json(nullptr)));
        }
        h += chunk(first);
      }
      queue_write(std::move(h));
    }
    watch();
  }

  // ---- answers ----

  Json base(const Generation& g, bool chunked) const {
    const char* object =
        g.req.chat ? (chunked ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return Json{{"id", g.object_id},
                {"object", object},
                {"created", static_cast<int64_t>(g.created)},
                {"model", srv_.ctx.served_model_name},
                {"system_fingerprint", srv_.system_fingerprint}};
  }

  Json stream_chunk(const Generation& g, int index, const Json& delta_or_text, const Json& logprobs,
                    const Json& finish_reason) const {
    Json j = base(g, true);
    Json choice{{"index", index}};
    if (g.req.chat) {
      choice["delta"] = delta_or_text;
    } else {
      choice["text"] = delta_or_text;
    }
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = finish_reason;
    j["choices"] = Json::array({choice});
    if (g.req.include_usage) j["usage"] = nullptr;
    return j;
  }

  // stream_chunk(g, index, text, null, null) as SSE, from a template made on
  // the choice's first call: the JSON of every other field is the same for
  // the whole stream, so only the text is escaped per token (nlohmann builds
  // and sorts a tree per chunk otherwise: most of the server's time per token).
  // reasoning: the chunk's delta is {"reasoning_content": text} (harmony).
  std::string text_chunk(Generation& g, int index, const std::string& text,
                         bool reasoning = false) const {
    Choice& c = g.choices[static_cast<size_t>(index)];
    std::string& prefix = reasoning ? c.reasoning_prefix : c.chunk_prefix;
    std::string& suffix = reasoning ? c.reasoning_suffix : c.chunk_suffix;
    if (prefix.empty()) {
      static const std::string kMark = "\x01msinfer-text\x01";
      const Json d =
          g.req.chat ? Json{{reasoning ? "reasoning_content" : "content", kMark}} : Json(kMark);
      const std::string whole = sse(stream_chunk(g, index, d, Json(nullptr), Json(nullptr)));
      const std::string mark = dump(Json(kMark));
      // Keys are sorted: "choices" comes first, so the first match is ours.
      const size_t at = whole.find(mark);
      MSI_CHECK(at != std::string::npos);
      prefix = whole.substr(0, at);
      suffix = whole.substr(at + mark.size());
    }
    return prefix + dump(Json(text)) + suffix;
  }

  // Logprobs of the tokens in `events` in the API's shape; appended to `acc`.
  // Each token's text is what it adds to the text after the token before it
  // (TextStream::token_bytes), so the tokens join into the text; the
  // alternatives are read in the same place.
  void add_logprobs(const Generation& g, Choice& ch, const runtime::TokenEvent& ev, Json* acc) {
    const std::string bytes = ch.text->token_bytes(ev.token, ch.logprob_before);
    const std::string tok = logprob_token(bytes);
    const int32_t before = ch.logprob_before;
    ch.logprob_before = ev.token;
    if (g.req.chat) {
      // Alternatives that write the same bytes (a byte-fallback token and a
      // whole one) are listed once, with the higher logprob (the first).
      Json top = Json::array();
      std::vector<std::string> seen;
      for (const auto& [id, lp] : ev.top_logprobs) {
        std::string b = ch.text->token_bytes(id, before);
        if (std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
        top.push_back({{"token", logprob_token(b)}, {"logprob", lp}, {"bytes", byte_array(b)}});
        seen.push_back(std::move(b));
      }
      if (acc->is_null()) *acc = Json{{"content", Json::array()}};
      (*acc)["content"].push_back({{"token", tok},
                                   {"logprob", ev.logprob},
                                   {"bytes", byte_array(bytes)},
                                   {"top_logprobs", top}});
    } else {
      if (acc->is_null()) {
        *acc = Json{{"tokens", Json::array()},
                    {"token_logprobs", Json::array()},
                    {"top_logprobs", Json::array()},
                    {"text_offset", Json::array()}};
      }
      // Two alternatives may write the same text (a byte-fallback token and
      // a whole one): the key keeps the higher logprob, the first in order.
      Json top = Json::object();
      for (const auto& [id, lp] : ev.top_logprobs) {
        const std::string key = logprob_token(ch.text->token_bytes(id, before));
        if (!top.contains(key)) top[key] = lp;
      }
      (*acc)["tokens"].push_back(tok);
      (*acc)["token_logprobs"].push_back(ev.logprob);
      (*acc)["top_logprobs"].push_back(top);
      (*acc)["text_offset"].push_back(ch.text_offset);
      ch.text_offset += text_offset_advance(bytes);
    }
  }

  // flush: the round where held stream text goes out (every stream_interval-th).
  // A stream's chunks go out choice by choice in index order within a round,
  // so n choices interleave as OpenAI's do; each choice ends with its own
  // finish_reason chunk, the response once every choice has ended.
  void on_tokens(int64_t id, std::span<const runtime::TokenEvent> events, bool flush) {
    if (closed_ || !gen_ || gen_->id != id || gen_->done) return;
    // gen_ is reset when the response ends; `keep` holds the generation until
    // this handler is done with it.
    const std::shared_ptr<Generation> keep = gen_;
    Generation& g = *keep;
    for (const auto& ev : events) {
      // The first event's (a resubmitted request's later first events: not).
      if (g.cached_tokens < 0) g.cached_tokens = ev.cached_tokens;
      if (ev.index < 0 || static_cast<size_t>(ev.index) >= g.choices.size()) continue;
      Choice& c = g.choices[static_cast<size_t>(ev.index)];
      if (!c.finish.empty()) continue;  // ended by a stop string; its sequence ran on
      if (!c.round_touched) {
        c.round_touched = true;
        c.round_text.clear();
        c.round_reasoning.clear();
        c.round_logprobs = Json();
      }
      ++c.completion_tokens;
      c.cumulative_logprob += ev.logprob;
      c.engine_finished = ev.finished;
      // A token that ended generation as a stop (a stop_token_ids token, EOS)
      // writes no text unless include_stop_str_in_output, as in vLLM.
      const bool stop_token =
          ev.finished && (ev.finish_reason == "stop" || ev.finish_reason == "eos");
      if (c.harmony) {
        // Every token goes to the parser (it never shows <|return|> and
        // <|call|>); stop strings are looked for in the content only.
        HarmonyDelta d = c.harmony->push(ev.token);
        c.round_reasoning += d.reasoning;
        c.round_text += c.text->push_text(d.content);
        if (ev.finished && !c.text->stopped()) {
          d = c.harmony->finish();
          c.round_reasoning += d.reasoning;
          c.round_text += c.text->push_text(d.content, /*counts_token=*/false);
        }
      } else if (!stop_token || g.req.include_stop_str_in_output) {
        c.round_text += c.text->push(ev.token);
      }
      if (g.req.logprobs) add_logprobs(g, c, ev, g.req.stream ? &c.round_logprobs : &c.logprobs);
      if (c.text->stopped()) {
        c.finish = "stop";
      } else if (ev.finished) {
        c.round_text += c.text->finish();
        c.finish = openai_finish_reason(ev.finish_reason);
      }
      if (!c.finish.empty()) {
        c.round_ended = true;
        --g.open;
      }
    }
    const bool all_ended = g.open == 0;
    // A choice ended by a stop string: the engine has not seen it. Its
    // sequence runs on (n > 1: the others' share the batch) until the
    // request ends, then the request is taken out.
    if (all_ended) {
      const bool running = std::any_of(g.choices.begin(), g.choices.end(),
                                       [](const Choice& c) { return !c.engine_finished; });
      if (running) {
        if (Scheduler* s = srv_.scheduler.load()) s->cancel(g.id, "stop");
      }
    }
    if (!g.req.stream) {
      for (Choice& c : g.choices) {
        if (!c.round_touched) continue;
        c.content += c.round_text;
        c.reasoning += c.round_reasoning;
        c.round_touched = c.round_ended = false;
      }
      if (all_ended) finish_plain(g);
      return;
    }
    std::string out;
    for (size_t i = 0; i < g.choices.size(); ++i) {
      Choice& c = g.choices[i];
      if (!c.round_touched) {
        // Held text of a choice without tokens this round goes out at a flush.
        if (flush && !c.held_reasoning.empty()) {
          out += text_chunk(g, static_cast<int>(i), c.held_reasoning, /*reasoning=*/true);
          c.held_reasoning.clear();
        }
        if (flush && !c.held_text.empty()) {
          out += text_chunk(g, static_cast<int>(i), c.held_text);
          c.held_text.clear();
        }
        continue;
      }
      const int index = static_cast<int>(i);
      if (!c.round_logprobs.is_null()) {
        Json d = g.req.chat ? Json{{"content", c.round_text}} : Json(c.round_text);
        if (c.harmony && !c.round_reasoning.empty()) {
          d["reasoning_content"] = c.round_reasoning;
          if (c.round_text.empty()) d.erase("content");
        }
        out += sse(stream_chunk(g, index, d, c.round_logprobs, Json(nullptr)));
      } else {
        // The first text at once, then one chunk per flush round (every
        // stream_interval steps) and at the end: fewer writes, and the time to
        // the first token as without the interval.
        c.held_text += c.round_text;
        c.held_reasoning += c.round_reasoning;
        if ((!c.held_text.empty() || !c.held_reasoning.empty()) &&
            (!c.sent_text || flush || c.round_ended)) {
          if (!c.held_reasoning.empty()) out += text_chunk(g, index, c.held_reasoning, true);
          if (!c.held_text.empty()) out += text_chunk(g, index, c.held_text);
          c.held_text.clear();
          c.held_reasoning.clear();
          c.sent_text = true;
        }
      }
      if (c.round_ended) {
        out += sse(stream_chunk(g, index, g.req.chat ? Json::object() : Json(""), Json(nullptr),
                                c.finish));
      }
      c.round_touched = c.round_ended = false;
    }
    if (all_ended) {
      if (g.req.include_usage) {
        Json u = base(g, true);
        u["choices"] = Json::array();
        u["usage"] = usage_json(static_cast<int64_t>(g.req.prompt.size()), completion_tokens(g),
                                std::max<int64_t>(0, g.cached_tokens));
        out += sse(u);
      }
      out += "data: [DONE]\n\n";
      end_generation(g);
      response_done_ = true;
      queue_write(chunk(out) + "0\r\n\r\n");
      gen_.reset();
      return;
    }
    if (!out.empty()) queue_write(chunk(out));
  }

  // The generated tokens of every choice returned (usage: the prompt once,
  // the completions summed).
  static int64_t completion_tokens(const Generation& g) {
    int64_t n = 0;
    for (const Choice& c : g.choices) n += c.completion_tokens;
    return n;
  }

  // The generation's response is complete (or abandoned): nothing more is
  // delivered to it.
  void end_generation(Generation& g) {
    g.done = true;
    srv_.streams.erase(g.id);
  }

  // Every choice ended: the answer. With best_of > n, the n sequences with
  // the highest cumulative logprob (vLLM's rule), best first, as choices
  // 0..n-1; the others are dropped (usage counts the returned ones).
  void finish_plain(Generation& g) {
    std::vector<size_t> order(g.choices.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (g.req.best_of > g.req.n) {
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return g.choices[a].cumulative_logprob > g.choices[b].cumulative_logprob;
      });
      order.resize(static_cast<size_t>(g.req.n));
      std::vector<Choice> kept;
      for (size_t i : order) kept.push_back(std::move(g.choices[i]));
      g.choices = std::move(kept);
    }
    Json j = base(g, false);
    Json choices = Json::array();
    for (size_t i = 0; i < g.choices.size(); ++i) {
      Choice& c = g.choices[i];
      Json choice{{"index", static_cast<int64_t>(i)}};
      if (g.req.chat && c.harmony) {  // a side the model wrote nothing in is null (vLLM's)
        choice["message"] = {
            {"role", "assistant"},
            {"content", c.harmony->has_content() || !c.content.empty() ? Json(c.content) : Json()},
            {"reasoning_content", c.harmony->has_reasoning() ? Json(c.reasoning) : Json()}};
      } else if (g.req.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.content}};
      } else {
        choice["text"] = c.content;
      }
      choice["logprobs"] = c.logprobs;
      choice["finish_reason"] = c.finish;
      choices.push_back(std::move(choice));
    }
    j["choices"] = std::move(choices);
    j["usage"] = usage_json(static_cast<int64_t>(g.req.prompt.size()), completion_tokens(g),
                            std::max<int64_t>(0, g.cached_tokens));
    end_generation(g);
    gen_.reset();
    respond_json(200, j);
  }

  void on_error(int64_t id, const Status& st) {
    if (closed_ || !gen_ || gen_->id != id || gen_->done) return;
    // gen_ is reset when the response ends; `keep` holds the generation until
    // this handler is done with it.
    const std::shared_ptr<Generation> keep = gen_;
    Generation& g = *keep;
    end_generation(g);
    ApiError e = error_of(
        st.code() == StatusCode::kInvalidArgument ? 400 : 503,
        st.code() == StatusCode::kInvalidArgument ? "invalid_request_error" : "service_unavailable",
        st.message());
    if (st.code() == StatusCode::kResourceExhausted)
      e = error_of(400, "invalid_request_error", st.message());
    gen_.reset();
    if (g.req.stream) {
      // The status line is out already: an error event, then the end.
      response_done_ = true;
      queue_write(chunk(sse(e.body()) + "data: [DONE]\n\n") + "0\r\n\r\n");
      return;
    }
    respond_error(e);
  }

  HttpServer::Impl& srv_;
  tcp::socket sock_;
  net::steady_timer timer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_queue_, out_writing_;
  std::shared_ptr<Generation> gen_;
  std::string client_;         // the peer's address: per-client connection counts
  int64_t header_bytes_ = 0;   // of the request being read
  int64_t bytes_read_ = 0;     // on this connection
  bool preparing_ = false;     // a request's prompt is with the prompt pool
  bool reading_ = false, watching_ = false, writing_ = false;
  bool batched_ = false;  // in srv_.batched: out_writing_ not yet sent
  bool response_done_ = true, keep_alive_ = true, closed_ = false;
};

void HttpServer::Impl::run_rounds() {
  {
    std::unique_lock<std::mutex> l(rounds_mu);
    running.swap(ready);
    posted = false;
    took_rounds(l);
  }
  deliver(running);
}

bool HttpServer::Impl::poll_rounds() {
  {
    std::unique_lock<std::mutex> l(rounds_mu);
    if (ready.empty()) return false;
    running.swap(ready);
    took_rounds(l);
  }
  deliver(running);
  return true;
}

void HttpServer::Impl::anticipate_loop() {
  using poll_clock = std::chrono::steady_clock;
  net::steady_timer alarm(ioc);
  while (!ioc.stopped()) {
    if (streams.empty() || round_gap.count() == 0) {
      ioc.run_one();
      continue;
    }
    const uint64_t seen = rounds_delivered;
    const auto due = last_round_at + round_gap;
    const auto wake_at = due - round_gap / 8;
    const auto give_up = due + round_gap / 2;
    if (poll_clock::now() > give_up) {
      // Late (a long step, or none coming): the engine thread posts it.
      while (rounds_delivered == seen && !streams.empty() && !ioc.stopped()) ioc.run_one();
      continue;
    }
    if (poll_clock::now() < wake_at) {
      // Sleep until then; sockets and early rounds are served meanwhile.
      alarm_rang = false;
      alarm.expires_at(wake_at);
      alarm.async_wait([this](beast::error_code) { alarm_rang = true; });
      while (!alarm_rang && rounds_delivered == seen && !ioc.stopped()) ioc.run_one();
      if (!alarm_rang) {
        alarm.cancel();
        while (!alarm_rang && !ioc.stopped()) ioc.run_one();  // its handler, cancelled
      }
      if (rounds_delivered != seen) continue;  // it came early
    }
    // Until the round comes; socket handlers run meanwhile.
    set_polling(true);
    IdleStretch stretch{*this};
    while (!ioc.stopped() && !streams.empty()) {
      if (rounds_waiting()) {
        stretch.work();
        poll_rounds();
        break;
      }
      if (ioc.poll() > 0) {
        stretch.work();
      } else {
        stretch.idle();
      }
      if (poll_clock::now() > give_up) break;
      ::sched_yield();  // a process sharing this cpu (a local client) runs
    }
    stretch.work();
    set_polling(false);
  }
}

void HttpServer::Impl::run_loop() {
  if (options.busy_poll.count() <= 0) {
    if (options.anticipate) {
      anticipate_loop();
    } else {
      ioc.run();
    }
    return;
  }
  using poll_clock = std::chrono::steady_clock;
  while (!ioc.stopped()) {
    if (streams.empty()) {
      ioc.run_one();  // sleeps until there is something to do
      continue;
    }
    // Streams in flight: the loop takes the engine's rounds itself and runs
    // the sockets' handlers without blocking. After busy_poll with nothing
    // to do, it sleeps again (a long step, or no stream left).
    set_polling(true);
    auto last_work = poll_clock::now();
    IdleStretch stretch{*this};
    bool idle = false;
    while (!streams.empty() && !ioc.stopped()) {
      const bool worked = ioc.poll() > 0 || poll_rounds();
      const auto now = poll_clock::now();
      if (worked) {
        stretch.work();
        last_work = now;
        continue;
      }
      stretch.idle();
      if (now - last_work > options.busy_poll) {
        idle = true;
        break;
      }
      ::sched_yield();  // a process sharing this cpu (a local client) runs
    }
    stretch.work();
    set_polling(false);
    if (idle) ioc.run_one();
  }
}

void HttpServer::Impl::deliver(std::vector<Round>& rounds) {
  batching = sender != nullptr && sender->broken().empty();
  for (Round& r : rounds) {
    if (r.flush || r.urgent) {
      if (last_round_at.time_since_epoch().count() != 0) {
        const auto gap = r.at - last_round_at;
        // Gaps of an idle engine (none in flight) are not its pace.
        if (gap > std::chrono::nanoseconds(0) && gap < std::chrono::milliseconds(100)) {
          round_gap = round_gap.count() == 0 ? gap : (3 * round_gap + gap) / 4;
        }
      }
      last_round_at = r.at;
    }
    ++rounds_delivered;
    for (Delivery& d : r.deliveries) {
      auto it = streams.find(d.id);
      if (it == streams.end()) continue;  // its response ended (cancelled, stopped)
      auto p = it->second.lock();
      if (!p) {  // the connection is gone
        streams.erase(it);
        continue;
      }
      p->guarded("delivering tokens", [&] {
        if (d.error) {
          p->on_error(d.id, *d.error);
        } else {
          p->on_tokens(d.id,
                       std::span<const runtime::TokenEvent>(r.events.data() + d.begin,
                                                            d.end - d.begin),
                       r.flush);
        }
      });
    }
    r.events.clear();
    r.deliveries.clear();
  }
  batching = false;
  send_batch();
  // Emptied rounds keep their capacity for the engine thread's next ones (a
  // few: a burst's backlog is let go).
  std::lock_guard<std::mutex> l(rounds_mu);
  for (Round& r : rounds) {
    r.flush = r.urgent = false;
    if (spare.size() < kMaxWaitingRounds + 2) spare.push_back(std::move(r));
  }
  rounds.clear();
}

void HttpServer::Impl::send_batch() {
  if (batched.empty()) return;
  batch_items.clear();
  for (auto& s : batched) batch_items.push_back(s->batch_item());
  sender->send_all(batch_items, &batch_results);
  batched_writes += static_cast<int64_t>(batched.size());
  // The sessions' next writes (a partial one's rest, the next request's
  // answer) go the usual way: this batch is over.
  std::vector<std::shared_ptr<Session>> sent;
  sent.swap(batched);
  for (size_t i = 0; i < sent.size(); ++i) sent[i]->on_batch_sent(batch_results[i]);
  sent.clear();
  batched.swap(sent);  // its capacity, for the next batch
  if (!sender->broken().empty()) {
    std::fprintf(stderr, "msinfer: server: %s; the streams' writes go one send() each from now\n",
                 sender->broken().c_str());
  }
}

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      const auto peer = sock.remote_endpoint(ignored);
      std::string client = ignored ? std::string() : peer.address().to_string();
      auto it = per_client.find(client);
      const int64_t from_client = it == per_client.end() ? 0 : it->second;
      if ((options.max_connections_per_client > 0 &&
           from_client >= options.max_connections_per_client) ||
          (connections.load() >= options.max_connections && !evict_idle())) {
        sock.close(ignored);  // over a limit: refuse at once
      } else {
        beast::error_code ignored;
        // TCP_NODELAY is set on the listening socket, and Linux hands it on
        // to the sockets it accepts: checked on the first, set on each only
        // where it is not (a system call per connection saved).
        if (nodelay_inherited < 0) {
          tcp::no_delay nd;
          sock.get_option(nd, ignored);
          nodelay_inherited = !ignored && nd.value() ? 1 : 0;
        }
        if (nodelay_inherited == 0) sock.set_option(tcp::no_delay(true), ignored);
        auto s = std::make_shared<Session>(*this, std::move(sock), std::move(client));
        // Forget closed connections now and then, not on every accept (a
        // scan of every connection per accept: quadratic in a burst).
        if (sessions.size() >= prune_sessions_at) {
          sessions.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
          prune_sessions_at = 2 * sessions.size() + 64;
        }
        sessions.push_back(s);
        s->start();
      }
    }
    accept();
  });
}

bool HttpServer::Impl::evict_idle() {
  // Oldest first: sessions is in the order of acceptance.
  for (auto it = sessions.begin(); it != sessions.end();) {
    auto s = it->lock();
    if (!s) {
      it = sessions.erase(it);
      continue;
    }
    if (s->idle()) {
      s->close();
      sessions.erase(it);
      return true;
    }
    ++it;
  }
  return false;
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const ServerOptions& o, ApiContext ctx,
                                                        Metrics* metrics) {
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->ctx = std::move(ctx);
  impl->system_fingerprint = fingerprint_of(impl->ctx);
  impl->metrics = metrics;
  beast::error_code ec;
  auto ip = resolve_host(o.host);
  if (!ip.ok()) return ip.status().with_context("--host");
  const tcp::endpoint ep(net::ip::make_address(*ip), static_cast<unsigned short>(o.port));
  const std::string where = url_authority(*ip, o.port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.set_option(tcp::no_delay(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return Status(StatusCode::kUnavailable, "cannot listen on " + where + ": " + ec.message());
  if (o.io_uring) {
    std::string why;
    impl->sender = BatchSend::create(256, &why);
    if (!impl->sender) {
      std::fprintf(stderr, "msinfer: server: no io_uring (%s): one send() per stream and step\n",
                   why.c_str());
    }
  }
  impl->prompts = std::make_unique<PromptPool>(o.tokenizer_threads);
  impl->accept();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

StatusOr<std::string> resolve_host(const std::string& host) {
  if (host.empty()) return invalid_argument("no host given");
  beast::error_code ec;
  if (net::ip::make_address(host, ec); !ec) return host;
  // No flags: unlike asio's default (address_configured), a name's IPv6
  // address counts even where only loopback has IPv6.
  net::io_context ioc;
  const auto found = tcp::resolver(ioc).resolve(host, "", tcp::resolver::flags(), ec);
  if (ec) {
    return invalid_argument("'" + host + "' is neither an IP address nor a name this machine " +
                            "resolves (" + ec.message() + ")");
  }
  std::string first6;
  for (const auto& entry : found) {
    const net::ip::address a = entry.endpoint().address();
    if (a.is_v4()) return a.to_string();
    if (first6.empty()) first6 = a.to_string();
  }
  if (!first6.empty()) return first6;
  return invalid_argument("'" + host + "' resolves to no IP address");
}

HealthAnswer health_answer(const Scheduler* scheduler, bool draining) {
  if (scheduler == nullptr) return {503, Json{{"status", "loading"}}};
  const Scheduler::Health h = scheduler->health();
  Json body = Json::object();
  bool whole = true;
  if (h.workers) {
    auto role = [&](const runtime::RoleHealth& r) {
      whole = whole && r.live >= r.expected;
      return Json{{"live", r.live}, {"expected", r.expected}};
    };
    body["workers"] =
        Json{{"attention", role(h.workers->attention)}, {"expert", role(h.workers->expert)}};
  }
  auto answer = [&](int status, const char* what) {
    body["status"] = what;
    return HealthAnswer{status, std::move(body)};
  };
  if (draining) return answer(503, "draining");
  if (!h.healthy) {
    body["error"] = h.failure;
    return answer(503, "failed");
  }
  if (h.workers && h.workers->stopped) {
    // The router stopped; the engine thread is about to find it (the same
    // failure, in a moment the log line and the error answers).
    body["error"] = h.workers->error;
    return answer(503, "failed");
  }
  if (h.workers && h.workers->recovering) return answer(503, "recovering");
  return answer(200, whole ? "ok" : "degraded");
}

std::string url_authority(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void HttpServer::run() {
  // Named so that tools (top -H, scripts/bench-serve-overhead) can tell the
  // HTTP loop's CPU time from the engine's.
  ::pthread_setname_np(::pthread_self(), "msinfer-http");
  impl_->run_loop();
  impl_->end_loop();
}

void HttpServer::set_scheduler(Scheduler* s) { impl_->scheduler = s; }

void HttpServer::set_draining() { impl_->draining = true; }

void HttpServer::stop() {
  net::post(impl_->ioc, [impl = impl_.get()] {
    // What the engine thread handed over before stop() (the errors of the
    // requests a failure or the drain's end cut off) goes out first.
    impl->poll_rounds();
    beast::error_code ec;
    impl->acceptor.close(ec);
    if (impl->signals) impl->signals->cancel(ec);
    impl->stopping = true;
    for (auto& w : impl->sessions) {
      if (auto s = w.lock()) s->close_when_flushed();
    }
    impl->sessions.clear();
    if (impl->connections.load() == 0) {
      impl->ioc.stop();
      return;
    }
    // A client that does not read its last bytes gets 5 s.
    impl->stop_timer.emplace(impl->ioc, std::chrono::seconds(5));
    impl->stop_timer->async_wait([impl](beast::error_code) { impl->ioc.stop(); });
  });
}

void HttpServer::on_signal(std::function<void(int)> f) {
  Impl* impl = impl_.get();
  impl->signals.emplace(impl->ioc, SIGINT, SIGTERM);
  struct Waiter {
    Impl* impl;
    std::function<void(int)> f;
    void operator()(beast::error_code ec, int sig) {
      if (ec) return;
      f(sig);
      impl->signals->async_wait(Waiter{impl, f});
    }
  };
  impl->signals->async_wait(Waiter{impl, std::move(f)});
}

int64_t HttpServer::connections() const { return impl_->connections.load(); }

}  // namespace msinfer::server
