// The OpenAI API's request and response shapes (completions, chat
// completions): parsing and validating a request body into the engine's
// request, and the JSON objects the server answers with. Pure functions over
// strings and JSON, no I/O: the HTTP server calls them, the fuzzer and the
// unit tests too. Errors carry the HTTP status and the OpenAI error body
// ({"error": {"message", "type", "param", "code"}}).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/model/tokenizer.h"
#include "msinfer/runtime/finish_reason.h"
#include "msinfer/runtime/sampling.h"
#include "msinfer/server/chat_template.h"
#include "msinfer/server/harmony.h"

namespace msinfer::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" for none
  Json body() const;  // {"error": {"message", "type", "param", "code"}}
};

ApiError bad_request(std::string message, std::string param = "");

// What parsing needs to know about the model being served. Not owned.
struct ApiContext {
  std::string served_model_name;
  const model::Tokenizer* tokenizer = nullptr;  // null: only token-id prompts
  const ChatTemplate* chat_template = nullptr;  // null: chat completions refused (unless harmony)
  // Set for a gpt-oss model whose tokenizer has harmony's special tokens:
  // chats are answered in the harmony format (rendered with chat_template
  // when the model has one, else render_harmony(); the answer split by
  // channel, HarmonyParser). Not owned.
  const HarmonyTokens* harmony = nullptr;
  std::string bos_token, eos_token;             // for the chat template
  int64_t vocab = 0;
  int64_t max_model_len = 0;  // prompt + max_tokens must not exceed it
  // > 0: a text prompt (or the contents of a conversation) longer than this
  // many bytes is refused before it is tokenized.
  int64_t max_prompt_bytes = 0;
  // A disaggregated deployment (attention and expert workers) rather than the
  // co-located engine: part of system_fingerprint.
  bool disaggregated = false;
  // `n` and `best_of` at most this (serve --max-n); beyond, a 400 naming the field.
  int64_t max_n = 8;
};

// The OpenAI and vLLM request fields this server knows, and what it does with
// each: the list docs/SERVING.md's table shows (a test compares them).
enum class FieldUse {
  kHonoured,  // changes the answer as OpenAI / vLLM document
  kNoEffect,  // accepted; changes nothing here (e.g. `user`, `store`)
  kRefused,   // 400 naming it unless null or one of `allowed` (the defaults)
};
enum class FieldEndpoint { kBoth, kCompletions, kChat };
struct RequestField {
  const char* name;  // "a.b": field b of object a
  FieldEndpoint endpoint;
  FieldUse use;
  const char* example;  // JSON: a value a client may send (refused, for kRefused)
  const char* allowed;  // kRefused: JSON array of the values accepted, besides null
};
const std::vector<RequestField>& request_fields();
const char* field_use_name(FieldUse u);  // "honoured", "no effect", "refused"

// A random seed for a request that sets none (thread-safe).
uint64_t random_seed();

// One parsed request: the prompt's token ids and everything that shapes the
// answer.
struct ApiRequest {
  bool chat = false;
  std::vector<int32_t> prompt;
  runtime::SamplingParams sampling;  // max_tokens resolved (default: the model length left)
  std::vector<std::string> stop;     // stop strings, never emitted
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // report logprobs (sampling.logprobs = how many top)
  bool seeded = false;         // `seed` given (else sampling.seed is random_seed())
  // Choices returned (OpenAI's n), and sequences generated (best_of,
  // completions only: the n with the highest cumulative logprob are
  // returned; = n otherwise). 1 <= n <= best_of <= ApiContext::max_n; with
  // best_of > n, sampling.logprobs is at least 0 (the engine reports each
  // token's logprob) whether or not `logprobs` asked for them.
  int n = 1;
  int best_of = 1;
  // vLLM: the stop string, or the text of a stop_token_ids token or EOS that
  // ended generation, is part of the answer.
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // vLLM: special tokens left out of the text
  // vLLM: the tokenizer adds BOS etc. to the prompt (default: true for a
  // completion's text, false for a chat, whose template writes them).
  std::optional<bool> add_special_tokens;

