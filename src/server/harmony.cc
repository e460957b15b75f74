#include "msinfer/server/harmony.h"

#include <ctime>
#include <vector>

namespace msinfer::server {

std::optional<HarmonyTokens> HarmonyTokens::of(const model::Tokenizer& t) {
  HarmonyTokens h;
  const std::pair<const char*, int32_t*> names[] = {{"<|start|>", &h.start},
                                                    {"<|end|>", &h.end},
                                                    {"<|message|>", &h.message},
                                                    {"<|channel|>", &h.channel},
                                                    {"<|constrain|>", &h.constrain},
                                                    {"<|return|>", &h.ret},
                                                    {"<|call|>", &h.call}};
  for (const auto& [name, id] : names) {
    auto v = t.token_id(name);
    if (!v || !t.is_special(*v)) return std::nullopt;
    *id = *v;
  }
  return h;
}

std::string harmony_date(std::time_t now) {
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
  return std::string(buf, n);
}

namespace {

// A message's role; "" unless it is a string (a message of another shape
// is left out, never an exception).
std::string role_of(const Json& m) {
  auto it = m.is_object() ? m.find("role") : m.end();
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const std::string& text_of(const Json& m) {
  static const std::string kEmpty;
  auto it = m.find("content");
  return it != m.end() && it->is_string() ? it->get_ref<const std::string&>() : kEmpty;
}

}  // namespace

StatusOr<std::string> render_harmony(const Json& messages, bool add_generation_prompt,
                                     const HarmonyOptions& o) {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  std::string out =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\n";
  if (!o.current_date.empty()) out += "Current date: " + o.current_date + "\n";
  out += "\nReasoning: " + o.reasoning_effort +
         "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
         "message.<|end|>";
  size_t first = 0;
  if (!messages.empty() && role_of(messages[0]) == "system") {
    first = 1;
    if (const std::string& dev = text_of(messages[0]); !dev.empty()) {
      out += "<|start|>developer<|message|># Instructions\n\n" + dev + "\n\n<|end|>";
    }
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string role = role_of(m);
    const std::string& content = text_of(m);
    if (role == "user") {
      out += "<|start|>user<|message|>" + content + "<|end|>";
    } else if (role == "assistant") {
      if (content.find("<|channel|>analysis<|message|>") != std::string::npos ||
          content.find("<|channel|>final<|message|>") != std::string::npos) {
        return invalid_argument("messages[" + std::to_string(i) +
                                "].content holds harmony channel tags: send the answer's text");
      }
      // Earlier turns' reasoning is dropped, as the template does for inference.
      const bool last = i + 1 == messages.size() && !add_generation_prompt;
      out += "<|start|>assistant<|channel|>final<|message|>" + content +
             (last ? "<|return|>" : "<|end|>");
    } else if (role == "tool") {
      return invalid_argument("messages[" + std::to_string(i) +
                              "]: tool messages need tool calls, which this server does not do");
    }
    // A system message after the first: left out, as the published template does.
  }
  if (add_generation_prompt) out += "<|start|>assistant";
  return out;
}

HarmonyParser::HarmonyParser(const model::Tokenizer& t, const HarmonyTokens& ids)
    : t_(t), ids_(ids) {}

void HarmonyParser::start_body() {
  // The channel: the first word after the header's last <|channel|>, up to a
  // space (a recipient, ` to=...`) or the next special token (<|constrain|>).
  std::string channel;
  if (channel_at_ >= 0) {
    std::vector<int32_t> words;
    for (size_t k = static_cast<size_t>(channel_at_) + 1; k < header_.size(); ++k) {
      if (header_[k] < 0) break;  // a marker
      words.push_back(header_[k]);
    }
    const std::string text = t_.decode(words, /*skip_special_tokens=*/true);
    size_t b = text.find_first_not_of(" \t\n");
    if (b != std::string::npos) channel = text.substr(b, text.find_first_of(" \t\n", b) - b);
  }
  analysis_ = channel == "analysis";
  header_.clear();
  channel_at_ = -1;
  body_.emplace(t_, /*skip_special_tokens=*/true);
  state_ = State::kBody;
  (analysis_ ? has_reasoning_ : has_content_) = true;
}

void HarmonyParser::end_body(HarmonyDelta* d) {
  if (state_ != State::kBody) return;
  (analysis_ ? d->reasoning : d->content) += body_->finish();
  body_.reset();
}

HarmonyDelta HarmonyParser::push(int32_t token) {
  HarmonyDelta d;
  if (state_ == State::kDone) return d;
  const HarmonyTokens& h = ids_;
  const bool harmony = token == h.start || token == h.end || token == h.message ||
                       token == h.channel || token == h.constrain || token == h.ret ||
                       token == h.call;
  if (!harmony) {
    if (t_.is_special(token)) return d;  // <|endoftext|>, reserved tokens: never text
    switch (state_) {
      case State::kBody: {
        std::string piece = body_->push(token);
        (analysis_ ? d.reasoning : d.content) += piece;
        break;
      }
      case State::kBetween:  // text where <|start|> should be: a header all the same
        state_ = State::kHeader;
        [[fallthrough]];
      case State::kHeader:
        header_.push_back(token);
        break;
      case State::kDone:
        break;
    }
    return d;
  }
  if (!structured_) {
    structured_ = true;
    if (state_ == State::kHeader) header_.clear();  // unstructured text before: a header's
  }
  if (token == h.ret || token == h.call) {
    end_body(&d);
    state_ = State::kDone;
  } else if (token == h.end) {
    end_body(&d);
    header_.clear();
    channel_at_ = -1;
    state_ = State::kBetween;
  } else if (token == h.start) {
    end_body(&d);
    header_.clear();
    channel_at_ = -1;
    state_ = State::kHeader;
  } else if (token == h.channel || token == h.constrain) {
    if (state_ != State::kHeader) {  // inside a message or between: a new header
      end_body(&d);
      header_.clear();
      channel_at_ = -1;
      state_ = State::kHeader;
    }
    if (token == h.channel) channel_at_ = static_cast<int64_t>(header_.size());
    header_.push_back(-1);  // a marker: ends the channel's name
  } else if (token == h.message) {
    if (state_ == State::kHeader || state_ == State::kBetween) start_body();
    // <|message|> inside a message: dropped.
  }
  return d;
}

HarmonyDelta HarmonyParser::finish() {
  HarmonyDelta d;
  if (!structured_ && state_ == State::kHeader && !header_.empty()) {
    // No harmony token at all: the model wrote plain text.
    model::StreamingDecoder dec(t_, /*skip_special_tokens=*/true);
    for (int32_t id : header_) d.content += dec.push(id);
    d.content += dec.finish();
    has_content_ = true;
  }
  end_body(&d);
  header_.clear();
  state_ = State::kDone;
  return d;
}

}  // namespace msinfer::server
