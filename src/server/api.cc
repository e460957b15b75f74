#include "msinfer/server/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace msinfer::server {

Json ApiError::body() const {
  return Json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? Json(nullptr) : Json(param)},
                {"code", http_status}}}};
}

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

namespace {

using Fail = std::optional<ApiError>;

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

ApiError wrong_type(const std::string& key, const char* expected, const Json& v) {
  return bad_request("'" + key + "' must be " + expected + ", got " + type_name(v), key);
}

// A field that is there and not null (null means "the default" everywhere).
bool present(const Json& j, const std::string& key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

// Optional fields: absent or null leaves *out alone.
Fail get_number(const Json& j, const std::string& key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(key, "a number", *it);
  *out = it->get<double>();
  if (!std::isfinite(*out)) return bad_request("'" + key + "' must be finite", key);
  return std::nullopt;
}

Fail get_int(const Json& j, const std::string& key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return bad_request("'" + key + "' is out of range", key);
    }
    *out = it->get<int64_t>();
    return std::nullopt;
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      *out = static_cast<int64_t>(d);
      return std::nullopt;
    }
  }
  return wrong_type(key, "an integer", *it);
}

Fail get_bool(const Json& j, const std::string& key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(key, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

// A prompt of token ids: every id an integer inside the vocabulary.
Fail token_ids(const Json& a, const std::string& key, int64_t vocab, std::vector<int32_t>* out) {
  for (const auto& v : a) {
    if (!v.is_number_integer()) return bad_request("'" + key + "' token ids must be integers", key);
    const int64_t id =
        v.is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), uint64_t{INT64_MAX}))
            : v.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return bad_request("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                             std::to_string(vocab - 1) + ")",
                         key);
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

ApiError prompt_too_long_in_bytes(size_t bytes, const ApiContext& ctx, const char* param) {
  return bad_request("the prompt is " + std::to_string(bytes) +
                         " bytes; this server takes at most " +
                         std::to_string(ctx.max_prompt_bytes) + " bytes (--max-prompt-bytes)",
                     param);
}

// The prompt of a completion: token ids as they are, text kept for
// resolve_prompt() (tokenized there, off the HTTP thread).
Fail completion_prompt(const Json& j, const ApiContext& ctx, ApiRequest* out) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return bad_request("'prompt' is required", "prompt");
  const Json& p = *it;
  auto text = [&](const std::string& s) -> Fail {
    if (ctx.tokenizer == nullptr) {
      return bad_request("this model has no tokenizer: give the prompt as token ids", "prompt");
    }
    if (ctx.max_prompt_bytes > 0 && static_cast<int64_t>(s.size()) > ctx.max_prompt_bytes) {
      return prompt_too_long_in_bytes(s.size(), ctx, "prompt");
    }
    out->prompt_text = s;
    return std::nullopt;
  };
  if (p.is_string()) return text(p.get_ref<const std::string&>());
  if (!p.is_array()) return wrong_type("prompt", "a string or an array", p);
  if (p.empty()) return bad_request("'prompt' is empty", "prompt");
  if (p[0].is_number_integer()) return token_ids(p, "prompt", ctx.vocab, &out->prompt);
  if (p.size() > 1) {
    return bad_request("only one prompt per request is supported (send one request each)",
                       "prompt");
  }
  if (p[0].is_string()) return text(p[0].get_ref<const std::string&>());
  if (p[0].is_array()) return token_ids(p[0], "prompt", ctx.vocab, &out->prompt);
  return wrong_type("prompt", "a string, an array of strings or of token ids", p);
}

// message.content: a string, null, or an array of {"type": "text", "text"} parts.
Fail message_content(const Json& m, size_t i, Json* content) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    *content = nullptr;
    return std::nullopt;
  }
  if (it->is_string()) {
    *content = *it;
    return std::nullopt;
  }
  if (!it->is_array()) return wrong_type(where, "a string or an array of parts", *it);
  std::string text;
  for (const auto& part : *it) {
    const Json* type = part.is_object() && part.contains("type") ? &part["type"] : nullptr;
    const Json* t = part.is_object() && part.contains("text") ? &part["text"] : nullptr;
    if (type == nullptr || *type != "text" || t == nullptr || !t->is_string()) {
      return bad_request(where + ": only {\"type\": \"text\", \"text\": ...} parts are supported",
                         where);
    }
    text += t->get_ref<const std::string&>();
  }
  *content = text;
  return std::nullopt;
}

