// libFuzzer target for the server's untrusted inputs: OpenAI request bodies
// (parse_request_fields, then resolve_prompt with a real tokenizer and chat
// template, as the server runs them) and chat templates (parse and render).
// Built and run by fuzz/run-server; a short run is part of the test suite.
//
// The first byte selects: even, a request body (bit 1: chat); 1 mod 4, a
// template; 3 mod 4, gpt-oss's harmony format (the rest as a conversation
// to render, when it is JSON, and as generated tokens for HarmonyParser). A structure-aware mutator (LLVMFuzzerCustomMutator) puts values of
// every JSON type into the documented fields and content parts of a body that
// parses, so type confusions are reached in a few thousand runs instead of
// never (a `"type": 1` in a content part aborted the server, issue 43).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "msinfer/model/tokenizer.h"
#include "msinfer/server/api.h"
#include "msinfer/server/chat_template.h"
#include "msinfer/server/harmony.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using msinfer::Json;
using namespace msinfer::server;

// A byte-level BPE tokenizer of 256 bytes and a few merges, built in memory.
const msinfer::model::Tokenizer& tokenizer() {
  static const msinfer::model::Tokenizer t = [] {
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[msinfer::model::byte_level_char(static_cast<uint8_t>(b))] = b;
    const char* merges[] = {"h i", "Ġ t", "t h", "th e", "Ġ a"};
    Json m = Json::array();
    int id = 256;
    for (const char* mg : merges) {
      m.push_back(mg);
      std::string joined(mg);
      joined.erase(joined.find(' '), 1);
      vocab[joined] = id++;
    }
    Json j{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
           {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
           {"decoder", {{"type", "ByteLevel"}}},
           {"added_tokens",
            Json::array({{{"id", id}, {"content", "<s>"}, {"special", true}},
                         {{"id", id + 1}, {"content", "</s>"}, {"special", true}}})}};
    auto r = msinfer::model::Tokenizer::from_json(j, nullptr, "fuzz-tokenizer");
    if (!r.ok()) __builtin_trap();
    return std::move(r).value();
  }();
  return t;
}

const ChatTemplate& chat_template() {
  static const ChatTemplate t = [] {
    auto r = ChatTemplate::parse(
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}");
    if (!r.ok()) __builtin_trap();
    return std::move(r).value();
  }();
  return t;
}

ApiContext context() {
  ApiContext ctx;
  ctx.served_model_name = "m";
  ctx.vocab = tokenizer().vocab_size();
  ctx.max_model_len = 4096;
  ctx.max_prompt_bytes = 1 << 16;
  ctx.tokenizer = &tokenizer();
  ctx.chat_template = &chat_template();
  ctx.bos_token = "<s>";
  ctx.eos_token = "</s>";
  return ctx;
}

// Values of every JSON type, and the shapes the API's fields take (parsed
// once: the mutator runs once per execution).
const Json& some_value(std::minstd_rand& rng) {
  static const char* kValues[] = {
      "null", "true", "false", "0", "1", "-1", "2", "21", "1.5", "-0.0", "1e308", "-1e308",
      "9223372036854775807", "18446744073709551615", "\"\"", "\"text\"", "\"none\"", "[]", "{}",
      "[1, 2]", "[[1], [2]]", "[\"a\", \"b\"]", "[null]", "{\"type\": \"text\"}",
      "{\"type\": 1}", "{\"type\": null}", "{\"type\": []}", "{\"type\": {}}",
      "[{\"type\": \"text\", \"text\": \"x\"}]", "[{\"type\": 1, \"text\": \"x\"}]",
      "[{\"type\": \"text\", \"text\": 1}]", "[{\"role\": \"user\", \"content\": \"hi\"}]",
      "[{\"role\": 1, \"content\": \"hi\"}]", "[{\"role\": \"user\", \"content\": [1]}]",
      "{\"include_usage\": 1}", "{\"include_usage\": true}"};
  static const std::vector<Json> kParsed = [] {
    std::vector<Json> v;
    for (const char* text : kValues) v.push_back(Json::parse(text));
    return v;
  }();
  return kParsed[rng() % kParsed.size()];
}

const char* kFields[] = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "n", "best_of", "echo", "suffix", "tools", "functions", "tool_choice", "function_call",
    "logit_bias", "response_format", "frequency_penalty", "presence_penalty", "seed",
    "ignore_eos", "logprobs", "top_logprobs", "stop", "stream", "stream_options",
    "add_generation_prompt", "role", "content", "type", "text", "tool_calls", "include_usage",
    // vLLM's sampling extensions (issue 47)
    "stop_token_ids", "min_p", "repetition_penalty", "min_tokens", "include_stop_str_in_output",
    "skip_special_tokens", "add_special_tokens"};

