#include "msinfer/server/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <mutex>
#include <random>

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

const std::vector<RequestField>& request_fields() {
  using E = FieldEndpoint;
  using U = FieldUse;
  static const std::vector<RequestField> kFields = {
      // OpenAI.
      {"model", E::kBoth, U::kHonoured, "\"m\"", ""},
      {"prompt", E::kCompletions, U::kHonoured, "\"Hi\"", ""},
      {"messages", E::kChat, U::kHonoured, "[]", ""},
      {"max_tokens", E::kBoth, U::kHonoured, "4", ""},
      {"max_completion_tokens", E::kBoth, U::kHonoured, "4", ""},
      {"temperature", E::kBoth, U::kHonoured, "0.5", ""},
      {"top_p", E::kBoth, U::kHonoured, "0.9", ""},
      {"seed", E::kBoth, U::kHonoured, "7", ""},
      {"stop", E::kBoth, U::kHonoured, "[\"x\"]", ""},
      {"frequency_penalty", E::kBoth, U::kHonoured, "0.5", ""},
      {"presence_penalty", E::kBoth, U::kHonoured, "0.5", ""},
      {"logprobs", E::kCompletions, U::kHonoured, "2", ""},
      {"logprobs", E::kChat, U::kHonoured, "true", ""},
      {"top_logprobs", E::kChat, U::kHonoured, "2", ""},
      {"reasoning_effort", E::kChat, U::kHonoured, "\"low\"", ""},
      {"stream", E::kBoth, U::kHonoured, "true", ""},
      {"stream_options", E::kBoth, U::kHonoured, "{\"include_usage\": true}", ""},
      {"n", E::kBoth, U::kHonoured, "2", ""},
      // Its example is 1: the table's test sends every field with stream
      // true, and a stream refuses best_of != n (as OpenAI does).
      {"best_of", E::kCompletions, U::kHonoured, "1", ""},
      {"echo", E::kBoth, U::kRefused, "true", "[false]"},
      {"suffix", E::kCompletions, U::kRefused, "\"x\"", "[]"},
      {"logit_bias", E::kBoth, U::kRefused, "{\"5\": 1}", "[{}]"},
      {"response_format", E::kBoth, U::kRefused, "{\"type\": \"json_object\"}",
       "[{\"type\": \"text\"}]"},
      {"tools", E::kChat, U::kRefused, "[{\"type\": \"function\"}]", "[[]]"},
      {"tool_choice", E::kChat, U::kRefused, "\"auto\"", "[\"none\"]"},
      {"functions", E::kChat, U::kRefused, "[{\"name\": \"f\"}]", "[[]]"},
      {"function_call", E::kChat, U::kRefused, "\"auto\"", "[\"none\"]"},
      {"audio", E::kChat, U::kRefused, "{\"voice\": \"alloy\"}", "[]"},
      {"modalities", E::kChat, U::kRefused, "[\"audio\"]", "[[\"text\"]]"},
      {"prediction", E::kChat, U::kRefused, "{\"type\": \"content\", \"content\": \"x\"}", "[]"},
      {"verbosity", E::kChat, U::kRefused, "\"low\"", "[]"},
      {"web_search_options", E::kChat, U::kRefused, "{\"search_context_size\": \"low\"}", "[]"},
      {"user", E::kBoth, U::kNoEffect, "\"u\"", ""},
      {"metadata", E::kChat, U::kNoEffect, "{\"k\": \"v\"}", ""},
      {"store", E::kChat, U::kNoEffect, "true", ""},
      {"service_tier", E::kChat, U::kNoEffect, "\"auto\"", ""},
      {"parallel_tool_calls", E::kChat, U::kNoEffect, "true", ""},
      {"prompt_cache_key", E::kChat, U::kNoEffect, "\"k\"", ""},
      {"safety_identifier", E::kChat, U::kNoEffect, "\"s\"", ""},
      // vLLM's extensions.
      {"top_k", E::kBoth, U::kHonoured, "5", ""},
      {"min_p", E::kBoth, U::kHonoured, "0.1", ""},
      {"repetition_penalty", E::kBoth, U::kHonoured, "1.2", ""},
      {"min_tokens", E::kBoth, U::kHonoured, "2", ""},
      {"stop_token_ids", E::kBoth, U::kHonoured, "[2]", ""},
      {"include_stop_str_in_output", E::kBoth, U::kHonoured, "true", ""},
      {"ignore_eos", E::kBoth, U::kHonoured, "true", ""},
      {"skip_special_tokens", E::kBoth, U::kHonoured, "false", ""},
      {"add_special_tokens", E::kBoth, U::kHonoured, "true", ""},
      {"add_generation_prompt", E::kChat, U::kHonoured, "false", ""},
      {"request_id", E::kBoth, U::kNoEffect, "\"r\"", ""},
      {"cache_salt", E::kBoth, U::kNoEffect, "\"s\"", ""},
      {"use_beam_search", E::kBoth, U::kRefused, "true", "[false]"},
      {"length_penalty", E::kBoth, U::kRefused, "0.5", "[1]"},
      {"spaces_between_special_tokens", E::kBoth, U::kRefused, "false", "[true]"},
      {"truncate_prompt_tokens", E::kBoth, U::kRefused, "2", "[]"},
      {"prompt_logprobs", E::kBoth, U::kRefused, "1", "[]"},
      {"allowed_token_ids", E::kBoth, U::kRefused, "[1]", "[]"},
      {"bad_words", E::kBoth, U::kRefused, "[\"x\"]", "[[]]"},
      {"logits_processors", E::kBoth, U::kRefused, "[\"p\"]", "[[]]"},
      {"guided_json", E::kBoth, U::kRefused, "{\"type\": \"object\"}", "[]"},
      {"guided_regex", E::kBoth, U::kRefused, "\"a+\"", "[]"},
      {"guided_choice", E::kBoth, U::kRefused, "[\"a\", \"b\"]", "[]"},
      {"guided_grammar", E::kBoth, U::kRefused, "\"root ::= \\\"a\\\"\"", "[]"},
      {"guided_decoding_backend", E::kBoth, U::kRefused, "\"xgrammar\"", "[]"},
      {"guided_whitespace_pattern", E::kBoth, U::kRefused, "\" \"", "[]"},
      {"structured_outputs", E::kBoth, U::kRefused, "{\"regex\": \"a+\"}", "[]"},
      {"return_tokens_as_token_ids", E::kBoth, U::kRefused, "true", "[false]"},
      {"return_token_ids", E::kBoth, U::kRefused, "true", "[false]"},
      {"priority", E::kBoth, U::kRefused, "1", "[0]"},
      {"kv_transfer_params", E::kBoth, U::kRefused, "{\"a\": 1}", "[]"},
      {"vllm_xargs", E::kBoth, U::kRefused, "{\"a\": 1}", "[]"},
      {"prompt_embeds", E::kCompletions, U::kRefused, "\"AAAA\"", "[]"},
      {"continue_final_message", E::kChat, U::kRefused, "true", "[false]"},
      {"chat_template", E::kChat, U::kRefused, "\"{{ messages }}\"", "[]"},
      {"chat_template_kwargs", E::kChat, U::kRefused, "{\"enable_thinking\": false}", "[{}]"},
      {"documents", E::kChat, U::kRefused, "[{\"text\": \"x\"}]", "[[]]"},
      {"mm_processor_kwargs", E::kChat, U::kRefused, "{\"a\": 1}", "[{}]"},
      {"stream_options.continuous_usage_stats", E::kBoth, U::kRefused, "true", "[false]"},
  };
  return kFields;
}