// The conversation of a chat completion, checked and kept for
// resolve_prompt() (rendered and tokenized there).
Fail chat_messages(const Json& j, const ApiContext& ctx, ApiRequest* out) {
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return bad_request("'messages' is required", "messages");
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty()) return bad_request("'messages' is empty", "messages");
  if (ctx.chat_template == nullptr || ctx.tokenizer == nullptr) {
    return bad_request(
        "this model has no chat template (tokenizer_config.json chat_template); "
        "use /v1/completions",
        "messages");
  }
  Json messages = Json::array();
  size_t bytes = 0;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return wrong_type(where, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return bad_request(where + ".role must be a string", where + ".role");
    }
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool") {
      return bad_request(where + ".role '" + r + "' is not one of system, user, assistant",
                         where + ".role");
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      return bad_request("tool calls are not supported", where + ".tool_calls");
    }
    Json content;
    if (auto f = message_content(m, i, &content)) return f;
    if (content.is_null() && r != "assistant") content = "";
    if (content.is_string()) bytes += content.get_ref<const std::string&>().size();
    messages.push_back(Json{{"role", r == "developer" ? "system" : r}, {"content", content}});
  }
  if (ctx.max_prompt_bytes > 0 && static_cast<int64_t>(bytes) > ctx.max_prompt_bytes) {
    return prompt_too_long_in_bytes(bytes, ctx, "messages");
  }
  if (auto f = get_bool(j, "add_generation_prompt", &out->add_generation_prompt)) return f;
  out->messages = std::move(messages);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_request_fields(const std::string& body, bool chat,
                                             const ApiContext& ctx, ApiRequest* out) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad_request("the body is not valid JSON");
  if (!j.is_object()) return bad_request("the body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("model", "a string", *it);
    if (it->get<std::string>() != ctx.served_model_name) {
      ApiError e;
      e.http_status = 404;
      e.type = "NotFoundError";
      e.param = "model";
      e.message = "the model '" + it->get<std::string>() +
                  "' does not exist (this server serves '" + ctx.served_model_name + "')";
      return e;
    }
  }
  // Refused: what would change the output and is not implemented.
  int64_t n = 1;
  if (auto f = get_int(j, "n", &n)) return f;
  if (n != 1) return bad_request("only n = 1 is supported", "n");
  int64_t best_of = 1;
  if (auto f = get_int(j, "best_of", &best_of)) return f;
  if (best_of != 1) return bad_request("only best_of = 1 is supported", "best_of");
  bool echo = false;
  if (auto f = get_bool(j, "echo", &echo)) return f;
  if (echo) return bad_request("echo is not supported", "echo");
  for (const char* k : {"suffix", "tools", "functions", "tool_choice", "function_call"}) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null() && !(it->is_array() && it->empty()) &&
        !(it->is_string() && it->get<std::string>() == "none")) {
      return bad_request(std::string("'") + k + "' is not supported", k);
    }
  }
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("logit_bias", "an object", *it);
    if (!it->empty()) return bad_request("logit_bias is not supported", "logit_bias");
  }
  if (auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || (*it)["type"] != "text") {
      return bad_request("only response_format {\"type\": \"text\"} is supported",
                         "response_format");
    }
  }
  // The prompt (token ids here; text and conversations in resolve_prompt()).
  if (auto f = chat ? chat_messages(j, ctx, &r) : completion_prompt(j, ctx, &r)) return f;
  if (!chat && !r.prompt_text && r.prompt.empty()) return bad_request("the prompt is empty", "prompt");
  // Sampling.
  runtime::SamplingParams& sp = r.sampling;
  // max_tokens (max_completion_tokens for chat): checked against the
  // prompt's length in resolve_prompt(); absent or null, the length left.
  r.max_tokens_key = chat && present(j, "max_completion_tokens") ? "max_completion_tokens"
                                                                   : "max_tokens";
  if (auto f = get_int(j, r.max_tokens_key, &r.max_tokens_asked)) return f;
  if (present(j, r.max_tokens_key) && r.max_tokens_asked < 1) {
    return bad_request("'" + r.max_tokens_key + "' must be >= 1", r.max_tokens_key);
  }
  double temperature = 1.0, top_p = 1.0, fp = 0, pp = 0;
  if (auto f = get_number(j, "temperature", &temperature)) return f;
  // A float sampler: beyond FLT_MAX the temperature would be infinite.
  if (!(temperature >= 0 && temperature <= std::numeric_limits<float>::max()))
    return bad_request("'temperature' must be a finite number >= 0", "temperature");
  if (auto f = get_number(j, "top_p", &top_p)) return f;
  if (!(top_p > 0 && top_p <= 1)) return bad_request("'top_p' must be in (0, 1]", "top_p");
  int64_t top_k = -1;
  if (auto f = get_int(j, "top_k", &top_k)) return f;
  if (top_k < -1 || top_k > (1ll << 30))
    return bad_request("'top_k' must be -1, 0 or positive", "top_k");
  if (auto f = get_number(j, "frequency_penalty", &fp)) return f;
  if (auto f = get_number(j, "presence_penalty", &pp)) return f;
  for (auto [v, k] : {std::pair{fp, "frequency_penalty"}, {pp, "presence_penalty"}}) {
    if (v < -2 || v > 2) return bad_request(std::string("'") + k + "' must be in [-2, 2]", k);
  }
  int64_t seed = 0;
  if (auto f = get_int(j, "seed", &seed)) return f;
  if (auto f = get_bool(j, "ignore_eos", &sp.ignore_eos)) return f;
  sp.temperature = static_cast<float>(temperature);
  sp.top_p = static_cast<float>(top_p);
  sp.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  sp.frequency_penalty = static_cast<float>(fp);
  sp.presence_penalty = static_cast<float>(pp);
  sp.seed = static_cast<uint64_t>(seed);
  // Logprobs: completions take an integer (top n), chat a boolean plus top_logprobs.
  if (chat) {
    if (auto f = get_bool(j, "logprobs", &r.logprobs)) return f;
    int64_t top = 0;
    if (auto f = get_int(j, "top_logprobs", &top)) return f;
    if (top < 0 || top > 20) return bad_request("'top_logprobs' must be in 0..20", "top_logprobs");
    if (top > 0 && !r.logprobs) {
      return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    }
    sp.logprobs = r.logprobs ? static_cast<int>(top) : -1;
  } else {
    int64_t lp = -1;
    if (auto it = j.find("logprobs"); it != j.end() && it->is_boolean()) {
      return wrong_type("logprobs", "an integer", *it);
    }
    if (auto f = get_int(j, "logprobs", &lp)) return f;
    if (lp < -1 || lp > 20) return bad_request("'logprobs' must be in 0..20", "logprobs");
    r.logprobs = lp >= 0;
    sp.logprobs = static_cast<int>(lp);
  }
  // Stop strings.
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string())
          return bad_request("'stop' must be a string or an array of strings", "stop");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *it);
    }
    r.stop.erase(std::remove(r.stop.begin(), r.stop.end(), std::string()), r.stop.end());
    if (r.stop.size() > 16) return bad_request("at most 16 stop strings", "stop");
    for (const auto& s : r.stop) {
      if (s.size() > 256) return bad_request("a stop string is longer than 256 bytes", "stop");
    }
  }
  // Streaming.
  if (auto f = get_bool(j, "stream", &r.stream)) return f;
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("stream_options", "an object", *it);
    if (!r.stream) return bad_request("'stream_options' needs 'stream': true", "stream_options");
    if (auto f = get_bool(*it, "include_usage", &r.include_usage)) {
      f->param = "stream_options.include_usage";
      return f;
    }
  }
  // What validate() checks that depends on max_tokens waits for it.
  sp.max_tokens = 1;
  Status v = sp.validate();
  if (!v.ok()) return bad_request(v.message());
  *out = std::move(r);
  return std::nullopt;
}

