// The lexer of the Jinja subset: the reference's whole-template whitespace
// pre-pass, then text, {{ }}, {% %} and {# #} split into tokens.
#include "internal/lexer.h"

#include <cctype>
#include <utility>

#include "internal/value.h"

namespace msinfer::jinja {

std::string preprocess(std::string t) {
  if (!t.empty() && t.back() == '\n') t.pop_back();
  // lstrip_blocks: spaces and tabs at a line's start before {% or {# or {-.
  std::string o;
  for (size_t i = 0; i < t.size();) {
    if (i == 0 || t[i - 1] == '\n') {
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' &&
          (t[j + 1] == '#' || t[j + 1] == '%' || t[j + 1] == '-')) {
        i = j;
      }
    }
    // Copy up to the next line start.
    const size_t nl = t.find('\n', i);
    const size_t stop = nl == std::string::npos ? t.size() : nl + 1;
    o.append(t, i, stop - i);
    i = stop;
  }
  t.swap(o);
  // trim_blocks: the newline after #}, %} or -}.
  o.clear();
  for (size_t i = 0; i < t.size(); ++i) {
    o += t[i];
    if (t[i] == '}' && i > 0 && (t[i - 1] == '#' || t[i - 1] == '%' || t[i - 1] == '-') &&
        i + 1 < t.size() && t[i + 1] == '\n') {
      ++i;
    }
  }
  t.swap(o);
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  // "-%}\s*" -> "%}" and "\s*{%-" -> "{%", likewise for }} and #}. (The
  // first byte is looked at before a compare: a compare at every byte was
  // most of a template's parse under the fuzzer.)
  for (const auto& [close, open] : {std::pair{"%}", "{%"}, {"}}", "{{"}, {"#}", "{#"}}) {
    const std::string dash_close = std::string("-") + close, open_dash = std::string(open) + "-";
    o.clear();
    for (size_t i = 0; i < t.size();) {
      if (t[i] == '-' && t.compare(i, 3, dash_close) == 0) {
        o += close;
        i += 3;
        while (i < t.size() && is_space(t[i])) ++i;
      } else {
        o += t[i++];
      }
    }
    t.swap(o);
    o.clear();
    for (size_t i = 0; i < t.size();) {
      if (is_space(t[i])) {
        size_t j = i;
        while (j < t.size() && is_space(t[j])) ++j;
        if (j < t.size() && t[j] == '{' && t.compare(j, 3, open_dash) == 0) {
          i = j;  // drop the run of whitespace
          continue;
        }
        o.append(t, i, j - i);
        i = j;
      } else if (t[i] == '{' && t.compare(i, 3, open_dash) == 0) {
        o += open;
        i += 3;
      } else {
        o += t[i++];
      }
    }
    t.swap(o);
  }
  return t;
}

std::vector<Token> lex(const std::string& src_in) {
  const std::string src = preprocess(src_in);
  std::vector<Token> toks;
  size_t p = 0;
  int line = 1;
  auto at = [&](size_t k) { return k < src.size() ? src[k] : '\0'; };
  bool in_tag = false;
  // The tag's `{` operators (dict literals) not yet closed by a `}`: `}}`
  // ends an expression only when none is open. Kept as the tokens go by
  // (counting back over the tag's tokens at each one made a long tag cost
  // its length squared).
  int64_t open_braces = 0;
  while (p < src.size()) {
    if (!in_tag) {
      const size_t start = p;
      while (p < src.size() &&
             !(src[p] == '{' && (at(p + 1) == '%' || at(p + 1) == '{' || at(p + 1) == '#')))
        ++p;
      if (p > start) {
        toks.push_back({Tok::kText, src.substr(start, p - start), line});
        line += static_cast<int>(std::count(src.begin() + start, src.begin() + p, '\n'));
      }
      if (p >= src.size()) break;
      if (at(p + 1) == '#') {
        const size_t end = src.find("#}", p + 2);
        if (end == std::string::npos)
          throw Error("line " + std::to_string(line) + ": unclosed comment");
        line += static_cast<int>(std::count(src.begin() + p, src.begin() + end, '\n'));
        p = end + 2;
        continue;
      }
      toks.push_back({at(p + 1) == '%' ? Tok::kOpenStmt : Tok::kOpenExpr, src.substr(p, 2), line});
      p += 2;
      in_tag = true;
      open_braces = 0;
      continue;
    }
    const char c = src[p];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (c == '\n') ++line;
      ++p;
      continue;
    }
    if (c == '%' && at(p + 1) == '}') {
      toks.push_back({Tok::kCloseStmt, "%}", line});
      p += 2;
      in_tag = false;
      continue;
    }
    if (c == '}' && at(p + 1) == '}' && open_braces <= 0) {
      toks.push_back({Tok::kCloseExpr, "}}", line});
      p += 2;
      in_tag = false;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string s;
      ++p;
      while (p < src.size() && src[p] != c) {
        if (src[p] == '\\') {
          const char e = at(p + 1);
          static const std::map<char, char> kEsc = {{'n', '\n'},  {'t', '\t'}, {'r', '\r'},
                                                    {'b', '\b'},  {'f', '\f'}, {'v', '\v'},
                                                    {'\'', '\''}, {'"', '"'},  {'\\', '\\'}};
          auto it = kEsc.find(e);
          if (it == kEsc.end())
            throw Error("line " + std::to_string(line) + ": unexpected escape \\" + e);
          s += it->second;
          p += 2;
          continue;
        }
        if (src[p] == '\n') ++line;
        s += src[p++];
      }
      if (p >= src.size()) throw Error("line " + std::to_string(line) + ": unterminated string");
      ++p;
      toks.push_back({Tok::kString, s, line});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      if (at(q) == '.' && std::isdigit(static_cast<unsigned char>(at(q + 1)))) {
        ++q;
        while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      }
      toks.push_back({Tok::kNumber, src.substr(p, q - p), line});
      p = q;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_'))
        ++q;
      toks.push_back({Tok::kName, src.substr(p, q - p), line});
      p = q;
      continue;
    }
    static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*",
                                 "/",  "%",  "<",  ">",  "=",  "~",  "|", ".", ",",
                                 ":",  "(",  ")",  "[",  "]",  "{",  "}"};
    bool found = false;
    for (const char* op : kOps) {
      const size_t n = std::strlen(op);
      if (op[0] == c && src.compare(p, n, op) == 0) {
        if (op[0] == '{') ++open_braces;
        if (op[0] == '}') --open_braces;
        toks.push_back({Tok::kOp, op, line});
        p += n;
        found = true;
        break;
      }
    }
    if (!found)
      throw Error("line " + std::to_string(line) + ": unexpected character '" + std::string(1, c) +
                  "'");
  }
  if (in_tag)
    throw Error("line " + std::to_string(line) + ": unclosed tag at the end of the template");
  toks.push_back({Tok::kEnd, "", line});
  return toks;
}

}  // namespace msinfer::jinja
