// HF tokenizer.json: BPE models with byte-level pre-tokenisation (GPT-2, Qwen,
// DeepSeek) and with byte fallback and a Metaspace pre-tokenizer or the legacy
// Prepend/Replace normalizers (Llama, Mistral). Added (special) tokens are
// split out first; normalizers: NFC, NFKC, Prepend, Replace, Lowercase,
// Sequence; pre-tokenizers: Split (regex, via PCRE2 with Unicode properties),
// ByteLevel, Metaspace, Sequence; decoders: ByteLevel, Replace, ByteFallback,
// Fuse, Strip, Metaspace, Sequence; post-processor TemplateProcessing (BOS).
//
// encode() is thread-safe (a mutex guards the word cache, which is bounded
// in bytes).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::model {

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // `path` is a tokenizer.json or a directory holding one (and optionally
  // tokenizer_config.json, which decides add_bos_token).
  static StatusOr<Tokenizer> load(const std::string& path);
  static StatusOr<Tokenizer> from_json(const Json& tokenizer, const Json* config,
                                       const std::string& source);

  // add_special_tokens applies the post-processor (e.g. Llama's leading <s>).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The same, giving up with DEADLINE_EXCEEDED once `deadline` has passed
  // (checked between words and inside a long word's merges): for text from
  // clients, where one long word costs its length squared.
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens,
                                        std::chrono::steady_clock::time_point deadline) const;
  // Raw bytes of the decoded ids (may end inside a UTF-8 character).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // Whether decode(a + b) is always decode(a) + decode(b): no decoder treats
  // the start of the text specially (Metaspace prepending a space) or works
  // across tokens after they are fused (Replace, ByteFallback, Strip after
  // Fuse). StreamingDecoder then decodes each window once.
  bool decode_concatenates() const;
  // Whether decode() leaves `id` out: outside the vocabulary, or a special
  // token when skip_special_tokens.
  bool decode_skips(int32_t id, bool skip_special_tokens) const;

  int64_t vocab_size() const;  // highest id + 1, added tokens included
  std::optional<int32_t> token_id(std::string_view token) const;
  std::string token(int32_t id) const;
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a growing id sequence into text, emitting only whole UTF-8 characters
// (a character split across tokens is held back until complete).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& t, bool skip_special_tokens = true)
      : t_(t), skip_(skip_special_tokens) {}
  // New text made complete by this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is left (an incomplete character is emitted as U+FFFD).
  std::string finish();

 private:
  const Tokenizer& t_;
  bool skip_;
  // A window of the ids, not all of them (each push decodes only the
  // window: linear in the length of the text, not quadratic): ids_[0,
  // context_) were out before the last whole-character point.
  std::vector<int32_t> ids_;
  size_t context_ = 0;
  size_t emitted_ = 0;        // bytes of decode(ids_) already returned
  size_t context_bytes_ = 0;  // bytes of decode(ids_[0, context_))
};

// Length of the longest prefix of s that ends on a UTF-8 character boundary:
// it leaves out only a last character that more bytes could still complete
// (a lead byte followed by fewer continuation bytes than it needs and nothing
// else).
size_t utf8_complete_prefix(std::string_view s);
// s split into UTF-8 characters (an invalid lead byte stands alone).
std::vector<std::string> utf8_characters(std::string_view s);
// GPT-2's reversible byte -> printable character map used by byte-level BPE.
const std::string& byte_level_char(uint8_t b);

}  // namespace msinfer::model