const char* field_use_name(FieldUse u) {
  switch (u) {
    case FieldUse::kHonoured:
      return "honoured";
    case FieldUse::kNoEffect:
      return "no effect";
    case FieldUse::kRefused:
      return "refused";
  }
  return "?";
}

uint64_t random_seed() {
  // One generator seeded from the OS per process (a read of /dev/urandom or
  // getrandom per request would cost a system call each).
  static std::mutex mu;
  static std::mt19937_64 gen = [] {
    std::random_device rd;
    return std::mt19937_64((static_cast<uint64_t>(rd()) << 32) ^ rd());
  }();
  std::lock_guard<std::mutex> l(mu);
  return gen();
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

// The fields request_fields() marks kRefused: a 400 naming the first one set
// to something other than null or an allowed value.
Fail refused_fields(const Json& j) {
  static const std::vector<std::pair<std::string, Json>> kRefused = [] {
    std::vector<std::pair<std::string, Json>> v;
    for (const RequestField& f : request_fields()) {
      if (f.use == FieldUse::kRefused) v.emplace_back(f.name, Json::parse(f.allowed));
    }
    return v;
  }();
  for (const auto& [name, allowed] : kRefused) {
    const Json* v = &j;
    for (size_t at = 0; v != nullptr;) {
      const size_t dot = name.find('.', at);
      const std::string key = name.substr(at, dot == std::string::npos ? dot : dot - at);
      auto it = v->is_object() ? v->find(key) : v->end();
      v = it == v->end() ? nullptr : &*it;
      if (dot == std::string::npos) break;
      at = dot + 1;
    }
    if (v == nullptr || v->is_null()) continue;
    if (std::find(allowed.begin(), allowed.end(), *v) != allowed.end()) continue;
    return bad_request(
        "'" + name + "' is not supported by this server" +
            (allowed.empty() ? std::string() : " (accepted: " + allowed.dump() + ")"),
        name);
  }
  return std::nullopt;
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
  if ((ctx.chat_template == nullptr && ctx.harmony == nullptr) || ctx.tokenizer == nullptr) {
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
  if (auto e = j.find("reasoning_effort"); e != j.end() && !e->is_null()) {
    if (!e->is_string()) return wrong_type("reasoning_effort", "a string", *e);
    const std::string v = e->get<std::string>();
    if (v != "low" && v != "medium" && v != "high") {
      return bad_request("'reasoning_effort' must be \"low\", \"medium\" or \"high\", got \"" +
                             v.substr(0, 32) + "\"",
                         "reasoning_effort");
    }
    out->reasoning_effort = v;
  }
  out->harmony = ctx.harmony != nullptr;
  out->messages = std::move(messages);
  return std::nullopt;
}

// The model's name and how many choices of how many sequences (n, best_of:
// completions only); the bound is the server's.
Fail model_and_choices(const Json& j, bool chat, const ApiContext& ctx, ApiRequest* r) {
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
  // n choices, of best_of sequences (completions); the bound is the server's.
  int64_t n = 1;
  if (auto f = get_int(j, "n", &n)) return f;
  if (n < 1) return bad_request("'n' must be >= 1", "n");
  if (n > ctx.max_n) {
    return bad_request("'n' is " + std::to_string(n) + "; this server returns at most " +
                           std::to_string(ctx.max_n) + " choices per request (--max-n)",
                       "n");
  }
  int64_t best_of = n;
  if (!chat) {
    if (auto f = get_int(j, "best_of", &best_of)) return f;
    if (best_of < n) {
      return bad_request(
          "'best_of' (" + std::to_string(best_of) + ") must be >= n (" + std::to_string(n) + ")",
          "best_of");
    }
    if (best_of > ctx.max_n) {
      return bad_request("'best_of' is " + std::to_string(best_of) +
                             "; this server generates at most " + std::to_string(ctx.max_n) +
                             " sequences per request (--max-n)",
                         "best_of");
    }
  }
  r->n = static_cast<int>(n);
  r->best_of = static_cast<int>(best_of);
  return std::nullopt;
}

// What would change the output and is not implemented is refused.
Fail refused_output_fields(const Json& j) {
  bool echo = false;
  if (auto f = get_bool(j, "echo", &echo)) return f;
  if (echo) return bad_request("echo is not supported", "echo");
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
  return refused_fields(j);
}

// The sampling parameters (OpenAI's and vLLM's extensions) into
// r->sampling; max_tokens is checked against the prompt later.
Fail sampling_fields(const Json& j, const ApiContext& ctx, ApiRequest* r) {
  runtime::SamplingParams& sp = r->sampling;
  // max_tokens (or max_completion_tokens, which wins): checked against the
  // prompt's length in resolve_prompt(); absent or null, the length left.
  r->max_tokens_key = present(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto f = get_int(j, r->max_tokens_key, &r->max_tokens_asked)) return f;
  if (present(j, r->max_tokens_key) && r->max_tokens_asked < 1) {
    return bad_request("'" + r->max_tokens_key + "' must be >= 1", r->max_tokens_key);
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
  // vLLM's sampling extensions.
  double min_p = 0, rep = 1;
  if (auto f = get_number(j, "min_p", &min_p)) return f;
  if (!(min_p >= 0 && min_p <= 1)) return bad_request("'min_p' must be in [0, 1]", "min_p");
  if (auto f = get_number(j, "repetition_penalty", &rep)) return f;
  // Beyond FLT_MAX the float would be infinite; below FLT_MIN, 0.
  if (!(rep >= std::numeric_limits<float>::min() && rep <= std::numeric_limits<float>::max())) {
    return bad_request("'repetition_penalty' must be a finite number > 0", "repetition_penalty");
  }
  int64_t min_tokens = 0;
  if (auto f = get_int(j, "min_tokens", &min_tokens)) return f;
  if (min_tokens < 0 || min_tokens > INT32_MAX) {
    return bad_request("'min_tokens' must be >= 0", "min_tokens");
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return wrong_type("stop_token_ids", "an array of token ids", *it);
    if (it->size() > 256) return bad_request("at most 256 stop_token_ids", "stop_token_ids");
    if (auto f = token_ids(*it, "stop_token_ids", ctx.vocab, &sp.stop_token_ids)) return f;
  }
  // Harmony: <|return|> ends the answer, <|call|> a tool call (vLLM adds both).
  if (r->harmony) {
    for (int32_t id : {ctx.harmony->ret, ctx.harmony->call}) {
      if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), id) ==
          sp.stop_token_ids.end()) {
        sp.stop_token_ids.push_back(id);
      }
    }
  }
  if (auto f = get_bool(j, "include_stop_str_in_output", &r->include_stop_str_in_output)) return f;
  if (auto f = get_bool(j, "skip_special_tokens", &r->skip_special_tokens)) return f;
  if (present(j, "add_special_tokens")) {
    bool add = false;
    if (auto f = get_bool(j, "add_special_tokens", &add)) return f;
    r->add_special_tokens = add;
  }
  int64_t seed = 0;
  if (auto f = get_int(j, "seed", &seed)) return f;
  r->seeded = present(j, "seed");
  if (auto f = get_bool(j, "ignore_eos", &sp.ignore_eos)) return f;
  sp.temperature = static_cast<float>(temperature);
  sp.top_p = static_cast<float>(top_p);
  sp.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  sp.frequency_penalty = static_cast<float>(fp);
  sp.presence_penalty = static_cast<float>(pp);
  sp.min_p = static_cast<float>(min_p);
  sp.repetition_penalty = static_cast<float>(rep);
  sp.min_tokens = static_cast<int>(min_tokens);
  // No seed: a fresh one, so that repeated requests get varied samples (a
  // seed keeps them reproducible).
  sp.seed = r->seeded ? static_cast<uint64_t>(seed) : random_seed();
  return std::nullopt;
}