  // Between parse_request_fields() and resolve_prompt(): the prompt still to
  // be tokenized (a completion's text, or a chat's messages for the
  // template), and max_tokens as asked (-1: absent or null).
  std::optional<std::string> prompt_text;
  Json messages;  // chat: [{role, content}], roles and contents checked
  // OpenAI's reasoning_effort ("low", "medium", "high"; "" absent): the
  // harmony system message's `Reasoning:`, a template's `reasoning_effort`.
  std::string reasoning_effort;
  // A chat with a harmony model (ApiContext::harmony): <|return|> and <|call|>
  // are stop tokens, and the answer is split into reasoning and content.
  bool harmony = false;
  bool add_generation_prompt = true;
  int64_t max_tokens_asked = -1;
  std::string max_tokens_key = "max_tokens";
};

// Parses a POST body of /v1/completions (chat = false) or
// /v1/chat/completions (chat = true). The fields of request_fields() marked
// kRefused (echo, logit_bias, tools, guided decoding, ...)
// are a 400 naming them unless null or a default; fields outside that list
// are ignored, as vLLM does. Without `seed`, the request gets random_seed().
// Every field of a wrong JSON type is a 400 naming it; nothing here throws.
// = parse_request_fields() then resolve_prompt() without a deadline.
std::optional<ApiError> parse_request(const std::string& body, bool chat, const ApiContext& ctx,
                                      ApiRequest* out);

// The cheap half, bounded by the body's size (for the HTTP thread): every
// field checked; a text prompt or a conversation is kept (refused beyond
// ctx.max_prompt_bytes), not tokenized.
std::optional<ApiError> parse_request_fields(const std::string& body, bool chat,
                                             const ApiContext& ctx, ApiRequest* out);
// Whether resolve_prompt() has a template to render or text to tokenize (the
// server runs it off its event loop then).
bool needs_tokenizer(const ApiRequest& r);
// The other half: renders the chat template and tokenizes (400 naming the
// prompt when that is not done by `deadline`), then checks the prompt's
// length and max_tokens against ctx.max_model_len.
std::optional<ApiError> resolve_prompt(const ApiContext& ctx, ApiRequest* r,
                                       std::chrono::steady_clock::time_point deadline);

// Maps the engine's finish reasons (eos, stop, length) to OpenAI's ("stop",
// "length").
const char* openai_finish_reason(runtime::FinishReason engine_reason);

// Incremental text of one request: turns token ids into text deltas, holding
// back text that may be the start of a stop string, and ends the request
// when one appears (the stop string and what follows are never emitted).
struct TextStreamOptions {
  bool include_stop_str = false;    // a stop string that ends the text is kept
  bool skip_special_tokens = true;  // special tokens write no text
  // Stop strings are looked for only once this many tokens were pushed (as
  // vLLM does with min_tokens).
  int64_t min_tokens = 0;
};

class TextStream {
 public:
  TextStream(const model::Tokenizer* t, std::vector<std::string> stop, TextStreamOptions o = {});
  // Text made final by this token; sets stopped() when a stop string ended it.
  std::string push(int32_t token);
  // The same for text decoded elsewhere (a harmony answer's content): stop
  // strings looked for in it. counts_token: one more token toward min_tokens.
  std::string push_text(std::string_view text, bool counts_token = true);
  // The rest once generation ended without a stop string.
  std::string finish();
  bool stopped() const { return stopped_; }
  // For logprobs: the bytes `token` adds to the text when it follows
  // `before` (-1: it starts the text), nothing held back. A SentencePiece
  // token keeps its leading space except at the start, as the text does, so
  // the tokens' bytes join into the text's. May be part of a UTF-8 character
  // (byte fallback, a byte-level token); logprob_token() names such bytes.
  std::string token_bytes(int32_t token, int32_t before) const;

 private:
  const model::Tokenizer* t_;
  std::optional<model::StreamingDecoder> decoder_;
  std::vector<std::string> stop_;
  TextStreamOptions o_;
  int64_t pushed_ = 0;
  std::string held_;
  bool stopped_ = false;
};

// A token's bytes as the API writes a logprob token: the text when it is
// whole UTF-8 characters, else "bytes:" and each byte as \xNN (OpenAI's
// form for a part of a character).
std::string logprob_token(std::string_view bytes);
// Characters (code points) in `bytes`, a part of a character counted where
// its first byte is: the advance of a logprob's text_offset.
int64_t text_offset_advance(std::string_view bytes);

// Usage object: {"prompt_tokens", "completion_tokens", "total_tokens",
// "prompt_tokens_details": {"cached_tokens"}} (OpenAI's; cached_tokens: the
// prompt tokens whose KV came from the prefix cache, TokenEvent::cached_tokens).
Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens = 0);

}  // namespace msinfer::server
