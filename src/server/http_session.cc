// A connection's transport: reading a request within the limits (header
// bytes, body bytes, request_timeout), watching for the client leaving while
// its request runs, and writing: one queue per connection, a reader slower
// than its tokens cut off at max_pending_bytes, a loop round's writes
// batched into one submit (BatchSend).
#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "internal/http_wire.h"
#include "internal/session.h"

namespace msinfer::server {

void Session::start() {
  ++srv_.connections;
  ++srv_.per_client[client_];
  do_read();
}

bool Session::idle() const {
  return !closed_ && reading_ && header_bytes_ == 0 && buf_.size() == 0 && !answer_ &&
         !preparing_ && !writing_ && out_queue_.empty();
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  if (auto it = srv_.per_client.find(client_); it != srv_.per_client.end() && --it->second <= 0) {
    srv_.per_client.erase(it);
  }
  // Much read (a large body, a header flood): its buffers' pages go back.
  if (bytes_read_ + static_cast<int64_t>(buf_.capacity()) > (32 << 10)) srv_.trim_soon();
  if (answer_) {
    const int64_t id = answer_->id();
    end_answer();
    if (Scheduler* s = srv_.scheduler.load()) s->cancel(id);
  }
  beast::error_code ec;
  sock_.shutdown(tcp::socket::shutdown_both, ec);
  sock_.close(ec);
  timer_.cancel();
  // The last connection of a stopping server ends the event loop.
  if (--srv_.connections == 0 && srv_.stopping) srv_.ioc.stop();
}

void Session::close_when_flushed() {
  if (closed_) return;
  if (writing_ || !out_queue_.empty()) {
    keep_alive_ = false;
    response_done_ = true;
    return;  // on_write closes
  }
  close();
}

void Session::do_read() {
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

void Session::read_header_part() {
  http::async_read_some(
      sock_, buf_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_header_part(ec, n); });
}

void Session::on_header_part(beast::error_code ec, size_t n) {
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

bool Session::read_failed(beast::error_code ec) {
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
    respond_error(error_of(400, "invalid_request_error", "malformed HTTP request: " + ec.message()),
                  true);
  }
  return true;
}

void Session::on_header(beast::error_code ec) {
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
    queue_write(kContinue);
    if (closed_) return;
  }
  http::async_read(sock_, buf_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t n) {
                     self->bytes_read_ += static_cast<int64_t>(n);
                     self->on_read(ec);
                   });
}

void Session::on_read(beast::error_code ec) {
  if (read_failed(ec)) return;
  reading_ = false;
  timer_.cancel();
  guarded("handling the request", [&] { handle(parser_->release()); });
}

void Session::internal_failure(const char* what, const char* why) {
  std::fprintf(stderr, "msinfer: server: %s failed: %s\n", what, why);
  if (closed_) return;
  preparing_ = false;
  if (answer_) {
    const int64_t id = answer_->id();
    const bool stream = answer_->request().stream;
    end_answer();
    if (Scheduler* s = srv_.scheduler.load()) s->cancel(id);
    // A stream's status line may be out: nothing sensible can follow.
    if (stream) return close();
  }
  respond_error(
      error_of(500, "internal_error", std::string("internal error while ") + what + ": " + why),
      true);
}

void Session::watch() {
  if (closed_ || watching_ || reading_) return;
  watching_ = true;
  sock_.async_read_some(
      buf_.prepare(4096),
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
}

void Session::on_watch(beast::error_code ec, size_t n) {
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
  if (answer_ || preparing_) {
    watch();
  } else if (response_done_ && !writing_) {
    do_read();
  }
}

void Session::queue_write(std::string data) {
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

void Session::flush() {
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

void Session::start_write() {
  net::async_write(
      sock_, net::buffer(out_writing_),
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
}

BatchSend::Item Session::batch_item() {
  return {closed_ ? -1 : sock_.native_handle(), out_writing_.data(), out_writing_.size()};
}

void Session::on_batch_sent(long res) {
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

void Session::on_write(beast::error_code ec) {
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

void Session::respond(int status, const std::string& content_type, const std::string& body,
                      const std::string& extra_headers, bool close_after) {
  if (close_after) keep_alive_ = false;
  std::string r = response_head(status, content_type, body.size(), extra_headers, keep_alive_);
  r += body;
  srv_.metrics->http_response(status);
  response_done_ = true;
  queue_write(std::move(r));
}

void Session::respond_json(int status, const Json& j, const std::string& extra_headers) {
  respond(status, "application/json", dump(j), extra_headers);
}

void Session::respond_error(const ApiError& e, bool close_after, const std::string& extra_headers) {
  respond(e.http_status, "application/json", dump(e.body()), extra_headers, close_after);
}

}  // namespace msinfer::server