// Logprobs: completions take an integer (top n), chat a boolean plus top_logprobs.
Fail logprob_fields(const Json& j, bool chat, ApiRequest* r) {
  runtime::SamplingParams& sp = r->sampling;
  if (chat) {
    if (auto f = get_bool(j, "logprobs", &r->logprobs)) return f;
    int64_t top = 0;
    if (auto f = get_int(j, "top_logprobs", &top)) return f;
    if (top < 0 || top > 20) return bad_request("'top_logprobs' must be in 0..20", "top_logprobs");
    if (top > 0 && !r->logprobs) {
      return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    }
    sp.logprobs = r->logprobs ? static_cast<int>(top) : -1;
  } else {
    int64_t lp = -1;
    if (auto it = j.find("logprobs"); it != j.end() && it->is_boolean()) {
      return wrong_type("logprobs", "an integer", *it);
    }
    if (auto f = get_int(j, "logprobs", &lp)) return f;
    if (lp < -1 || lp > 20) return bad_request("'logprobs' must be in 0..20", "logprobs");
    r->logprobs = lp >= 0;
    sp.logprobs = static_cast<int>(lp);
  }
  return std::nullopt;
}

// Stop strings: a string or an array of them, empty ones dropped.
Fail stop_strings(const Json& j, ApiRequest* r) {
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      r->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string())
          return bad_request("'stop' must be a string or an array of strings", "stop");
        r->stop.push_back(s.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *it);
    }
    r->stop.erase(std::remove(r->stop.begin(), r->stop.end(), std::string()), r->stop.end());
    if (r->stop.size() > 16) return bad_request("at most 16 stop strings", "stop");
    for (const auto& s : r->stop) {
      if (s.size() > 256) return bad_request("a stop string is longer than 256 bytes", "stop");
    }
  }
  return std::nullopt;
}

