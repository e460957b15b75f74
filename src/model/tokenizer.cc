#include "msinfer/model/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "internal/tokenizer_pipeline.h"

namespace msinfer::model {

using namespace internal;  // the pipeline's pieces (internal/tokenizer_pipeline.h)

namespace {

// What an absent normalizer, pre-tokenizer or decoder reads as. A reference,
// so that `has ? j[k] : kNoJson` names j's own node: with a temporary Json()
// on one side the ternary copied the node, recursively (a stack overflow for
// a deeply nested one under AddressSanitizer).
const Json kNoJson;

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int32_t> merge_rank;  // "a b" -> rank
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk_id = -1;
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<Decoder> decoders;
  std::vector<std::pair<std::string, int32_t>> added;  // longest first
  std::vector<bool> is_added;                          // by id: one of `added`
  std::vector<bool> special;
  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor's single template
  bool byte_level_input = false;
  // Words already split into ids. Bounded in bytes, not entries: only words
  // up to kCacheWordBytes are kept (a prompt that is one long word, as a
  // Metaspace pre-tokenizer without split makes it, is not), and the whole
  // cache is dropped when its keys and ids pass kCacheBytes.
  static constexpr size_t kCacheWordBytes = 256;
  static constexpr size_t kCacheBytes = 16 << 20;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // GUARDED_BY(mu)
  mutable size_t cache_bytes = 0;                                        // GUARDED_BY(mu)

  std::string normalize(std::string s) const;
  std::vector<std::string> pre_tokenize(const std::string& s, bool first_section) const;
  // false: the deadline passed before the word was split (out unchanged).
  bool bpe(const std::string& word, std::vector<int32_t>& out, const Deadline* deadline) const;
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens,
                                        const Deadline* deadline) const;
};

std::string Tokenizer::Impl::normalize(std::string s) const {
  for (const auto& n : normalizers) {
    switch (n.kind) {
      case Normalizer::kNfc:
      case Normalizer::kNfkc: {
        UErrorCode err = U_ZERO_ERROR;
        const icu::Normalizer2* norm = n.kind == Normalizer::kNfc
                                           ? icu::Normalizer2::getNFCInstance(err)
                                           : icu::Normalizer2::getNFKCInstance(err);
        if (U_FAILURE(err) || !valid_utf8(s)) break;
        icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
        icu::UnicodeString r = norm->normalize(u, err);
        if (U_SUCCESS(err)) {
          s.clear();
          r.toUTF8String(s);
        }
        break;
      }
      case Normalizer::kPrepend:
        if (!s.empty()) s = n.a + s;
        break;
      case Normalizer::kReplace: {
        if (n.a.empty()) break;
        std::string r;
        for (size_t i = 0; i < s.size();) {
          if (s.compare(i, n.a.size(), n.a) == 0) {
            r += n.b;
            i += n.a.size();
          } else {
            r += s[i++];
          }
        }
        s = r;
        break;
      }
      case Normalizer::kLowercase:
        if (valid_utf8(s)) {
          icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
          u.toLower();
          s.clear();
          u.toUTF8String(s);
        }
        break;
    }
  }
  return s;
}

