// The conversations the chat-template tests render (chat_template_test
// against @huggingface/jinja, harmony_test against gpt-oss's published
// template): one corpus, so that both renderers are held to the same turns.
#pragma once

#include <string>
#include <vector>

#include "msinfer/core/json.h"

namespace msinfer::testing {

// One chat message: {"role": role, "content": content}.
inline Json chat_message(const std::string& role, const Json& content) {
  return {{"role", role}, {"content", content}};
}

// System prompts, several turns, empty content, unicode, quotes and braces,
// a conversation that starts with the assistant. Each test adds its own
// (whitespace, reasoning, a last assistant turn).
inline std::vector<Json> chat_conversations() {
  const auto msg = chat_message;
  return {
      Json::array({msg("user", "Hello")}),
      Json::array({msg("system", "You are a helpful assistant."), msg("user", "Hi there")}),
      Json::array({msg("user", "What is 2+2?"), msg("assistant", "4"), msg("user", "And 3+3?")}),
      Json::array({msg("system", "Be brief."), msg("user", "One"), msg("assistant", "Two"),
                   msg("user", "Three"), msg("assistant", "Four"), msg("user", "Five")}),
      Json::array({msg("user", "")}),
      Json::array({msg("system", ""), msg("user", "x")}),
      Json::array({msg("user", "Grüße, 世界 🌍 — «ok»")}),
      Json::array(
          {msg("system", "first system"), msg("system", "second system"), msg("user", "q")}),
      Json::array({msg("user", "quotes ' \" and braces {{ }} {% %}")}),
      Json::array({msg("assistant", "starts with the assistant")}),
  };
}

}  // namespace msinfer::testing