// stream and stream_options.
Fail stream_fields(const Json& j, ApiRequest* r) {
  if (auto f = get_bool(j, "stream", &r->stream)) return f;
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("stream_options", "an object", *it);
    if (!r->stream) return bad_request("'stream_options' needs 'stream': true", "stream_options");
    if (auto f = get_bool(*it, "include_usage", &r->include_usage)) {
      f->param = "stream_options.include_usage";
      return f;
    }
  }
  // A stream sends every sequence as it is made: none can be left out.
  if (r->stream && r->best_of != r->n) {
    return bad_request("'best_of' must equal n when streaming", "best_of");
  }
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
  if (auto f = model_and_choices(j, chat, ctx, &r)) return f;
  if (auto f = refused_output_fields(j)) return f;
  // The prompt (token ids here; text and conversations in resolve_prompt()).
  if (auto f = chat ? chat_messages(j, ctx, &r) : completion_prompt(j, ctx, &r)) return f;
  if (!chat && !r.prompt_text && r.prompt.empty())
    return bad_request("the prompt is empty", "prompt");
  if (auto f = sampling_fields(j, ctx, &r)) return f;
  if (auto f = logprob_fields(j, chat, &r)) return f;
  if (auto f = stop_strings(j, &r)) return f;
  if (auto f = stream_fields(j, &r)) return f;
  // best_of > n ranks the sequences by cumulative logprob: the engine must
  // report each token's (reported to the client only if `logprobs` asks).
  if (r.best_of > r.n) r.sampling.logprobs = std::max(r.sampling.logprobs, 0);
  // What validate() checks that depends on max_tokens waits for it
  // (resolve_prompt()).
  runtime::SamplingParams check = r.sampling;
  check.max_tokens = 1;
  check.min_tokens = 0;
  Status v = check.validate();
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
    StatusOr<std::string> text = std::string();
    if (ctx.chat_template != nullptr) {
      Json context{{"messages", std::move(r->messages)},
                   {"bos_token", ctx.bos_token},
                   {"eos_token", ctx.eos_token},
                   {"add_generation_prompt", r->add_generation_prompt}};
      // Absent, a template keeps its own default (gpt-oss's: medium).
      if (!r->reasoning_effort.empty()) context["reasoning_effort"] = r->reasoning_effort;
      // Within jinja's default limits, with room for a conversation of up to
      // max_prompt_bytes written out a few times over, and by the deadline:
      // an operator's template that does too much fails this request only.
      jinja::RenderOptions limits;
      limits.deadline = deadline;
      if (ctx.max_prompt_bytes > 0) {
        limits.max_bytes =
            std::max(limits.max_bytes, 4 * static_cast<size_t>(ctx.max_prompt_bytes));
      }
      text = ctx.chat_template->render(context, limits);
    } else {  // a harmony model without a template of its own
      HarmonyOptions o;
      if (!r->reasoning_effort.empty()) o.reasoning_effort = r->reasoning_effort;
      o.current_date = harmony_date(std::time(nullptr));
      text = render_harmony(r->messages, r->add_generation_prompt, o);
    }
    r->messages = Json();
    if (!text.ok() && text.status().code() == StatusCode::kDeadlineExceeded) {
      return bad_request(
          "rendering the chat template took longer than this server allows (--tokenize-timeout)",
          param);
    }
    if (!text.ok()) return bad_request("chat template: " + text.status().message(), param);
    // The template writes the special tokens itself (BOS included).
    if (auto f = tokenize(*text, r->add_special_tokens.value_or(false))) return f;
    if (r->prompt.empty()) return bad_request("the rendered conversation is empty", param);
  } else if (r->prompt_text) {
    if (auto f = tokenize(*r->prompt_text, r->add_special_tokens.value_or(true))) return f;
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
  if (r->sampling.min_tokens > r->sampling.max_tokens) {
    return bad_request("'min_tokens' (" + std::to_string(r->sampling.min_tokens) +
                           ") must not exceed " + r->max_tokens_key + " (" +
                           std::to_string(r->sampling.max_tokens) + ")",
                       "min_tokens");
  }
  return std::nullopt;
}