std::optional<ApiError> resolve_prompt(const ApiContext& ctx, ApiRequest* r,
                                       std::chrono::steady_clock::time_point deadline) {
  const char* param = r->chat ? "messages" : "prompt";
  auto tokenize = [&](const std::string& text, bool add_special) -> Fail {
    auto ids = ctx.tokenizer->encode(text, add_special, deadline);
    if (ids.status().code() == StatusCode::kDeadlineExceeded) {
      return bad_request("tokenizing the prompt took longer than this server allows " +
                             std::string("(--tokenize-timeout); send a shorter prompt"),
                         param);
    }
    if (!ids.ok()) return bad_request(ids.status().message(), param);
    r->prompt = std::move(ids).value();
    return std::nullopt;
  };
  if (r->chat) {
    Json context{{"messages", std::move(r->messages)},
                 {"bos_token", ctx.bos_token},
                 {"eos_token", ctx.eos_token},
                 {"add_generation_prompt", r->add_generation_prompt}};
    r->messages = Json();
    auto text = ctx.chat_template->render(context);
    if (!text.ok()) return bad_request("chat template: " + text.status().message(), param);
    // The template writes the special tokens itself (BOS included).
    if (auto f = tokenize(*text, /*add_special=*/false)) return f;
    if (r->prompt.empty()) return bad_request("the rendered conversation is empty", param);
  } else if (r->prompt_text) {
    if (auto f = tokenize(*r->prompt_text, /*add_special=*/true)) return f;
    r->prompt_text.reset();
  }
  if (r->prompt.empty()) return bad_request("the prompt is empty", param);
  const int64_t plen = static_cast<int64_t>(r->prompt.size());
  if (plen >= ctx.max_model_len) {
    return bad_request("the prompt has " + std::to_string(plen) +
                           " tokens; this model's maximum context length is " +
                           std::to_string(ctx.max_model_len) + " tokens",
                       param);
  }
  const int64_t left = ctx.max_model_len - plen;
  if (r->max_tokens_asked == -1) {
    r->sampling.max_tokens = static_cast<int>(left);
  } else if (r->max_tokens_asked > left) {
    return bad_request("this model's maximum context length is " +
                           std::to_string(ctx.max_model_len) + " tokens; the prompt has " +
                           std::to_string(plen) + " and " + r->max_tokens_key + " asks for " +
                           std::to_string(r->max_tokens_asked),
                       r->max_tokens_key);
  } else {
    r->sampling.max_tokens = static_cast<int>(r->max_tokens_asked);
  }
  return std::nullopt;
}