std::vector<std::string> Tokenizer::Impl::pre_tokenize(const std::string& s,
                                                       bool first_section) const {
  std::vector<std::string> parts = {s};
  for (const auto& p : pre_tokenizers) {
    std::vector<std::string> next;
    for (const std::string& part : parts) {
      if (p.kind == PreTokenizer::kByteLevel) {
        std::string text = part;
        if (p.add_prefix_space && !text.empty() && text[0] != ' ') text = " " + text;
        std::vector<std::string> pieces;
        if (p.regex) {
          for (auto [b, e] : p.regex->find_all(text)) pieces.push_back(text.substr(b, e - b));
        } else {
          pieces.push_back(text);
        }
        for (const auto& piece : pieces) {
          std::string mapped;
          for (unsigned char c : piece) mapped += byte_map().to_char[c];
          next.push_back(mapped);
        }
        continue;
      }
      if (p.kind == PreTokenizer::kMetaspace) {
        std::string text;
        for (char c : part) {
          if (c == ' ') text += p.replacement;
          else text += c;
        }
        const bool prepend = p.prepend_scheme == "always" ||
                             (p.prepend_scheme == "first" && first_section);
        if (prepend && text.compare(0, p.replacement.size(), p.replacement) != 0) {
          text = p.replacement + text;
        }
        if (!p.split) {
          next.push_back(text);
          continue;
        }
        // Split before each replacement character (merged with the next piece).
        size_t start = 0;
        for (size_t i = p.replacement.size(); i <= text.size(); ++i) {
          if (i == text.size() || text.compare(i, p.replacement.size(), p.replacement) == 0) {
            if (i > start) next.push_back(text.substr(start, i - start));
            start = i;
          }
        }
        continue;
      }
      // Split.
      std::vector<std::pair<size_t, size_t>> m;
      if (p.regex) {
        m = p.regex->find_all(part);
      } else if (!p.literal.empty()) {
        for (size_t i = part.find(p.literal); i != std::string::npos;
             i = part.find(p.literal, i + p.literal.size())) {
          m.emplace_back(i, i + p.literal.size());
        }
      }
      // Pieces: alternating non-match / match; `invert` swaps their roles.
      std::vector<std::pair<std::string, bool>> segs;  // (text, is_match)
      size_t pos = 0;
      for (auto [b, e] : m) {
        if (b > pos) segs.emplace_back(part.substr(pos, b - pos), false);
        segs.emplace_back(part.substr(b, e - b), true);
        pos = e;
      }
      if (pos < part.size()) segs.emplace_back(part.substr(pos), false);
      if (p.invert) {
        for (auto& sg : segs) sg.second = !sg.second;
      }
      std::vector<std::string> out;
      for (size_t i = 0; i < segs.size(); ++i) {
        const auto& [text, is_delim] = segs[i];
        switch (p.behavior) {
          case PreTokenizer::kIsolated:
            out.push_back(text);
            break;
          case PreTokenizer::kRemoved:
            if (!is_delim) out.push_back(text);
            break;
          case PreTokenizer::kMergedWithPrevious:
            if (is_delim && !out.empty()) out.back() += text;
            else out.push_back(text);
            break;
          case PreTokenizer::kMergedWithNext:
            if (is_delim && i + 1 < segs.size() && !segs[i + 1].second) {
              out.push_back(text + segs[i + 1].first);
              ++i;
            } else {
              out.push_back(text);
            }
            break;
        }
      }
      for (auto& o : out) next.push_back(std::move(o));
    }
    parts = std::move(next);
  }
  return parts;
}

