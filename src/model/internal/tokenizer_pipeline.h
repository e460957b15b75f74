// The pieces of the tokenizer's pipeline (tokenizer.json's normalizer,
// pre_tokenizer and decoder) and the text helpers they share: private to
// src/model. tokenizer_json.cc parses tokenizer.json into them; tokenizer.cc
// runs them.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::model::internal {

// 0..15 for a hexadecimal digit, -1 otherwise.
inline int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// ---- UTF-8 helpers ----

inline size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xe) return 3;
  if ((c >> 3) == 0x1e) return 4;
  return 1;  // invalid lead byte: treat as one unit
}

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: shortest
// form, no surrogates, at most U+10FFFF; what PCRE2's UTF check accepts), or
// 0 where s[i] does not start one.
inline size_t utf8_sequence_at(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // not overlong
    if (c == 0xed) hi = 0x9f;  // not a surrogate
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // not overlong
    if (c == 0xf4) hi = 0x8f;  // at most U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size() || at(1) < lo || at(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((at(k) & 0xc0) != 0x80) return 0;
  }
  return n;
}

inline std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

inline std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// GPT-2's reversible byte <-> printable character map.
struct ByteMap {
  static constexpr uint32_t kCodePoints = 256 + 68;  // the map's characters are below this
  std::string to_char[256];
  int16_t byte_of[kCodePoints];  // the byte a character stands for, by code point; -1: none
  ByteMap() {
    std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      to_char[b] = utf8_encode(cp);
      byte_of[cp] = static_cast<int16_t>(b);
    }
  }
  // Appends the bytes that token text `s` stands for: each character of the
  // map as its byte, anything else (an added token's text, invalid UTF-8)
  // as it is; one character at a time as utf8_chars() splits them, without
  // a string per character (decode runs for every streamed token).
  void decode_into(std::string_view s, std::string& out) const {
    for (size_t i = 0; i < s.size();) {
      const auto c0 = static_cast<unsigned char>(s[i]);
      const size_t n = std::min(utf8_len(c0), s.size() - i);
      int b = -1;
      if (n == 1) {
        if (c0 < 0x80) b = byte_of[c0];
      } else if (n == 2) {
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        const uint32_t cp = (static_cast<uint32_t>(c0 & 0x1f) << 6) | (c1 & 0x3f);
        // The map's keys are shortest encodings: anything else is no key.
        if ((c1 & 0xc0) == 0x80 && cp >= 0x80 && cp < kCodePoints) b = byte_of[cp];
      }
      if (b >= 0) {
        out += static_cast<char>(b);
      } else {
        out.append(s.data() + i, n);
      }
      i += n;
    }
  }
};

inline const ByteMap& byte_map() {
  static const ByteMap* m = new ByteMap();
  return *m;
}

// ---- Regex (PCRE2, UTF + Unicode properties) ----

class Regex {
 public:
  static StatusOr<std::shared_ptr<Regex>> compile(const std::string& pattern,
                                                  const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return invalid_argument(where + ": regex does not compile at offset " + std::to_string(off) +
                              ": " + reinterpret_cast<char*>(msg));
    }
    auto r = std::make_shared<Regex>();
    r->code_ = code;
    return r;
  }
  ~Regex() {
    if (code_) pcre2_code_free(code_);
  }
  // Non-overlapping matches as [begin, end) byte ranges. PCRE2 matches
  // only well-formed UTF-8 (told it is checked, it is undefined on anything
  // else): in text that is not, each maximal well-formed run is matched on
  // its own and each byte outside them is a match of its own, so a
  // pre-tokenizer loses no byte.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    size_t run = 0;  // where the current well-formed run starts
    for (size_t i = 0; i < s.size();) {
      if (const size_t n = utf8_sequence_at(s, i); n > 0) {
        i += n;
        continue;
      }
      if (i > run) find_all_in_run(s.substr(run, i - run), run, out);
      out.emplace_back(i, i + 1);
      run = ++i;
    }
    if (run < s.size()) find_all_in_run(s.substr(run), run, out);
    return out;
  }

 private:
  // find_all over well-formed UTF-8, at byte offset `base` of the whole text.
  void find_all_in_run(std::string_view s, size_t base,
                       std::vector<std::pair<size_t, size_t>>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0;
    while (pos <= s.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                           PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step one character
        pos = e + (e < s.size() ? utf8_len(static_cast<unsigned char>(s[e])) : 1);
        continue;
      }
      out.emplace_back(base + b, base + e);
      pos = e;
    }
    pcre2_match_data_free(md);
  }

  pcre2_code* code_ = nullptr;
};

inline constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = utf8_len(c);
    if (n == 1 && c >= 0x80) return false;
    if (i + n > s.size()) return false;
    for (size_t j = 1; j < n; ++j) {
      if ((static_cast<unsigned char>(s[i + j]) & 0xc0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// ---- Pipeline pieces ----

struct Normalizer {
  enum Kind { kNfc, kNfkc, kPrepend, kReplace, kLowercase } kind;
  std::string a, b;  // Prepend: a; Replace: a -> b
};

struct PreTokenizer {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<Regex> regex;  // Split / ByteLevel(use_regex)
  std::string literal;           // Split with a String pattern
  enum Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext } behavior = kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
  std::string replacement = "\xe2\x96\x81";  // U+2581
  std::string prepend_scheme = "always";
  bool split = true;
};

struct Decoder {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a, b;
  int start = 0, stop = 0;
  std::string prepend_scheme = "always";
};

// When a tokenization must give up (Tokenizer::encode with a deadline).
struct Deadline {
  std::chrono::steady_clock::time_point at;
  bool passed() const { return std::chrono::steady_clock::now() > at; }
};

struct Piece {
  std::string text;
  int32_t added_id = -1;  // >= 0: an added token, passed through as is
};

// tokenizer.json's "normalizer", "pre_tokenizer" and "decoder" (null: none),
// appended to `out`; errors name `where`. Sequences nest at most 16 deep.
Status parse_normalizer(const Json& j, const std::string& where, std::vector<Normalizer>& out,
                        int depth = 0);
Status parse_pre_tokenizer(const Json& j, const std::string& where, std::vector<PreTokenizer>& out,
                           int depth = 0);
Status parse_decoder(const Json& j, const std::string& where, std::vector<Decoder>& out,
                     int depth = 0);

}  // namespace msinfer::model::internal