bool needs_tokenizer(const ApiRequest& r) { return r.chat || r.prompt_text.has_value(); }

std::optional<ApiError> parse_request(const std::string& body, bool chat, const ApiContext& ctx,
                                      ApiRequest* out) {
  if (auto e = parse_request_fields(body, chat, ctx, out)) return e;
  return resolve_prompt(ctx, out, std::chrono::steady_clock::time_point::max());
}

std::string openai_finish_reason(const std::string& engine_reason) {
  return engine_reason == "length" ? "length" : "stop";
}

TextStream::TextStream(const model::Tokenizer* t, std::vector<std::string> stop)
    : t_(t), stop_(std::move(stop)) {
  if (t_ != nullptr) decoder_.emplace(*t_);
}

std::string TextStream::push(int32_t token) {
  if (stopped_ || !decoder_) return "";
  held_ += decoder_->push(token);
  if (stop_.empty()) return std::move(held_);
  // The earliest stop string wins; nothing from it on is emitted.
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that could still become a stop string.
  size_t keep = 0;
  for (const auto& s : stop_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::finish() {
  if (stopped_ || !decoder_) return "";
  std::string out = std::move(held_) + decoder_->finish();
  held_.clear();
  return out;
}

std::string TextStream::token_text(int32_t token) const {
  return t_ == nullptr ? "" : t_->decode({token}, /*skip_special_tokens=*/false);
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace msinfer::server
