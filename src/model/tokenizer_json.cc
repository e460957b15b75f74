#include "internal/tokenizer_pipeline.h"

namespace msinfer::model::internal {
namespace {

StatusOr<std::string> pattern_of(const Json& j, const std::string& where, bool* is_regex) {
  if (!j.contains("pattern") || !j.at("pattern").is_object()) {
    return invalid_argument(where + ": 'pattern' must be {\"String\": ..} or {\"Regex\": ..}");
  }
  const Json& p = j.at("pattern");
  if (p.contains("Regex") && p.at("Regex").is_string()) {
    *is_regex = true;
    return p.at("Regex").get<std::string>();
  }
  if (p.contains("String") && p.at("String").is_string()) {
    *is_regex = false;
    return p.at("String").get<std::string>();
  }
  return invalid_argument(where + ": 'pattern' must be {\"String\": ..} or {\"Regex\": ..}");
}

// A Sequence inside a Sequence this deep is refused (the parsers recurse;
// real tokenizers nest one level).
constexpr int kMaxSequenceDepth = 16;

Status too_deep(const std::string& where) {
  return invalid_argument(where + ": Sequences nested more than " +
                          std::to_string(kMaxSequenceDepth) + " deep");
}

}  // namespace

Status parse_normalizer(const Json& j, const std::string& where, std::vector<Normalizer>& out,
                        int depth) {
  if (j.is_null()) return ok_status();
  if (depth > kMaxSequenceDepth) return too_deep(where);
  JsonFields f(j, where);
  MSI_ASSIGN_OR_RETURN(std::string type, f.string("type"));
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j.at("normalizers").is_array()) {
      return f.field_error("normalizers", "must be a list");
    }
    for (size_t i = 0; i < j.at("normalizers").size(); ++i) {
      MSI_RETURN_IF_ERROR(parse_normalizer(j.at("normalizers")[i],
                                           where + ".normalizers[" + std::to_string(i) + "]", out,
                                           depth + 1));
    }
  } else if (type == "NFC") {
    out.push_back({Normalizer::kNfc, "", ""});
  } else if (type == "NFKC") {
    out.push_back({Normalizer::kNfkc, "", ""});
  } else if (type == "Lowercase") {
    out.push_back({Normalizer::kLowercase, "", ""});
  } else if (type == "Prepend") {
    MSI_ASSIGN_OR_RETURN(std::string s, f.string("prepend"));
    out.push_back({Normalizer::kPrepend, s, ""});
  } else if (type == "Replace") {
    bool is_regex = false;
    MSI_ASSIGN_OR_RETURN(std::string pat, pattern_of(j, where, &is_regex));
    if (is_regex) return invalid_argument(where + ": Replace with a regex is not supported");
    MSI_ASSIGN_OR_RETURN(std::string content, f.string("content"));
    out.push_back({Normalizer::kReplace, pat, content});
  } else {
    return invalid_argument(where + ": normalizer type '" + type + "' is not supported");
  }
  return ok_status();
}

