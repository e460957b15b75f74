// OpenAI's harmony chat format, which gpt-oss models are trained on
// (github.com/openai/harmony, docs/format.md): rendering a conversation into
// a harmony prompt, and splitting the generated tokens by channel (the
// `analysis` channel is the reasoning, the rest the answer), as vLLM serves
// gpt-oss. docs/SERVING.md, "gpt-oss: the harmony format".
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/model/tokenizer.h"

namespace msinfer::server {

// The ids of harmony's special tokens in a tokenizer (o200k_harmony:
// <|start|> 200006, <|end|> 200007, <|message|> 200008, <|channel|> 200005,
// <|constrain|> 200003, <|return|> 200002, <|call|> 200012).
struct HarmonyTokens {
  int32_t start = -1, end = -1, message = -1, channel = -1, constrain = -1, ret = -1, call = -1;
  // nullopt unless the tokenizer has every one of them as a single token.
  static std::optional<HarmonyTokens> of(const model::Tokenizer& t);
};

// What the system message says besides the fixed text.
struct HarmonyOptions {
  std::string reasoning_effort = "medium";  // "low", "medium" or "high"
  std::string current_date;                 // YYYY-MM-DD; "" leaves the line out
};

// The local date as YYYY-MM-DD (what the published template's
// strftime_now("%Y-%m-%d") writes).
std::string harmony_date(std::time_t now);

// `messages` ([{role, content}], contents strings or null; "developer" roles
// already folded into "system" by the API layer) as the harmony prompt, the
// text gpt-oss's published chat template (chat_template.jinja of
// openai/gpt-oss-20b) renders for them:
//   <|start|>system<|message|>{identity, knowledge cutoff, date, Reasoning:
//   X, valid channels}<|end|>; a first system message as the developer
//   message (`# Instructions\n\n{content}\n\n`); user turns; assistant turns
//   as their final channel (`<|start|>assistant<|channel|>final<|message|>
//   ...<|end|>`, the last one ended by <|return|> without a generation
//   prompt); later system messages left out (as the template does); then
//   `<|start|>assistant` with add_generation_prompt.
// INVALID_ARGUMENT for a tool message (no tool calls here) or an assistant
// content holding channel tags (the template raises for both).
StatusOr<std::string> render_harmony(const Json& messages, bool add_generation_prompt,
                                     const HarmonyOptions& o);

// Text a token adds to one side of the answer.
struct HarmonyDelta {
  std::string reasoning, content;
};

// Splits one generated sequence by channel, token by token, for a prompt
// that ended with `<|start|>assistant`: the text of an `analysis` message is
// reasoning, the text of any other message (final, commentary, a channel
// the model made up, none) content. Headers (role, channel, recipient,
// constraint) and special tokens are never text. <|end|> ends a message,
// <|return|> and <|call|> the answer (what follows is dropped). Malformed
// output is taken as it comes: text after <|end|> without <|start|> starts a
// header, <|start|> or <|channel|> inside a message ends it, a header cut off
// by the end of generation is dropped. An answer with no harmony token at
// all (a model that ignores the format) is content, given at finish().
// Text comes in whole UTF-8 characters. Not thread-safe; holds `t` and
// `ids` by reference.
class HarmonyParser {
 public:
  HarmonyParser(const model::Tokenizer& t, const HarmonyTokens& ids);
  HarmonyDelta push(int32_t token);
  // Generation ended: what is still held.
  HarmonyDelta finish();
  // Whether any message body (or unstructured text) went to each side: the
  // API answers null for a side that got none.
  bool has_reasoning() const { return has_reasoning_; }
  bool has_content() const { return has_content_; }

 private:
  enum class State { kHeader, kBody, kBetween, kDone };
  void end_body(HarmonyDelta* d);
  void start_body();

  const model::Tokenizer& t_;
  const HarmonyTokens& ids_;
  State state_ = State::kHeader;
  bool structured_ = false;  // a harmony token was seen
  // The current header's text tokens, and where the last <|channel|> was
  // among them (-1: none).
  std::vector<int32_t> header_;
  int64_t channel_at_ = -1;
  bool analysis_ = false;  // the current body is reasoning
  std::optional<model::StreamingDecoder> body_;
  bool has_reasoning_ = false, has_content_ = false;
};

}  // namespace msinfer::server