// Every object and array node of j, depth first.
void nodes(Json& j, std::vector<Json*>* out) {
  if (!j.is_object() && !j.is_array()) return;
  out->push_back(&j);
  for (auto& v : j) nodes(v, out);
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  // A generator that is cheap to seed (std::mt19937 fills 2.5 KB of state
  // per call).
  std::minstd_rand rng(seed);
  if (size > 1 && data[0] % 2 == 0 && rng() % 2 == 0) {
    Json j = Json::parse(reinterpret_cast<const char*>(data) + 1,
                         reinterpret_cast<const char*>(data) + size, nullptr, false);
    if (!j.is_discarded()) {
      std::vector<Json*> all;
      nodes(j, &all);
      if (!all.empty()) {
        Json& n = *all[rng() % all.size()];
        if (n.is_object()) {
          n[kFields[rng() % (sizeof(kFields) / sizeof(kFields[0]))]] = some_value(rng);
        } else if (!n.empty()) {
          n[rng() % n.size()] = some_value(rng);
        } else {
          n.push_back(some_value(rng));
        }
        const std::string out = j.dump();
        if (out.size() + 1 <= max_size) {
          std::memcpy(data + 1, out.data(), out.size());
          return out.size() + 1;
        }
      }
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

// Harmony: a conversation rendered (when `in` is a JSON array of messages)
// must start with the system message; the bytes as token ids (0..6: the
// special tokens, stood in for by ids 256..262 of the fuzz tokenizer; else
// the byte's own token) go through the channel parser, which must take any
// sequence.
static void fuzz_harmony(const std::string& in) {
  const msinfer::Json messages = msinfer::Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (messages.is_array()) {
    HarmonyOptions o;
    o.reasoning_effort = in.size() % 3 == 0 ? "low" : "high";
    o.current_date = in.size() % 2 == 0 ? "2026-12-06" : "";
    auto r = render_harmony(messages, in.size() % 2 == 1, o);
    if (r.ok() && r->rfind("<|start|>system<|message|>", 0) != 0) __builtin_trap();
  }
  HarmonyTokens ids;
  ids.start = 256;
  ids.end = 257;
  ids.message = 258;
  ids.channel = 259;
  ids.constrain = 260;
  ids.ret = 261;
  ids.call = 262;
  HarmonyParser p(tokenizer(), ids);
  for (unsigned char c : in) (void)p.push(c < 7 ? 256 + c : c);
  (void)p.finish();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    const ApiContext ctx = context();
    ApiRequest r;
    auto err = parse_request_fields(in, data[0] % 4 == 2, ctx, &r);
    if (!err) err = resolve_prompt(ctx, &r, std::chrono::steady_clock::time_point::max());
    if (!err) {
      // Accepted: the limits hold.
      if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens > 4096)
        __builtin_trap();
      for (int32_t t : r.prompt) {
        if (t < 0 || t >= ctx.vocab) __builtin_trap();
      }
    } else {
      (void)err->body().dump();
    }
    return 0;
  }
  if (data[0] % 4 == 3) {
    fuzz_harmony(in);
    return 0;
  }
  auto t = ChatTemplate::parse(in);
  if (!t.ok()) return 0;
  msinfer::Json ctx{{"messages", msinfer::Json::array({{{"role", "system"}, {"content", "s"}},
                                                       {{"role", "user"}, {"content", "u"}}})},
                    {"bos_token", "<s>"},
                    {"eos_token", "</s>"},
                    {"add_generation_prompt", true}};
  // A hundredth of the default steps and 1 MiB: a render then takes at most
  // about 0.1 s here (ASan), and a template that would run longer fails the
  // way it fails under the defaults. Within them the text must hold.
  msinfer::jinja::RenderOptions limits;
  limits.max_steps = 100000;
  limits.max_bytes = 1 << 20;
  auto r = t->render(ctx, limits);
  if (r.ok() && r->size() > limits.max_bytes) __builtin_trap();
  return 0;
}