bool Tokenizer::Impl::bpe(const std::string& word, std::vector<int32_t>& out,
                          const Deadline* deadline) const {
  if (word.empty()) return true;
  const bool cacheable = word.size() <= kCacheWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return true;
    }
  }
  std::vector<int32_t> ids;
  auto direct = vocab.find(word);
  if (ignore_merges && direct != vocab.end()) {
    ids.push_back(direct->second);
  } else {
    std::vector<std::string> sym = utf8_chars(word);
    // Each merge pass scans the word: a long word costs its length squared,
    // so long ones look at the clock now and then.
    size_t since_check = 0;
    while (sym.size() > 1) {
      since_check += sym.size();
      if (deadline != nullptr && since_check > (1u << 16)) {
        since_check = 0;
        if (deadline->passed()) return false;
      }
      int best_rank = INT_MAX;
      size_t best = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merge_rank.find(sym[i] + " " + sym[i + 1]);
        if (it != merge_rank.end() && it->second < best_rank) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank == INT_MAX) break;
      // Merge every occurrence of this pair, left to right.
      const std::string a = sym[best], b = sym[best + 1];
      std::vector<std::string> merged;
      for (size_t i = 0; i < sym.size(); ++i) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(sym[i]);
        }
      }
      sym = std::move(merged);
    }
    bool last_unk = false;
    for (const auto& s : sym) {
      auto it = vocab.find(s);
      if (it != vocab.end()) {
        ids.push_back(it->second);
        last_unk = false;
      } else if (byte_fallback) {
        bool all = true;
        std::vector<int32_t> bytes;
        for (unsigned char c : s) {
          char name[8];
          std::snprintf(name, sizeof(name), "<0x%02X>", c);
          auto b = vocab.find(name);
          if (b == vocab.end()) {
            all = false;
            break;
          }
          bytes.push_back(b->second);
        }
        if (all) {
          ids.insert(ids.end(), bytes.begin(), bytes.end());
          last_unk = false;
        } else if (unk_id >= 0 && !(fuse_unk && last_unk)) {
          ids.push_back(unk_id);
          last_unk = true;
        }
      } else if (unk_id >= 0 && !(fuse_unk && last_unk)) {
        ids.push_back(unk_id);
        last_unk = true;
      }
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (!cacheable) return true;
  // Keys, ids and a node's overhead, roughly.
  const size_t bytes = word.size() + ids.size() * sizeof(int32_t) + 64;
  std::lock_guard<std::mutex> lock(mu);
  if (cache_bytes + bytes > kCacheBytes) {
    cache.clear();
    cache_bytes = 0;
  }
  if (cache.emplace(word, std::move(ids)).second) cache_bytes += bytes;
  return true;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

StatusOr<Tokenizer> Tokenizer::from_json(const Json& j, const Json* config,
                                         const std::string& source) {
  Tokenizer t;
  Impl& m = *t.impl_;
  JsonFields top(j, source);
  MSI_RETURN_IF_ERROR(top.expect_object());
  MSI_ASSIGN_OR_RETURN(JsonFields model, top.object("model"));
  MSI_ASSIGN_OR_RETURN(std::string type, model.string_or("type", "BPE"));
  if (type != "BPE") {
    return invalid_argument(source + ": model type '" + type + "' is not supported (BPE)");
  }
  if (!model.has("vocab") || !j["model"]["vocab"].is_object()) {
    return model.field_error("vocab", "must be an object of token -> id");
  }
  int32_t max_id = -1;
  const Json& vocab = j["model"]["vocab"];
  const size_t added =
      j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"].size() : 0;
  m.vocab.reserve(vocab.size() + added);  // the added tokens join it: no rehash on the way
  for (const auto& [tok, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return invalid_argument(source + ": model.vocab['" + tok + "'] must be an id in 0..2^24");
    }
    m.vocab.insert_or_assign(tok, static_cast<int32_t>(id.get<int64_t>()));
    max_id = std::max(max_id, static_cast<int32_t>(id.get<int64_t>()));
  }
  if (model.has("merges")) {
    const Json& merges = j["model"]["merges"];
    if (!merges.is_array()) return model.field_error("merges", "must be a list");
    m.merge_rank.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      std::string key;
      if (merges[i].is_string()) {
        key = merges[i].get<std::string>();
      } else if (merges[i].is_array() && merges[i].size() == 2 && merges[i][0].is_string() &&
                 merges[i][1].is_string()) {
        key = merges[i][0].get<std::string>() + " " + merges[i][1].get<std::string>();
      } else {
        return invalid_argument(source + ": model.merges[" + std::to_string(i) +
                                "] must be \"a b\" or [a, b]");
      }
      m.merge_rank.emplace(key, static_cast<int32_t>(i));
    }
  }
  MSI_ASSIGN_OR_RETURN(m.byte_fallback, model.boolean_or("byte_fallback", false));
  MSI_ASSIGN_OR_RETURN(m.fuse_unk, model.boolean_or("fuse_unk", false));
  MSI_ASSIGN_OR_RETURN(m.ignore_merges, model.boolean_or("ignore_merges", false));
  MSI_ASSIGN_OR_RETURN(std::string unk, model.string_or("unk_token", ""));
  if (!unk.empty() && m.vocab.count(unk)) m.unk_id = m.vocab[unk];

  if (top.has("added_tokens")) {
    const Json& a = j["added_tokens"];
    if (!a.is_array()) return top.field_error("added_tokens", "must be a list");
    for (size_t i = 0; i < a.size(); ++i) {
      JsonFields f(a[i], source + ": added_tokens[" + std::to_string(i) + "]");
      MSI_ASSIGN_OR_RETURN(int64_t id, f.integer_at_least("id", 0));
      MSI_ASSIGN_OR_RETURN(std::string content, f.string("content"));
      MSI_ASSIGN_OR_RETURN(bool special, f.boolean_or("special", false));
      if (id > (1 << 24)) return f.field_error("id", "is implausibly large");
      m.added.emplace_back(content, static_cast<int32_t>(id));
      m.vocab[content] = static_cast<int32_t>(id);
      max_id = std::max(max_id, static_cast<int32_t>(id));
      if (special) {
        if (m.special.size() <= static_cast<size_t>(id)) m.special.resize(id + 1, false);
        m.special[id] = true;
      }
    }
    std::stable_sort(m.added.begin(), m.added.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }
  m.id_to_token.assign(max_id + 1, "");
  for (const auto& [tok, id] : m.vocab) m.id_to_token[id] = tok;
  m.special.resize(max_id + 1, false);
  m.is_added.assign(max_id + 1, false);
  for (const auto& a : m.added) m.is_added[a.second] = true;

  MSI_RETURN_IF_ERROR(parse_normalizer(top.has("normalizer") ? j["normalizer"] : kNoJson,
                                       source + ": normalizer", m.normalizers));
  MSI_RETURN_IF_ERROR(parse_pre_tokenizer(top.has("pre_tokenizer") ? j["pre_tokenizer"] : kNoJson,
                                          source + ": pre_tokenizer", m.pre_tokenizers));
  MSI_RETURN_IF_ERROR(parse_decoder(top.has("decoder") ? j["decoder"] : kNoJson,
                                    source + ": decoder", m.decoders));
  for (const auto& p : m.pre_tokenizers) m.byte_level_input |= p.kind == PreTokenizer::kByteLevel;

  // Post-processor: TemplateProcessing's single template gives BOS/EOS around the text.
  bool add_bos = true;
  if (config != nullptr && config->is_object() && config->contains("add_bos_token") &&
      (*config)["add_bos_token"].is_boolean()) {
    add_bos = (*config)["add_bos_token"].get<bool>();
  }
  if (top.has("post_processor") && j["post_processor"].is_object() && add_bos) {
    JsonFields post(j["post_processor"], source + ": post_processor");
    MSI_ASSIGN_OR_RETURN(std::string post_type, post.string_or("type", ""));
    const Json& pj = j["post_processor"];
    if (post_type == "TemplateProcessing" && post.has("single") && pj["single"].is_array()) {
      bool seen_seq = false;
      const Json& single = pj["single"];
      for (size_t i = 0; i < single.size(); ++i) {
        const Json& item = single[i];
        if (!item.is_object()) continue;
        if (item.contains("Sequence")) {
          seen_seq = true;
        } else if (item.contains("SpecialToken")) {
          JsonFields special(item["SpecialToken"],
                             post.where() + ".single[" + std::to_string(i) + "].SpecialToken");
          MSI_RETURN_IF_ERROR(special.expect_object());
          MSI_ASSIGN_OR_RETURN(std::string id, special.string("id"));
          auto it = m.vocab.find(id);
          if (it == m.vocab.end()) {
            return invalid_argument(source + ": post_processor names unknown token '" + id + "'");
          }
          (seen_seq ? m.suffix_ids : m.prefix_ids).push_back(it->second);
        }
      }
    }
  }
  return t;
}

StatusOr<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file(path);
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(file.string()));
  fs::path cfg = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg, ec)) {
    MSI_ASSIGN_OR_RETURN(Json c, read_json_file(cfg.string()));
    return from_json(j, &c, file.string());
  }
  return from_json(j, nullptr, file.string());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  auto ids = impl_->encode(text, add_special_tokens, nullptr);
  return std::move(ids).value();  // no deadline: always done
}