bool needs_tokenizer(const ApiRequest& r) { return r.chat || r.prompt_text.has_value(); }

std::optional<ApiError> parse_request(const std::string& body, bool chat, const ApiContext& ctx,
                                      ApiRequest* out) {
  if (auto e = parse_request_fields(body, chat, ctx, out)) return e;
  return resolve_prompt(ctx, out, std::chrono::steady_clock::time_point::max());
}

const char* openai_finish_reason(runtime::FinishReason engine_reason) {
  return engine_reason == runtime::FinishReason::kLength ? "length" : "stop";
}

TextStream::TextStream(const model::Tokenizer* t, std::vector<std::string> stop,
                       TextStreamOptions o)
    : t_(t), stop_(std::move(stop)), o_(o) {
  if (t_ != nullptr) decoder_.emplace(*t_, o_.skip_special_tokens);
}

std::string TextStream::push(int32_t token) {
  if (stopped_ || !decoder_) return "";
  return push_text(decoder_->push(token));
}

std::string TextStream::push_text(std::string_view text, bool counts_token) {
  if (stopped_) return "";
  held_ += text;
  if (counts_token) ++pushed_;
  if (stop_.empty()) return std::move(held_);
  // The earliest stop string wins; nothing after it is emitted, nor the
  // stop string itself unless include_stop_str. None before min_tokens.
  size_t cut = std::string::npos, cut_len = 0;
  if (pushed_ > o_.min_tokens) {
    for (const auto& s : stop_) {
      const size_t at = held_.find(s);
      if (at < cut) {
        cut = at;
        cut_len = s.size();
      }
    }
  }
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut + (o_.include_stop_str ? cut_len : 0));
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

