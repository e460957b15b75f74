// One client connection (Session): reads requests (limits, timeouts) and
// writes answers (queued, back-pressure, batched submits). Its parts by
// job: http_session.cc (reading, writing, closing), http_routes.cc (the
// route table and the endpoints' handlers), http_generation.cc (a completion
// request: parse, tokenize on the prompt pool, submit, write what its
// CompletionAnswer makes of the tokens). Lives on the event loop's thread;
// kept alive by the handlers of its pending operations.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "completion_answer.h"
#include "server_impl.h"

namespace msinfer::server {

using Request = http::request<http::string_body>;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& srv, tcp::socket sock, std::string client)
      : srv_(srv), sock_(std::move(sock)), timer_(srv.ioc), client_(std::move(client)) {}

  void start();
  // Waiting for a request that has not begun: no byte of it read, nothing in
  // progress or being written (what evict_idle() may close).
  bool idle() const;
  void close();
  // Stopping: close now, or once what is queued for the client is written
  // (the end of a drained stream, an error event).
  void close_when_flushed();

  // ---- for the handlers (http_routes.cc) ----
  HttpServer::Impl& server() { return srv_; }
  void respond(int status, const std::string& content_type, const std::string& body,
               const std::string& extra_headers = "", bool close_after = false);
  void respond_json(int status, const Json& j, const std::string& extra_headers = "");
  void respond_error(const ApiError& e, bool close_after = false,
                     const std::string& extra_headers = "");
  // POST /v1/completions and /v1/chat/completions past routing and auth:
  // checks, parses, tokenizes (on the prompt pool) and submits.
  void begin_generation(const Request& req, bool chat);

 private:
  friend struct HttpServer::Impl;  // run_rounds() delivers on_tokens and on_error

  // ---- reading requests (http_session.cc) ----
  void do_read();
  // The header a piece at a time, counting what the parser took, so that
  // max_header_bytes bounds all fields together however they arrive, by our
  // own count (25,000 short fields were reported to pass Beast's; with
  // Debian's Boost 1.74 its limit held in ServeHostileTest too).
  void read_header_part();
  void on_header_part(beast::error_code ec, size_t n);
  bool read_failed(beast::error_code ec);
  void on_header(beast::error_code ec);
  void on_read(beast::error_code ec);
  // Runs the route the request names (http_routes.cc).
  void handle(Request req);

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

  void internal_failure(const char* what, const char* why);
  // Watches for the client going away while its request runs: the only read
  // outstanding then. Bytes that arrive (a pipelined request) stay in buf_.
  void watch();
  void on_watch(beast::error_code ec, size_t n);

  // ---- writing (http_session.cc) ----
  void queue_write(std::string data);
  void flush();
  void start_write();
  // This session's part of a batch (send_batch).
  BatchSend::Item batch_item();
  // res: what BatchSend returned for batch_item(): bytes sent or -errno.
  void on_batch_sent(long res);
  void on_write(beast::error_code ec);

  // ---- a completion request (http_generation.cc) ----
  // Loop: the prompt pool is done with the request's prompt.
  void prepared(std::shared_ptr<ApiRequest> req, const std::optional<ApiError>& err);
  // Hands a resolved request to the scheduler and starts its answer.
  void submit(std::shared_ptr<ApiRequest> req);
  // Writes what the answer makes of a round of token events.
  void on_tokens(int64_t id, std::span<const runtime::TokenEvent> events, bool flush);
  void on_error(int64_t id, const Status& st);
  // The answer is complete or abandoned: nothing more is delivered to it.
  void end_answer();

  HttpServer::Impl& srv_;
  tcp::socket sock_;
  net::steady_timer timer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_queue_, out_writing_;
  std::shared_ptr<CompletionAnswer> answer_;  // the request being answered
  std::string client_;        // the peer's address: per-client connection counts
  int64_t header_bytes_ = 0;  // of the request being read
  int64_t bytes_read_ = 0;    // on this connection
  bool preparing_ = false;    // a request's prompt is with the prompt pool
  bool reading_ = false, watching_ = false, writing_ = false;
  bool batched_ = false;  // in srv_.batched: out_writing_ not yet sent
  bool response_done_ = true, keep_alive_ = true, closed_ = false;
};

}  // namespace msinfer::server