StatusOr<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                                 std::chrono::steady_clock::time_point deadline)
    const {
  const Deadline d{deadline};
  return impl_->encode(text, add_special_tokens, &d);
}

StatusOr<std::vector<int32_t>> Tokenizer::Impl::encode(std::string_view text,
                                                       bool add_special_tokens,
                                                       const Deadline* deadline) const {
  const Impl& m = *this;
  // 1. Added tokens first (longest match at each position).
  std::vector<Piece> pieces;
  std::string cur;
  for (size_t i = 0; i < text.size();) {
    bool hit = false;
    for (const auto& [content, id] : m.added) {
      if (!content.empty() && text.compare(i, content.size(), content) == 0) {
        if (!cur.empty()) pieces.push_back({std::move(cur), -1});
        cur.clear();
        pieces.push_back({"", id});
        i += content.size();
        hit = true;
        break;
      }
    }
    if (!hit) cur += text[i++];
  }
  if (!cur.empty()) pieces.push_back({std::move(cur), -1});
  // 2. Normalise, pre-tokenise and BPE each stretch of ordinary text.
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = m.prefix_ids;
  bool first = true;
  for (const Piece& p : pieces) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
    } else {
      for (const std::string& word : m.pre_tokenize(m.normalize(p.text), first)) {
        if (!m.bpe(word, ids, deadline) || (deadline != nullptr && deadline->passed())) {
          return Status(StatusCode::kDeadlineExceeded,
                        "tokenizing the text took longer than its deadline");
        }
      }
    }
    first = false;
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> toks;
  std::vector<bool> added;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(m.id_to_token.size())) continue;
    if (skip_special_tokens && m.special[id]) continue;
    toks.push_back(m.id_to_token[id]);
    added.push_back(m.is_added[id]);
  }
  for (const Decoder& d : m.decoders) {
    switch (d.kind) {
      case Decoder::kByteLevel:
        for (size_t i = 0; i < toks.size(); ++i) {
          if (added[i]) continue;
          std::string bytes;
          byte_map().decode_into(toks[i], bytes);
          toks[i] = std::move(bytes);
        }
        break;
      case Decoder::kReplace:
        for (auto& t : toks) {
          std::string r;
          for (size_t i = 0; i < t.size();) {
            if (!d.a.empty() && t.compare(i, d.a.size(), d.a) == 0) {
              r += d.b;
              i += d.a.size();
            } else {
              r += t[i++];
            }
          }
          t = r;
        }
        break;
      case Decoder::kByteFallback:
        for (auto& t : toks) {
          const int hi = t.size() == 6 ? hex_digit(t[3]) : -1;
          const int lo = t.size() == 6 ? hex_digit(t[4]) : -1;
          if (hi >= 0 && lo >= 0 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
            t = std::string(1, static_cast<char>(hi * 16 + lo));
          }
        }
        break;
      case Decoder::kFuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks = {all};
        added = {false};
        break;
      }
      case Decoder::kStrip:
        for (auto& t : toks) {
          int n = 0;
          while (n < d.start && t.compare(0, d.a.size(), d.a) == 0 && !d.a.empty()) {
            t = t.substr(d.a.size());
            ++n;
          }
          n = 0;
          while (n < d.stop && t.size() >= d.a.size() && !d.a.empty() &&
                 t.compare(t.size() - d.a.size(), d.a.size(), d.a) == 0) {
            t.resize(t.size() - d.a.size());
            ++n;
          }
        }
        break;
      case Decoder::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          std::string r;
          for (size_t k = 0; k < toks[i].size();) {
            if (toks[i].compare(k, d.a.size(), d.a) == 0) {
              r += ' ';
              k += d.a.size();
            } else {
              r += toks[i][k++];
            }
          }
          if (i == 0 && d.prepend_scheme != "never" && !r.empty() && r[0] == ' ') r = r.substr(1);
          toks[i] = r;
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

bool Tokenizer::decode_skips(int32_t id, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  return id < 0 || id >= static_cast<int32_t>(m.id_to_token.size()) ||
         (skip_special_tokens && m.special[id]);
}

bool Tokenizer::decode_concatenates() const {
  bool fused = false;
  for (const Decoder& d : impl_->decoders) {
    switch (d.kind) {
      case Decoder::kByteLevel:  // byte by byte, wherever the tokens end
        break;
      case Decoder::kFuse:
        fused = true;
        break;
      case Decoder::kReplace:  // per token, until fused: then across tokens
      case Decoder::kByteFallback:
      case Decoder::kStrip:
        if (fused) return false;
        break;
      case Decoder::kMetaspace:  // the first token's space is dropped
        if (d.prepend_scheme != "never") return false;
        break;
    }
  }
  return true;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(impl_->id_to_token.size())) return "";
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->special.size()) && impl_->special[id];
}

