// Chat templates: the Jinja subset that Hugging Face `chat_template`s use
// (tokenizer_config.json), rendered the way the reference renderer
// @huggingface/jinja does (tests compare the two byte for byte).
//
// Supported: {{ }}, {% %}, {# #} with whitespace control (-), trim_blocks and
// lstrip_blocks (as transformers and @huggingface/jinja render chat
// templates); if/elif/else, for (loop.index, index0, first, last, length,
// revindex; else; filters on the iterable via `if`), set (names, namespace
// attributes, block set), macro and call of macros; expressions with
// literals, lists, dicts, attribute and item access, slices, calls,
// arithmetic, comparison, and/or/not, in / not in, ~, the ternary
// `a if c else b`, tests (is defined, none, string, number, mapping, ...),
// filters (length, tojson, trim, upper, lower, title, capitalize, default,
// join, first, last, list, reverse, string, int, float, abs, items, indent,
// replace, selectattr/rejectattr/map/select/reject with simple arguments,
// unique, sort), string methods (startswith, endswith, split, strip, lstrip,
// rstrip, upper, lower, replace, title, format is not), dict methods (get,
// items, keys, values), namespace(), range(), raise_exception(),
// strftime_now().
//
// Not thread-compatible beyond const: render() is const and may be called
// from many threads at once.
#pragma once

#include <ctime>
#include <memory>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::server {

class ChatTemplate {
 public:
  ChatTemplate();
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // INVALID_ARGUMENT naming the line for a syntax error.
  static StatusOr<ChatTemplate> parse(const std::string& source);
  // Renders with `context` as the global variables (messages, bos_token,
  // add_generation_prompt, ...). INVALID_ARGUMENT for an error the template
  // raises (raise_exception) or a type error. strftime_now(format), the
  // global transformers gives templates (gpt-oss's writes the date with it),
  // formats `now` in local time (the second form: a fixed clock, for tests).
  StatusOr<std::string> render(const Json& context) const;
  StatusOr<std::string> render(const Json& context, std::time_t now) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// The chat template and special tokens of a model directory's
// tokenizer_config.json: `chat_template` (a string, or a list of {name,
// template} where "default" is taken), `bos_token` and `eos_token` (strings
// or AddedToken objects). A chat_template.jinja file in the directory is the
// template instead, as transformers reads it (gpt-oss's published layout).
// NOT_FOUND when there is no chat template.
struct ChatTemplateConfig {
  std::string source, bos_token, eos_token;
};
StatusOr<ChatTemplateConfig> read_chat_template_config(const std::string& model_dir);

}  // namespace msinfer::server
