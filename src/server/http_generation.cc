// A completion's answer on its connection: the request checked, parsed and
// tokenized (on the prompt pool), submitted to the scheduler, and its tokens
// written as they come: SSE chunks for a stream (text held for the
// --stream-interval rounds, logprobs, finish reasons, usage), one JSON body
// otherwise (best_of's ranking), or an error.
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

Json byte_array(const std::string& s) {
  Json a = Json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

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
  auto gen = std::make_shared<Generation>();
  if (auto err = parse_request_fields(req.body(), chat, srv_.ctx, &gen->req)) {
    return respond_error(*err);
  }
  if (!needs_tokenizer(gen->req)) {
    // Token ids: only the lengths are left to check, here.
    if (auto err =
            resolve_prompt(srv_.ctx, &gen->req, std::chrono::steady_clock::time_point::max())) {
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

void Session::prepared(std::shared_ptr<Generation> gen, const std::optional<ApiError>& err) {
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

void Session::submit(std::shared_ptr<Generation> gen) {
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
    std::string h = event_stream_head(keep_alive_);
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

Json Session::base(const Generation& g, bool chunked) const {
  const char* object =
      g.req.chat ? (chunked ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return Json{{"id", g.object_id},
              {"object", object},
              {"created", static_cast<int64_t>(g.created)},
              {"model", srv_.ctx.served_model_name},
              {"system_fingerprint", srv_.system_fingerprint}};
}

Json Session::stream_chunk(const Generation& g, int index, const Json& delta_or_text,
                           const Json& logprobs, const Json& finish_reason) const {
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

std::string Session::text_chunk(Generation& g, int index, const std::string& text,
                                bool reasoning) const {
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

void Session::add_logprobs(const Generation& g, Choice& ch, const runtime::TokenEvent& ev,
                           Json* acc) {
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

void Session::on_tokens(int64_t id, std::span<const runtime::TokenEvent> events, bool flush) {
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
    const bool stop_token = ev.finished && (ev.finish_reason == runtime::FinishReason::kStop ||
                                            ev.finish_reason == runtime::FinishReason::kEos);
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
      out += sse(
          stream_chunk(g, index, g.req.chat ? Json::object() : Json(""), Json(nullptr), c.finish));
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
    out += kSseDone;
    end_generation(g);
    response_done_ = true;
    queue_write(chunk(out) + kLastChunk);
    gen_.reset();
    return;
  }
  if (!out.empty()) queue_write(chunk(out));
}

int64_t Session::completion_tokens(const Generation& g) {
  int64_t n = 0;
  for (const Choice& c : g.choices) n += c.completion_tokens;
  return n;
}

void Session::end_generation(Generation& g) {
  g.done = true;
  srv_.streams.erase(g.id);
}

void Session::finish_plain(Generation& g) {
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

void Session::on_error(int64_t id, const Status& st) {
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
    queue_write(chunk(sse(e.body()) + kSseDone) + kLastChunk);
    return;
  }
  respond_error(e);
}

}  // namespace msinfer::server