Status parse_pre_tokenizer(const Json& j, const std::string& where, std::vector<PreTokenizer>& out,
                           int depth) {
  if (j.is_null()) return ok_status();
  if (depth > kMaxSequenceDepth) return too_deep(where);
  JsonFields f(j, where);
  MSI_ASSIGN_OR_RETURN(std::string type, f.string("type"));
  PreTokenizer p;
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j.at("pretokenizers").is_array()) {
      return f.field_error("pretokenizers", "must be a list");
    }
    for (size_t i = 0; i < j.at("pretokenizers").size(); ++i) {
      MSI_RETURN_IF_ERROR(parse_pre_tokenizer(j.at("pretokenizers")[i],
                                              where + ".pretokenizers[" + std::to_string(i) + "]",
                                              out, depth + 1));
    }
    return ok_status();
  }
  if (type == "ByteLevel") {
    p.kind = PreTokenizer::kByteLevel;
    MSI_ASSIGN_OR_RETURN(p.add_prefix_space, f.boolean_or("add_prefix_space", false));
    MSI_ASSIGN_OR_RETURN(bool use_regex, f.boolean_or("use_regex", true));
    if (use_regex) {
      MSI_ASSIGN_OR_RETURN(p.regex, Regex::compile(kGpt2Pattern, where));
    }
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::kMetaspace;
    MSI_ASSIGN_OR_RETURN(p.replacement, f.string_or("replacement", p.replacement));
    MSI_ASSIGN_OR_RETURN(p.split, f.boolean_or("split", true));
    MSI_ASSIGN_OR_RETURN(bool add_prefix, f.boolean_or("add_prefix_space", true));
    MSI_ASSIGN_OR_RETURN(p.prepend_scheme,
                         f.string_or("prepend_scheme", add_prefix ? "always" : "never"));
  } else if (type == "Split") {
    p.kind = PreTokenizer::kSplit;
    bool is_regex = false;
    MSI_ASSIGN_OR_RETURN(std::string pat, pattern_of(j, where, &is_regex));
    if (is_regex) {
      MSI_ASSIGN_OR_RETURN(p.regex, Regex::compile(pat, where));
    } else {
      p.literal = pat;
    }
    MSI_ASSIGN_OR_RETURN(std::string behavior, f.string_or("behavior", "Isolated"));
    if (behavior == "Isolated")
      p.behavior = PreTokenizer::kIsolated;
    else if (behavior == "Removed")
      p.behavior = PreTokenizer::kRemoved;
    else if (behavior == "MergedWithPrevious")
      p.behavior = PreTokenizer::kMergedWithPrevious;
    else if (behavior == "MergedWithNext")
      p.behavior = PreTokenizer::kMergedWithNext;
    else
      return f.field_error("behavior", "'" + behavior + "' is not supported");
    MSI_ASSIGN_OR_RETURN(p.invert, f.boolean_or("invert", false));
  } else {
    return invalid_argument(where + ": pre-tokenizer type '" + type + "' is not supported");
  }
  out.push_back(std::move(p));
  return ok_status();
}

Status parse_decoder(const Json& j, const std::string& where, std::vector<Decoder>& out,
                     int depth) {
  if (j.is_null()) return ok_status();
  if (depth > kMaxSequenceDepth) return too_deep(where);
  JsonFields f(j, where);
  MSI_ASSIGN_OR_RETURN(std::string type, f.string("type"));
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j.at("decoders").is_array()) {
      return f.field_error("decoders", "must be a list");
    }
    for (size_t i = 0; i < j.at("decoders").size(); ++i) {
      MSI_RETURN_IF_ERROR(parse_decoder(
          j.at("decoders")[i], where + ".decoders[" + std::to_string(i) + "]", out, depth + 1));
    }
    return ok_status();
  }
  Decoder d;
  if (type == "ByteLevel") {
    d.kind = Decoder::kByteLevel;
  } else if (type == "ByteFallback") {
    d.kind = Decoder::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::kFuse;
  } else if (type == "Replace") {
    d.kind = Decoder::kReplace;
    bool is_regex = false;
    MSI_ASSIGN_OR_RETURN(d.a, pattern_of(j, where, &is_regex));
    if (is_regex) return invalid_argument(where + ": Replace with a regex is not supported");
    MSI_ASSIGN_OR_RETURN(d.b, f.string("content"));
  } else if (type == "Strip") {
    d.kind = Decoder::kStrip;
    MSI_ASSIGN_OR_RETURN(d.a, f.string("content"));
    MSI_ASSIGN_OR_RETURN(int64_t start, f.integer_or("start", 0));
    MSI_ASSIGN_OR_RETURN(int64_t stop, f.integer_or("stop", 0));
    d.start = static_cast<int>(start);
    d.stop = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    d.kind = Decoder::kMetaspace;
    MSI_ASSIGN_OR_RETURN(d.a, f.string_or("replacement", "\xe2\x96\x81"));
    MSI_ASSIGN_OR_RETURN(bool add_prefix, f.boolean_or("add_prefix_space", true));
    MSI_ASSIGN_OR_RETURN(d.prepend_scheme,
                         f.string_or("prepend_scheme", add_prefix ? "always" : "never"));
  } else {
    return invalid_argument(where + ": decoder type '" + type + "' is not supported");
  }
  out.push_back(std::move(d));
  return ok_status();
}

}  // namespace msinfer::model::internal
