// The OpenAI-compatible HTTP front end: POST /v1/completions,
// POST /v1/chat/completions (JSON or server-sent events), GET /v1/models,
// GET /health, GET /metrics.
//
// Built on Boost.Asio + Boost.Beast (Debian libboost-dev): one event-loop
// thread serves every connection asynchronously, so a thousand streaming
// clients cost a thousand sockets and small buffers, not a thousand threads.
// The Scheduler's engine thread hands each step's tokens, every request's
// together, to that loop in one post.
// Bounded memory: request bodies and headers have limits (413 / 431; the
// header limit counts every byte of every field), a request must arrive
// within request_timeout (slow senders are cut off), a reader slower than the
// tokens it is sent loses its connection (and its request) once
// max_pending_bytes are queued for it, and connections are capped in all and
// per client address.
// Nothing a client sends runs long on the event loop: prompts are tokenized on
// a pool of threads, every write is asynchronous, and an exception that
// escapes a request's handling is that request's 500, never the process's end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "msinfer/core/status.h"
#include "msinfer/server/api.h"
#include "msinfer/server/metrics.h"
#include "msinfer/server/scheduler.h"

namespace msinfer::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (port() tells which)
  std::string api_key;  // non-empty: /v1/* need "Authorization: Bearer KEY"
  int64_t max_body_bytes = 4 << 20;
  int64_t max_header_bytes = 16 << 10;
  int64_t max_pending_bytes = 1 << 20;  // queued for one slow reader before it is cut off
  // Connections open at once. At the cap a new connection takes the place of
  // the longest-idle kept-alive one (no request in progress), or is refused.
  int64_t max_connections = 4096;
  // Connections from one client address at once (0: no limit); beyond it a
  // new one is closed at once. Behind a proxy every client is one address.
  int64_t max_connections_per_client = 1024;
  // Text prompts are tokenized, and chat templates rendered, on this many
  // threads (not on the event loop); a prompt not tokenized within
  // tokenize_timeout is refused (400).
  int tokenizer_threads = 2;
  std::chrono::milliseconds tokenize_timeout{10000};
  // Streams' text goes out every this many engine steps, all streams at the
  // same steps (the first text and the end at once; 1: every token). The loop
  // is woken only at those steps, or for a first token, an end, an error or a
  // stream with logprobs.
  int64_t stream_interval = 1;
  // > 0: while streams are in flight, the loop polls for the engine's next
  // round for up to this long after its last work before it sleeps, so that
  // the engine thread hands rounds over without waking it (a wake-up costs
  // the waker ~16 us on a VM; the loop's core spins instead). 0: it sleeps.
  std::chrono::microseconds busy_poll{0};
  // Without busy_poll: while streams are in flight and the engine's steps
  // come at a steady pace, the loop sleeps on a timer until just before the
  // next step's tokens are due and polls for them (an eighth of a step or so
  // of spinning), so that the engine thread need not wake it. false: it
  // sleeps until woken.
  bool anticipate = true;
  // The engine thread waits while this many steps' tokens wait for the loop
  // to take them: a loop short of cpu slows the engine rather than the
  // tokens pile up in memory, and a reader that stops reading is found slow
  // (and cut off, max_pending_bytes) while its request still runs.
  int64_t max_rounds_ahead = 256;
  std::chrono::milliseconds request_timeout{30000};
  // The writes of an engine step go to the kernel in one io_uring submit
  // (not a send() per stream) where the kernel allows; false: a send() each.
  bool io_uring = true;
};

class HttpServer {
 public:
  // Binds and listens (UNAVAILABLE naming the address when it cannot); serves
  // from run(). Until set_scheduler(), /health answers 503 (loading) and
  // generation requests 503.
  static StatusOr<std::unique_ptr<HttpServer>> start(const ServerOptions& o, ApiContext ctx,
                                                     Metrics* metrics);
  ~HttpServer();

  int port() const;
  // Runs the event loop on this thread until stop().
  void run();
  // Thread-safe. The scheduler (not owned; outlives the server's run()).
  void set_scheduler(Scheduler* s);
  // Thread-safe. From now on /health and new generation requests answer 503.
  void set_draining();
  // Thread-safe. Stops accepting and closes every connection once what is
  // queued for it is written (at most 5 s); run() returns.
  void stop();
  // Before run(): calls f (on the event loop's thread) whenever SIGTERM or
  // SIGINT arrives; the handler is installed by this call.
  void on_signal(std::function<void(int)> f);
  // Connections open now (for tests and metrics).
  int64_t connections() const;

  struct Impl;  // opaque: the event loop, the acceptor, the connections

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The IP address (text) that `host` names, for the server's --host and the
// client's --base-url: an IPv4 or IPv6 address as it is; a name ("localhost")
// resolved by the system (/etc/hosts, DNS) to its first IPv4 address, else its
// first IPv6 one (the server binds one address; both sides pick the same).
StatusOr<std::string> resolve_host(const std::string& host);

// "host:port" as a URL writes it: an IPv6 address in brackets.
std::string url_authority(const std::string& host, int port);

// The answer to GET /health (docs/SERVING.md, "/health"): 200 with "ok", or
// "degraded" while a worker is down and the deployment still serves; 503
// with "loading" (`scheduler` null), "draining", "recovering" (serving waits
// for a replacement or a restart) or "failed" (with the error). A deployment
// adds "workers": {"attention": {"live", "expected"}, "expert": {...}}.
struct HealthAnswer {
  int status = 200;
  Json body;
};
HealthAnswer health_answer(const Scheduler* scheduler, bool draining);

}  // namespace msinfer::server
