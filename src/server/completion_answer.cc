#include "internal/completion_answer.h"

#include <algorithm>

#include "internal/http_wire.h"
#include "msinfer/core/logging.h"

namespace msinfer::server {
namespace {

Json byte_array(const std::string& s) {
  Json a = Json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

}  // namespace

CompletionAnswer::CompletionAnswer(ApiRequest req, int64_t id, std::string object_id,
                                   std::time_t created, const ApiContext& ctx,
                                   std::string system_fingerprint)
    : req_(std::move(req)),
      id_(id),
      object_id_(std::move(object_id)),
      created_(created),
      model_(ctx.served_model_name),
      system_fingerprint_(std::move(system_fingerprint)) {
  TextStreamOptions to;
  to.include_stop_str = req_.include_stop_str_in_output;
  to.skip_special_tokens = req_.skip_special_tokens;
  to.min_tokens = req_.sampling.min_tokens;
  choices_.resize(static_cast<size_t>(req_.best_of));
  for (Choice& c : choices_) {
    c.text.emplace(ctx.tokenizer, req_.stop, to);
    if (req_.harmony) c.harmony.emplace(*ctx.tokenizer, *ctx.harmony);
  }
  open_ = req_.best_of;
}

std::string CompletionAnswer::stream_start() const {
  std::string first;
  if (req_.chat) {  // each choice's first chunk names the role, as OpenAI's do
    const Json delta{{"role", "assistant"}, {"content", ""}};
    for (int i = 0; i < req_.n; ++i)
      first += sse(stream_chunk(i, delta, Json(nullptr), Json(nullptr)));
  }
  return first;
}

Json CompletionAnswer::base(bool chunked) const {
  const char* object =
      req_.chat ? (chunked ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return Json{{"id", object_id_},
              {"object", object},
              {"created", static_cast<int64_t>(created_)},
              {"model", model_},
              {"system_fingerprint", system_fingerprint_}};
}

Json CompletionAnswer::stream_chunk(int index, const Json& delta_or_text, const Json& logprobs,
                                    const Json& finish_reason) const {
  Json j = base(true);
  Json choice{{"index", index}};
  if (req_.chat) {
    choice["delta"] = delta_or_text;
  } else {
    choice["text"] = delta_or_text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason;
  j["choices"] = Json::array({choice});
  if (req_.include_usage) j["usage"] = nullptr;
  return j;
}

std::string CompletionAnswer::text_chunk(int index, const std::string& text, bool reasoning) {
  Choice& c = choices_[static_cast<size_t>(index)];
  std::string& prefix = reasoning ? c.reasoning_prefix : c.chunk_prefix;
  std::string& suffix = reasoning ? c.reasoning_suffix : c.chunk_suffix;
  if (prefix.empty()) {
    static const std::string kMark = "\x01msinfer-text\x01";
    const Json d =
        req_.chat ? Json{{reasoning ? "reasoning_content" : "content", kMark}} : Json(kMark);
    const std::string whole = sse(stream_chunk(index, d, Json(nullptr), Json(nullptr)));
    const std::string mark = dump(Json(kMark));
    // Keys are sorted: "choices" comes first, so the first match is ours.
    const size_t at = whole.find(mark);
    MSI_CHECK(at != std::string::npos);
    prefix = whole.substr(0, at);
    suffix = whole.substr(at + mark.size());
  }
  return prefix + dump(Json(text)) + suffix;
}

void CompletionAnswer::add_logprobs(Choice& ch, const runtime::TokenEvent& ev, Json* acc) const {
  const std::string bytes = ch.text->token_bytes(ev.token, ch.logprob_before);
  const std::string tok = logprob_token(bytes);
  const int32_t before = ch.logprob_before;
  ch.logprob_before = ev.token;
  if (req_.chat) {
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

void CompletionAnswer::take_event(const runtime::TokenEvent& ev) {
  // The first event's (a resubmitted request's later first events: not).
  if (cached_tokens_ < 0) cached_tokens_ = ev.cached_tokens;
  if (ev.index < 0 || static_cast<size_t>(ev.index) >= choices_.size()) return;
  Choice& c = choices_[static_cast<size_t>(ev.index)];
  if (!c.finish.empty()) return;  // ended by a stop string; its sequence ran on
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
  } else if (!stop_token || req_.include_stop_str_in_output) {
    c.round_text += c.text->push(ev.token);
  }
  if (req_.logprobs) add_logprobs(c, ev, req_.stream ? &c.round_logprobs : &c.logprobs);
  if (c.text->stopped()) {
    c.finish = "stop";
  } else if (ev.finished) {
    c.round_text += c.text->finish();
    c.finish = openai_finish_reason(ev.finish_reason);
  }
  if (!c.finish.empty()) {
    c.round_ended = true;
    --open_;
  }
}

CompletionAnswer::Round CompletionAnswer::take(std::span<const runtime::TokenEvent> events,
                                               bool flush) {
  Round out;
  if (done_) return out;
  for (const auto& ev : events) take_event(ev);
  out.ended = open_ == 0;
  // A choice ended by a stop string: the engine has not seen it. Its
  // sequence runs on (n > 1: the others' share the batch) until the
  // request ends, then the request is taken out.
  out.cancel = out.ended && std::any_of(choices_.begin(), choices_.end(),
                                        [](const Choice& c) { return !c.engine_finished; });
  if (!req_.stream) {
    for (Choice& c : choices_) {
      if (!c.round_touched) continue;
      c.content += c.round_text;
      c.reasoning += c.round_reasoning;
      c.round_touched = c.round_ended = false;
    }
    if (out.ended) out.body = final_body();
  } else {
    out.sse = stream_round(flush);
  }
  if (out.ended) done_ = true;
  return out;
}

std::string CompletionAnswer::stream_round(bool flush) {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    const int index = static_cast<int>(i);
    if (!c.round_touched) {
      // Held text of a choice without tokens this round goes out at a flush.
      if (flush && !c.held_reasoning.empty()) {
        out += text_chunk(index, c.held_reasoning, /*reasoning=*/true);
        c.held_reasoning.clear();
      }
      if (flush && !c.held_text.empty()) {
        out += text_chunk(index, c.held_text);
        c.held_text.clear();
      }
      continue;
    }
    if (!c.round_logprobs.is_null()) {
      Json d = req_.chat ? Json{{"content", c.round_text}} : Json(c.round_text);
      if (c.harmony && !c.round_reasoning.empty()) {
        d["reasoning_content"] = c.round_reasoning;
        if (c.round_text.empty()) d.erase("content");
      }
      out += sse(stream_chunk(index, d, c.round_logprobs, Json(nullptr)));
    } else {
      // The first text at once, then one chunk per flush round (every
      // stream_interval steps) and at the end: fewer writes, and the time to
      // the first token as without the interval.
      c.held_text += c.round_text;
      c.held_reasoning += c.round_reasoning;
      if ((!c.held_text.empty() || !c.held_reasoning.empty()) &&
          (!c.sent_text || flush || c.round_ended)) {
        if (!c.held_reasoning.empty()) out += text_chunk(index, c.held_reasoning, true);
        if (!c.held_text.empty()) out += text_chunk(index, c.held_text);
        c.held_text.clear();
        c.held_reasoning.clear();
        c.sent_text = true;
      }
    }
    if (c.round_ended) {
      out +=
          sse(stream_chunk(index, req_.chat ? Json::object() : Json(""), Json(nullptr), c.finish));
    }
    c.round_touched = c.round_ended = false;
  }
  if (open_ == 0) {
    if (req_.include_usage) {
      Json u = base(true);
      u["choices"] = Json::array();
      u["usage"] = usage_json(static_cast<int64_t>(req_.prompt.size()), completion_tokens(),
                              std::max<int64_t>(0, cached_tokens_));
      out += sse(u);
    }
    out += kSseDone;
  }
  return out;
}

int64_t CompletionAnswer::completion_tokens() const {
  int64_t n = 0;
  for (const Choice& c : choices_) n += c.completion_tokens;
  return n;
}

Json CompletionAnswer::final_body() {
  if (req_.best_of > req_.n) {
    std::vector<size_t> order(choices_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return choices_[a].cumulative_logprob > choices_[b].cumulative_logprob;
    });
    order.resize(static_cast<size_t>(req_.n));
    std::vector<Choice> kept;
    for (size_t i : order) kept.push_back(std::move(choices_[i]));
    choices_ = std::move(kept);
  }
  Json j = base(false);
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    Json choice{{"index", static_cast<int64_t>(i)}};
    if (req_.chat && c.harmony) {  // a side the model wrote nothing in is null (vLLM's)
      choice["message"] = {
          {"role", "assistant"},
          {"content", c.harmony->has_content() || !c.content.empty() ? Json(c.content) : Json()},
          {"reasoning_content", c.harmony->has_reasoning() ? Json(c.reasoning) : Json()}};
    } else if (req_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.content}};
    } else {
      choice["text"] = c.content;
    }
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = c.finish;
    choices.push_back(std::move(choice));
  }
  j["choices"] = std::move(choices);
  j["usage"] = usage_json(static_cast<int64_t>(req_.prompt.size()), completion_tokens(),
                          std::max<int64_t>(0, cached_tokens_));
  return j;
}

ApiError CompletionAnswer::error_for(const Status& st) {
  if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kResourceExhausted) {
    return error_of(400, "invalid_request_error", st.message());
  }
  return error_of(503, "service_unavailable", st.message());
}

}  // namespace msinfer::server