std::vector<std::string> utf8_characters(std::string_view s) { return utf8_chars(s); }

const std::string& byte_level_char(uint8_t b) { return byte_map().to_char[b]; }

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0, last = 0;
  while (i < s.size()) {
    size_t n = utf8_len(static_cast<unsigned char>(s[i]));
    if (i + n > s.size()) {
      // Cut short: it may still complete, unless a byte after the lead is
      // not a continuation byte (then the lead is an invalid unit of its own,
      // as decode() leaves it; holding it back lost the text after it).
      bool may_complete = true;
      for (size_t k = i + 1; k < s.size(); ++k) {
        if ((static_cast<unsigned char>(s[k]) & 0xc0) != 0x80) may_complete = false;
      }
      if (may_complete) break;
      n = 1;
    }
    i += n;
    last = i;
  }
  return last;
}

std::string StreamingDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::string all = t_.decode(ids_, skip_);
  const size_t complete = utf8_complete_prefix(all);
  std::string out;
  if (complete > emitted_) {
    out = all.substr(emitted_, complete - emitted_);
    emitted_ = complete;
  }
  if (complete == all.size()) {
    // Everything so far is out and ends on a whole character: restart the
    // window at the tokens since the last such point. They stay as context
    // for decoders that treat the start of the text specially (Metaspace,
    // Strip), which then cut the same way in `all` and in `emitted_`.
    if (t_.decode_concatenates()) {
      // What the new window decodes to is what it added to `all`.
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(context_));
      context_ = ids_.size();
      emitted_ = all.size() - context_bytes_;
      context_bytes_ = emitted_;
    } else {
      // The window is the tokens since the last point; where those start
      // with tokens decode() leaves out, it keeps the last one before them
      // that it does not: a start-sensitive decoder then sees a start of
      // text in the window only where the text has one (a skipped special
      // token is no context: a "▁word" after it would lose its space).
      size_t cut = context_;
      if (cut < ids_.size() && t_.decode_skips(ids_[cut], skip_)) {
        while (cut > 0 && t_.decode_skips(ids_[cut - 1], skip_)) --cut;
        if (cut > 0) --cut;
      }
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(cut));
      context_ = ids_.size();
      emitted_ = t_.decode(ids_, skip_).size();
    }
  }
  return out;
}

std::string StreamingDecoder::finish() {
  const std::string all = t_.decode(ids_, skip_);
  if (all.size() <= emitted_) return "";
  std::string rest = all.substr(emitted_);
  emitted_ = all.size();
  return rest.empty() ? rest : rest.substr(0, utf8_complete_prefix(rest)) + "\xef\xbf\xbd";
}

}  // namespace msinfer::model
