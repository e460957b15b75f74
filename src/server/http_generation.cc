// A completion request on its connection: checked, parsed and tokenized (on
// the prompt pool), submitted to the scheduler, and what its answer
// (CompletionAnswer) makes of the tokens written as they come.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "internal/http_wire.h"
#include "internal/session.h"
#include "msinfer/core/logging.h"

namespace msinfer::server {
namespace {

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

}  // namespace

void Session::begin_generation(const Request& req, bool chat) {
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
  auto gen = std::make_shared<ApiRequest>();
  if (auto err = parse_request_fields(req.body(), chat, srv_.ctx, gen.get())) {
    return respond_error(*err);
  }
  if (!needs_tokenizer(*gen)) {
    // Token ids: only the lengths are left to check, here.
    if (auto err =
            resolve_prompt(srv_.ctx, gen.get(), std::chrono::steady_clock::time_point::max())) {
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
      err = resolve_prompt(self->srv_.ctx, gen.get(), deadline);
    } catch (const std::exception& e) {
      err = error_of(500, "internal_error", std::string("internal error: ") + e.what());
    }
    net::post(self->srv_.ioc, [self, gen, err = std::move(err)]() mutable {
      self->guarded("handling the request", [&] { self->prepared(std::move(gen), err); });
    });
  });
}

void Session::prepared(std::shared_ptr<ApiRequest> gen, const std::optional<ApiError>& err) {
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

void Session::submit(std::shared_ptr<ApiRequest> req) {
  const bool chat = req->chat;
  Scheduler* sched = srv_.scheduler.load();
  if (sched == nullptr || srv_.draining || srv_.stopping) {
    return respond_error(
        error_of(503, "service_unavailable",
                 sched == nullptr ? "the model is loading" : "the server is shutting down"));
  }
  const int64_t id = sched->next_id();
  runtime::GenerationRequest r;
  r.id = id;
  r.prompt = req->prompt;
  r.sampling = req->sampling;
  r.n = req->best_of;
  const bool every_step = req->stream && req->logprobs;
  // Random (as vLLM's uuid4 ids): unique across restarts too.
  auto answer = std::make_shared<CompletionAnswer>(
      std::move(*req), id, (chat ? "chatcmpl-" : "cmpl-") + srv_.random_hex(), std::time(nullptr),
      srv_.ctx, srv_.system_fingerprint);
  Status s = sched->submit(std::move(r), std::make_shared<Sink>(srv_, id, every_step));
  if (!s.ok()) {
    if (s.code() == StatusCode::kResourceExhausted) {
      return respond_error(error_of(429, "rate_limit_error", s.message()), false,
                           "Retry-After: 1\r\n");
    }
    return respond_error(error_of(503, "service_unavailable", s.message()));
  }
  answer_ = answer;
  srv_.streams[id] = weak_from_this();
  response_done_ = false;
  if (answer->request().stream) {
    srv_.metrics->http_response(200);
    std::string h = event_stream_head(keep_alive_);
    if (const std::string first = answer->stream_start(); !first.empty()) h += chunk(first);
    queue_write(std::move(h));
  }
  watch();
}

void Session::on_tokens(int64_t id, std::span<const runtime::TokenEvent> events, bool flush) {
  if (closed_ || !answer_ || answer_->id() != id || answer_->done()) return;
  const CompletionAnswer::Round round = answer_->take(events, flush);
  if (round.cancel) {
    if (Scheduler* s = srv_.scheduler.load()) s->cancel(id, "stop");
  }
  if (!round.ended) {
    if (!round.sse.empty()) queue_write(chunk(round.sse));
    return;
  }
  const bool stream = answer_->request().stream;
  end_answer();
  if (stream) {
    response_done_ = true;
    queue_write(chunk(round.sse) + kLastChunk);
  } else {
    respond_json(200, round.body);
  }
}

void Session::end_answer() {
  answer_->abandon();
  srv_.streams.erase(answer_->id());
  answer_.reset();
}

void Session::on_error(int64_t id, const Status& st) {
  if (closed_ || !answer_ || answer_->id() != id || answer_->done()) return;
  const bool stream = answer_->request().stream;
  end_answer();
  const ApiError e = CompletionAnswer::error_for(st);
  if (stream) {
    // The status line is out already: an error event, then the end.
    response_done_ = true;
    queue_write(chunk(sse(e.body()) + kSseDone) + kLastChunk);
    return;
  }
  respond_error(e);
}

}  // namespace msinfer::server
