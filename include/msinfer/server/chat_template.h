// Chat templates: a model's Hugging Face `chat_template` (tokenizer_config.json
// or chat_template.jinja) rendered over a conversation. The template language
// is msinfer/jinja/template.h's (the Jinja subset those templates use,
// rendered as @huggingface/jinja renders it); this is the chat side: where
// the template comes from, and errors that say they are the chat template's.
//
// Thread safety: render() is const and may be called from many threads at
// once.
#pragma once

#include <ctime>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/jinja/template.h"

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
  // The third form within `options`' limits (jinja::RenderOptions: steps,
  // bytes, a deadline; RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED past one),
  // the others within the defaults.
  StatusOr<std::string> render(const Json& context) const;
  StatusOr<std::string> render(const Json& context, std::time_t now) const;
  StatusOr<std::string> render(const Json& context, const jinja::RenderOptions& options) const;

 private:
  jinja::Template template_;
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