std::string TextStream::token_bytes(int32_t token, int32_t before) const {
  if (t_ == nullptr) return "";
  if (before < 0) return t_->decode({token}, /*skip_special_tokens=*/false);
  // What the pair decodes to beyond what `before` alone does: the context a
  // decoder needs (Metaspace strips the space of the first token only).
  const std::string prev = t_->decode({before}, false);
  const std::string both = t_->decode({before, token}, false);
  if (both.compare(0, prev.size(), prev) != 0) return t_->decode({token}, false);
  return both.substr(prev.size());
}

std::string logprob_token(std::string_view bytes) {
  if (model::utf8_complete_prefix(bytes) == bytes.size()) {
    bool whole = true;  // every character complete and well formed
    for (const std::string& c : model::utf8_characters(bytes)) {
      const auto lead = static_cast<unsigned char>(c[0]);
      const size_t want = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
      if (want != c.size()) whole = false;
    }
    if (whole) return std::string(bytes);
  }
  std::string out = "bytes:";
  static const char* hex = "0123456789abcdef";
  for (unsigned char b : bytes) {
    out += "\\x";
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

int64_t text_offset_advance(std::string_view bytes) {
  int64_t n = 0;
  for (unsigned char b : bytes) n += (b & 0xC0) != 0x80;
  return n;
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", cached_tokens}}}};
}

}  // namespace msinfer::server
