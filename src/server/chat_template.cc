// A Jinja-subset interpreter for chat templates. It follows the reference
// renderer @huggingface/jinja where Python's Jinja and it differ (the
// reference is what tests compare with): the whole-template whitespace
// pre-pass (trim_blocks, lstrip_blocks, '-' markers), strip()/lstrip()/
// rstrip() trimming all whitespace whatever their argument, booleans printed
// as true/false, none printed as nothing.
#include "msinfer/server/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <variant>

namespace msinfer::server {
namespace {

// ---------------------------------------------------------------- values

struct Value;
using Array = std::vector<Value>;
struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  Value* find(const std::string& k);
};
struct Callable;

struct Value {
  enum Kind { kUndefined, kNull, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };
  Kind kind = kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> a;
  std::shared_ptr<Object> o;  // shared: namespace() attributes are set in place
  std::shared_ptr<Callable> fn;

  static Value null() {
    Value v;
    v.kind = kNull;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = kInt;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.kind = kFloat;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.kind = kString;
    v.s = std::move(x);
    return v;
  }
  static Value array(Array x = {}) {
    Value v;
    v.kind = kArray;
    v.a = std::make_shared<Array>(std::move(x));
    return v;
  }
  static Value object() {
    Value v;
    v.kind = kObject;
    v.o = std::make_shared<Object>();
    return v;
  }
  bool is_number() const { return kind == kInt || kind == kFloat; }
  double num() const { return kind == kInt ? static_cast<double>(i) : f; }
  bool truthy() const {
    switch (kind) {
      case kUndefined:
      case kNull:
        return false;
      case kBool:
        return b;
      case kInt:
        return i != 0;
      case kFloat:
        return f != 0;
      case kString:
        return !s.empty();
      case kArray:
        return !a->empty();
      case kObject:
        return !o->items.empty();
      case kFunction:
        return true;
    }
    return false;
  }
};

Value* Object::find(const std::string& k) {
  for (auto& [key, v] : items) {
    if (key == k) return &v;
  }
  return nullptr;
}

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Callable {
  std::function<Value(const Args&, const Kwargs&)> call;
};

Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::null();
    case Json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case Json::value_t::number_float:
      return Value::number(j.get<double>());
    case Json::value_t::string:
      return Value::str(j.get<std::string>());
    case Json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return Value::array(std::move(a));
    }
    case Json::value_t::object: {
      Value v = Value::object();
      for (const auto& [k, e] : j.items()) v.o->items.emplace_back(k, from_json(e));
      return v;
    }
    default:
      return Value();
  }
}

std::string js_number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char b[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(b, sizeof(b), "%.*g", p, d);
    if (std::strtod(b, nullptr) == d) break;
  }
  return b;
}

std::string to_string(const Value& v);

std::string json_string(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// tojson as the reference writes it: ", " and ": " separators, or indented.
std::string to_json(const Value& v, int indent, int depth) {
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNull:
      return "null";
    case Value::kBool:
      return v.b ? "true" : "false";
    case Value::kInt:
      return std::to_string(v.i);
    case Value::kFloat:
      return js_number(v.f);
    case Value::kString:
      return json_string(v.s);
    case Value::kArray:
    case Value::kObject: {
      const std::string ind(indent > 0 ? indent : 0, ' ');
      std::string base = "\n";
      for (int d = 0; d < depth; ++d) base += ind;
      const std::string child = base + ind;
      std::vector<std::string> core;
      if (v.kind == Value::kArray) {
        for (const auto& e : *v.a) core.push_back(to_json(e, indent, depth + 1));
      } else {
        for (const auto& [k, e] : v.o->items) {
          core.push_back((indent > 0 ? child : "") + "\"" + k +
                         "\": " + to_json(e, indent, depth + 1));
        }
      }
      std::string out;
      if (v.kind == Value::kArray) {
        if (indent > 0) {
          out = "[" + child;
          for (size_t i = 0; i < core.size(); ++i) out += (i ? "," + child : "") + core[i];
          return out + base + "]";
        }
        out = "[";
        for (size_t i = 0; i < core.size(); ++i) out += (i ? ", " : "") + core[i];
        return out + "]";
      }
      out = "{";
      for (size_t i = 0; i < core.size(); ++i)
        out += (i ? (indent > 0 ? "," : ", ") : "") + core[i];
      return out + (indent > 0 ? base : "") + "}";
    }
    case Value::kFunction:
      throw Error("cannot convert a function to JSON");
  }
  return "";
}

std::string to_string(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "undefined";
    case Value::kNull:
      return "null";
    case Value::kBool:
      return v.b ? "true" : "false";
    case Value::kInt:
      return std::to_string(v.i);
    case Value::kFloat:
      return std::fmod(v.f, 1.0) == 0 ? js_number(v.f) + ".0" : js_number(v.f);
    case Value::kString:
      return v.s;
    case Value::kArray: {
      std::string s;
      for (size_t i = 0; i < v.a->size(); ++i) s += (i ? "," : "") + to_string((*v.a)[i]);
      return s;
    }
    case Value::kObject:
      return "[object Map]";
    case Value::kFunction:
      return "[function]";
  }
  return "";
}

// The reference compares with JavaScript's loose equality (==): a boolean
// compares as 0/1, a string with a number as the number it spells ("" is 0),
// null equals undefined only.
double js_to_number(const Value& v) {
  if (v.kind == Value::kBool) return v.b ? 1 : 0;
  if (v.is_number()) return v.num();
  if (v.kind == Value::kString) {
    size_t b = 0, e = v.s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(v.s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(v.s[e - 1]))) --e;
    if (b == e) return 0;
    const std::string t = v.s.substr(b, e - b);
    char* end = nullptr;
    const double d = std::strtod(t.c_str(), &end);
    return end == t.c_str() + t.size() ? d : std::nan("");
  }
  return std::nan("");
}

bool equal(const Value& x, const Value& y) {
  auto scalar = [](const Value& v) {
    return v.kind == Value::kBool || v.is_number() || v.kind == Value::kString;
  };
  if (x.kind == Value::kString && y.kind == Value::kString) return x.s == y.s;
  if (scalar(x) && scalar(y)) return js_to_number(x) == js_to_number(y);
  const bool xn = x.kind == Value::kNull || x.kind == Value::kUndefined;
  const bool yn = y.kind == Value::kNull || y.kind == Value::kUndefined;
  if (xn || yn) return xn && yn;
  if (x.kind != y.kind) return false;
  switch (x.kind) {
    case Value::kArray:
      return x.a == y.a;
    case Value::kObject:
      return x.o == y.o;
    default:
      return false;
  }
}

// JavaScript's String.prototype.trim whitespace, in UTF-8.
size_t ws_len(const std::string& s, size_t i) {
  static const char* kMulti[] = {"\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9",
                                 "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80", "\xEF\xBB\xBF"};
  const unsigned char c = s[i];
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return 1;
  for (const char* m : kMulti) {
    const size_t n = std::strlen(m);
    if (s.compare(i, n, m) == 0) return n;
  }
  // U+2000..U+200A: E2 80 80..8A
  if (i + 2 < s.size() && c == 0xE2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      static_cast<unsigned char>(s[i + 2]) >= 0x80 &&
      static_cast<unsigned char>(s[i + 2]) <= 0x8A) {
    return 3;
  }
  return 0;
}
std::string trim_start(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = ws_len(s, i);
    if (n == 0) break;
    i += n;
  }
  return s.substr(i);
}
std::string trim_end(const std::string& s) {
  // Scan forward, remembering where the trailing run of whitespace began.
  size_t i = 0, end = 0;
  while (i < s.size()) {
    const size_t n = ws_len(s, i);
    if (n == 0) {
      ++i;
      while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
      end = i;
    } else {
      i += n;
    }
  }
  return s.substr(0, end);
}

// ---------------------------------------------------------------- lexer

enum class Tok {
  kText,
  kOpenStmt,
  kCloseStmt,
  kOpenExpr,
  kCloseExpr,
  kName,
  kString,
  kNumber,
  kOp,
  kEnd
};
struct Token {
  Tok type;
  std::string text;
  int line;
};

// The reference's pre-pass over the whole template source.
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
  // "-%}\s*" -> "%}" and "\s*{%-" -> "{%", likewise for }} and #}.
  for (const auto& [close, open] : {std::pair{"%}", "{%"}, {"}}", "{{"}, {"#}", "{#"}}) {
    const std::string dash_close = std::string("-") + close, open_dash = std::string(open) + "-";
    o.clear();
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, dash_close) == 0) {
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
        if (t.compare(j, 3, open_dash) == 0) {
          i = j;  // drop the run of whitespace
          continue;
        }
        o.append(t, i, j - i);
        i = j;
      } else if (t.compare(i, 3, open_dash) == 0) {
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
      continue;
    }
    const char c = src[p];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (c == '\n') ++line;
      ++p;
      continue;
    }
    int brace_depth = 0;
    for (auto it = toks.rbegin();
         it != toks.rend() && it->type != Tok::kOpenExpr && it->type != Tok::kOpenStmt; ++it) {
      if (it->type == Tok::kOp && it->text == "{") --brace_depth;
      if (it->type == Tok::kOp && it->text == "}") ++brace_depth;
    }
    if (c == '%' && at(p + 1) == '}') {
      toks.push_back({Tok::kCloseStmt, "%}", line});
      p += 2;
      in_tag = false;
      continue;
    }
    if (c == '}' && at(p + 1) == '}' && brace_depth >= 0) {
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
      if (src.compare(p, n, op) == 0) {
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

// ---------------------------------------------------------------- AST

struct Expr;
using ExprP = std::shared_ptr<Expr>;
struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kTernary
  };
  Kind kind;
  Value literal;
  std::string name;         // name, attribute, filter, test, operator
  std::vector<ExprP> args;  // operands / elements / call args (positional)
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;  // is not
};

struct Stmt;
using Body = std::vector<std::shared_ptr<Stmt>>;
struct Stmt {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kMacro, kBreak, kContinue };
  Kind kind;
  std::string text;
  ExprP expr;                                    // output / if test / for iterable / set value
  std::vector<std::pair<ExprP, Body>> branches;  // if: (test, body); else with null test
  std::vector<std::string> targets;              // for / set names
  ExprP target;                                  // set: name or attribute
  ExprP filter;                                  // for ... if
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro
};

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  Body parse_template() {
    Body b = parse_body({});
    if (peek().type != Tok::kEnd) fail("unexpected {% " + end_word_ + " %}");
    return b;
  }

 private:
  const Token& peek(int k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& m) const {
    throw Error("line " + std::to_string(peek().line) + ": " + m);
  }
  bool is_op(const std::string& o, int k = 0) const {
    return peek(k).type == Tok::kOp && peek(k).text == o;
  }
  bool is_name(const std::string& n, int k = 0) const {
    return peek(k).type == Tok::kName && peek(k).text == n;
  }
  void expect_op(const std::string& o) {
    if (!is_op(o)) fail("expected '" + o + "', got '" + peek().text + "'");
    ++p_;
  }
  void expect(Tok t, const char* what) {
    if (peek().type != t) fail(std::string("expected ") + what + ", got '" + peek().text + "'");
    ++p_;
  }
  std::string name() {
    if (peek().type != Tok::kName) fail("expected a name, got '" + peek().text + "'");
    return next().text;
  }

  // Parses statements until {% w %} for a w in `ends` (left unconsumed: p_ at
  // the word, end_word_ set).
  Body parse_body(const std::vector<std::string>& ends) {
    if (++depth_ > 128) fail("blocks nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    Body body;
    for (;;) {
      const Token& tk = peek();
      if (tk.type == Tok::kEnd) {
        if (!ends.empty()) fail("missing {% " + ends[0] + " %}");
        return body;
      }
      if (tk.type == Tok::kText) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::kText;
        s->text = next().text;
        body.push_back(s);
        continue;
      }
      if (tk.type == Tok::kOpenExpr) {
        ++p_;
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::kOutput;
        s->expr = expr();
        expect(Tok::kCloseExpr, "'}}'");
        body.push_back(s);
        continue;
      }
      if (tk.type != Tok::kOpenStmt) fail("unexpected '" + tk.text + "'");
      const std::string w = peek(1).text;
      if (std::find(ends.begin(), ends.end(), w) != ends.end()) {
        ++p_;
        end_word_ = w;
        return body;
      }
      ++p_;
      body.push_back(statement());
    }
  }

  void close() { expect(Tok::kCloseStmt, "'%}'"); }

  std::shared_ptr<Stmt> statement() {
    const std::string w = name();
    auto s = std::make_shared<Stmt>();
    if (w == "if") {
      s->kind = Stmt::kIf;
      ExprP test = expr();
      close();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(test, std::move(b));
        const std::string e = name();
        if (e == "elif") {
          test = expr();
          close();
        } else if (e == "else") {
          close();
          Body eb = parse_body({"endif"});
          name();
          close();
          s->branches.emplace_back(nullptr, std::move(eb));
          break;
        } else {
          close();
          break;
        }
      }
    } else if (w == "for") {
      s->kind = Stmt::kFor;
      s->targets.push_back(name());
      while (is_op(",")) {
        ++p_;
        s->targets.push_back(name());
      }
      if (!is_name("in")) fail("expected 'in'");
      ++p_;
      s->expr = ternary_free_expr();
      if (is_name("if")) {
        ++p_;
        s->filter = expr();
      }
      if (is_name("recursive")) fail("recursive loops are not supported");
      close();
      s->body = parse_body({"else", "endfor"});
      if (name() == "else") {
        close();
        s->else_body = parse_body({"endfor"});
        name();
      }
      close();
    } else if (w == "set") {
      s->kind = Stmt::kSet;
      s->target = primary_postfix();
      while (is_op(",")) {
        ++p_;
        if (s->targets.empty()) s->targets.push_back(s->target->name);
        s->targets.push_back(name());
      }
      if (is_op("=")) {
        ++p_;
        s->expr = expr();
        close();
      } else {
        close();
        s->body = parse_body({"endset"});
        name();
        close();
      }
    } else if (w == "macro") {
      s->kind = Stmt::kMacro;
      s->text = name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pn = name();
        ExprP def;
        if (is_op("=")) {
          ++p_;
          def = expr();
        }
        s->params.emplace_back(pn, def);
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      close();
      s->body = parse_body({"endmacro"});
      name();
      close();
    } else if (w == "break" || w == "continue") {
      s->kind = w == "break" ? Stmt::kBreak : Stmt::kContinue;
      close();
    } else {
      fail("unsupported statement '" + w + "'");
    }
    return s;
  }

  ExprP make(Expr::Kind k) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    return e;
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r) {
    auto e = make(Expr::kBinary);
    e->name = op;
    e->args = {std::move(l), std::move(r)};
    return e;
  }

  ExprP expr() {
    // Nesting is bounded: a hostile template must not exhaust the stack.
    if (++depth_ > 128) fail("expressions nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    ExprP e = or_expr();
    while (is_name("if")) {
      ++p_;
      auto t = make(Expr::kTernary);
      ExprP cond = or_expr();
      ExprP other;
      if (is_name("else")) {
        ++p_;
        other = or_expr();
      } else {
        other = make(Expr::kLiteral);  // undefined
      }
      t->args = {cond, e, other};
      e = t;
    }
    return e;
  }
  ExprP ternary_free_expr() { return or_expr(); }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      ++p_;
      e = binary("or", e, and_expr());
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      ++p_;
      e = binary("and", e, not_expr());
    }
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      ++p_;
      auto e = make(Expr::kUnary);
      e->name = "not";
      e->args = {not_expr()};
      return e;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = additive();
    for (;;) {
      if (peek().type == Tok::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        const std::string op = next().text;
        e = binary(op, e, additive());
      } else if (is_name("in")) {
        ++p_;
        e = binary("in", e, additive());
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        e = binary("not in", e, additive());
      } else {
        return e;
      }
    }
  }
  ExprP additive() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      e = binary(op, e, concat());
    }
    return e;
  }
  ExprP concat() {
    ExprP e = multiplicative();
    while (is_op("~")) {
      ++p_;
      e = binary("~", e, multiplicative());
    }
    return e;
  }
  ExprP multiplicative() {
    ExprP e = unary();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      e = binary(op, e, unary());
    }
    return e;
  }
  ExprP unary() {
    if (is_op("-") || is_op("+")) {
      const std::string op = next().text;
      auto e = make(Expr::kUnary);
      e->name = op;
      e->args = {unary()};
      return e;
    }
    return tests(filters(primary_postfix()));
  }
  ExprP tests(ExprP e) {
    while (is_name("is")) {
      ++p_;
      auto t = make(Expr::kTest);
      if (is_name("not")) {
        ++p_;
        t->negate = true;
      }
      // "none", "true", "false" are names here.
      t->name = name();
      t->args = {e};
      e = t;
    }
    return e;
  }
  ExprP filters(ExprP e) {
    while (is_op("|")) {
      ++p_;
      auto f = make(Expr::kFilter);
      f->name = name();
      f->args = {e};
      if (is_op("(")) call_args(f.get());
      e = f;
    }
    return e;
  }
  void call_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().type == Tok::kName && is_op("=", 1)) {
        std::string k = name();
        ++p_;
        e->kwargs.emplace_back(k, expr());
      } else {
        e->args.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }
  ExprP primary_postfix() {
    ExprP e = primary();
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto a = make(Expr::kAttr);
        a->name = name();
        a->args = {e};
        e = a;
      } else if (is_op("[")) {
        ++p_;
        ExprP parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++p_;
            if (++colons > 2) fail("too many ':' in a slice");
            continue;
          }
          parts[colons] = expr();
        }
        ++p_;
        auto s = make(colons > 0 ? Expr::kSlice : Expr::kItem);
        s->args = {e, parts[0], parts[1], parts[2]};
        if (colons == 0 && !parts[0]) fail("empty subscript");
        e = s;
      } else if (is_op("(")) {
        auto c = make(Expr::kCall);
        c->args = {e};
        call_args(c.get());
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprP primary() {
    const Token& tk = peek();
    if (tk.type == Tok::kString) {
      auto e = make(Expr::kLiteral);
      std::string s = next().text;
      while (peek().type == Tok::kString) s += next().text;  // adjacent literals
      e->literal = Value::str(s);
      return e;
    }
    if (tk.type == Tok::kNumber) {
      auto e = make(Expr::kLiteral);
      const std::string n = next().text;
      e->literal = n.find('.') == std::string::npos ? Value::integer(std::stoll(n))
                                                    : Value::number(std::stod(n));
      return e;
    }
    if (tk.type == Tok::kName) {
      auto e = make(Expr::kName);
      e->name = next().text;
      return e;
    }
    if (is_op("(")) {
      ++p_;
      ExprP e = expr();
      if (is_op(",")) {  // a tuple
        auto l = make(Expr::kList);
        l->args.push_back(e);
        while (is_op(",")) {
          ++p_;
          if (is_op(")")) break;
          l->args.push_back(expr());
        }
        e = l;
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++p_;
      auto l = make(Expr::kList);
      while (!is_op("]")) {
        l->args.push_back(expr());
        if (!is_op("]")) expect_op(",");
      }
      ++p_;
      return l;
    }
    if (is_op("{")) {
      ++p_;
      auto d = make(Expr::kDict);
      while (!is_op("}")) {
        ExprP k = expr();
        expect_op(":");
        d->args.push_back(k);
        d->args.push_back(expr());
        if (!is_op("}")) expect_op(",");
      }
      ++p_;
      return d;
    }
    fail("unexpected '" + tk.text + "'");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  std::string end_word_;
};

// ---------------------------------------------------------------- interpreter

struct BreakSignal {};
struct ContinueSignal {};

class Scope {
 public:
  explicit Scope(Scope* parent) : parent_(parent) {}
  Value lookup(const std::string& n) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_) {
      auto it = s->vars_.find(n);
      if (it != s->vars_.end()) return it->second;
    }
    return Value();
  }
  void set(const std::string& n, Value v) { vars_[n] = std::move(v); }

 private:
  Scope* parent_;
  std::map<std::string, Value> vars_;
};

class Interpreter {
 public:
  explicit Interpreter(std::time_t now) : now_(now) {}
  std::string run(const Body& b, Scope& s) {
    std::string out;
    exec(b, s, out);
    return out;
  }

 private:
  std::time_t now_;  // what strftime_now() formats
  void exec(const Body& body, Scope& s, std::string& out) {
    for (const auto& st : body) exec(*st, s, out);
  }

  void exec(const Stmt& st, Scope& s, std::string& out) {
    switch (st.kind) {
      case Stmt::kText:
        out += st.text;
        return;
      case Stmt::kOutput: {
        Value v = eval(*st.expr, s);
        if (v.kind != Value::kNull && v.kind != Value::kUndefined) out += to_string(v);
        if (out.size() > (64u << 20)) throw Error("the rendered text exceeds 64 MiB");
        return;
      }
      case Stmt::kIf:
        for (const auto& [test, body] : st.branches) {
          if (!test || eval(*test, s).truthy()) {
            exec(body, s, out);
            return;
          }
        }
        return;
      case Stmt::kFor:
        return exec_for(st, s, out);
      case Stmt::kSet: {
        Value v;
        if (st.expr) {
          v = eval(*st.expr, s);
        } else {
          v = Value::str(run(st.body, s));
        }
        if (!st.targets.empty()) {
          if (v.kind != Value::kArray || v.a->size() != st.targets.size())
            throw Error("cannot unpack in set");
          for (size_t i = 0; i < st.targets.size(); ++i) s.set(st.targets[i], (*v.a)[i]);
        } else if (st.target->kind == Expr::kName) {
          s.set(st.target->name, v);
        } else if (st.target->kind == Expr::kAttr) {
          Value obj = eval(*st.target->args[0], s);
          if (obj.kind != Value::kObject) throw Error("cannot assign to a member of a non-object");
          if (Value* slot = obj.o->find(st.target->name)) {
            *slot = v;
          } else {
            obj.o->items.emplace_back(st.target->name, v);
          }
        } else {
          throw Error("invalid assignment target");
        }
        return;
      }
      case Stmt::kMacro: {
        auto fn = std::make_shared<Callable>();
        const Stmt* def = &st;
        Scope* defining = &s;
        fn->call = [this, def, defining](const Args& args, const Kwargs& kw) {
          if (++calls_ > 64) {
            --calls_;
            throw Error("macro calls nested too deeply");
          }
          struct Leave {
            int& d;
            ~Leave() { --d; }
          } leave{calls_};
          Scope m(defining);
          for (size_t i = 0; i < def->params.size(); ++i) {
            const auto& [pn, dflt] = def->params[i];
            Value v;
            if (i < args.size()) {
              v = args[i];
            } else if (dflt) {
              v = eval(*dflt, m);
            }
            for (const auto& [k, kv] : kw) {
              if (k == pn) v = kv;
            }
            m.set(pn, v);
          }
          return Value::str(run(def->body, m));
        };
        Value v;
        v.kind = Value::kFunction;
        v.fn = fn;
        s.set(st.text, v);
        return;
      }
      case Stmt::kBreak:
        throw BreakSignal();
      case Stmt::kContinue:
        throw ContinueSignal();
    }
  }

  void exec_for(const Stmt& st, Scope& s, std::string& out) {
    Value it = eval(*st.expr, s);
    Array items;
    if (it.kind == Value::kArray) {
      items = *it.a;
    } else if (it.kind == Value::kObject) {
      for (const auto& [k, v] : it.o->items) items.push_back(Value::str(k));
    } else if (it.kind == Value::kString) {
      for (char c : it.s) items.push_back(Value::str(std::string(1, c)));
    } else {
      throw Error("cannot loop over " + to_string(it));
    }
    auto bind = [&](Scope& sc, const Value& v) {
      if (st.targets.size() == 1) {
        sc.set(st.targets[0], v);
        return;
      }
      if (v.kind != Value::kArray || v.a->size() != st.targets.size())
        throw Error("cannot unpack a loop item");
      for (size_t i = 0; i < st.targets.size(); ++i) sc.set(st.targets[i], (*v.a)[i]);
    };
    if (st.filter) {
      Array kept;
      for (const auto& v : items) {
        Scope f(&s);
        bind(f, v);
        if (eval(*st.filter, f).truthy()) kept.push_back(v);
      }
      items.swap(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++steps_ > 10000000) throw Error("the template runs too long");
      Scope body(&s);
      Value loop = Value::object();
      auto& L = loop.o->items;
      L.emplace_back("index", Value::integer(i + 1));
      L.emplace_back("index0", Value::integer(i));
      L.emplace_back("revindex", Value::integer(n - i));
      L.emplace_back("revindex0", Value::integer(n - i - 1));
      L.emplace_back("first", Value::boolean(i == 0));
      L.emplace_back("last", Value::boolean(i == n - 1));
      L.emplace_back("length", Value::integer(n));
      L.emplace_back("previtem", i > 0 ? items[i - 1] : Value());
      L.emplace_back("nextitem", i + 1 < n ? items[i + 1] : Value());
      body.set("loop", loop);
      bind(body, items[i]);
      try {
        exec(st.body, body, out);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
        continue;
      }
    }
    if (n == 0) {
      Scope e(&s);
      exec(st.else_body, e, out);
    }
  }

  int calls_ = 0;
  int64_t steps_ = 0;

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value member(const Value& obj, const std::string& key) {
    if (obj.kind == Value::kObject) {
      if (Value* v = obj.o->find(key)) return *v;
      static const char* kMethods[] = {"get", "items", "keys", "values"};
      for (const char* m : kMethods) {
        if (key == m) return method(obj, key);
      }
      return Value();
    }
    if (obj.kind == Value::kString) {
      if (key == "length") return Value::integer(static_cast<int64_t>(obj.s.size()));
      return method(obj, key);
    }
    if (obj.kind == Value::kArray) {
      if (key == "length") return Value::integer(static_cast<int64_t>(obj.a->size()));
      return Value();
    }
    if (obj.kind == Value::kUndefined) throw Error("cannot read '" + key + "' of undefined");
    if (obj.kind == Value::kNull) throw Error("cannot read '" + key + "' of none");
    return Value();
  }

  Value method(const Value& self, const std::string& m) {
    auto fn = std::make_shared<Callable>();
    Value v;
    v.kind = Value::kFunction;
    v.fn = fn;
    if (self.kind == Value::kObject) {
      if (m == "get") {
        fn->call = [self](const Args& a, const Kwargs&) {
          if (a.empty() || a[0].kind != Value::kString) throw Error("get() needs a string key");
          if (Value* x = self.o->find(a[0].s)) return *x;
          return a.size() > 1 ? a[1] : Value::null();
        };
      } else {
        fn->call = [self, m](const Args&, const Kwargs&) {
          Array out;
          for (const auto& [k, x] : self.o->items) {
            if (m == "items") out.push_back(Value::array({Value::str(k), x}));
            if (m == "keys") out.push_back(Value::str(k));
            if (m == "values") out.push_back(x);
          }
          return Value::array(std::move(out));
        };
      }
      return v;
    }
    const std::string s = self.s;
    if (m == "upper" || m == "lower") {
      fn->call = [s, m](const Args&, const Kwargs&) {
        std::string r = s;
        for (char& c : r)
          c = m == "upper" ? std::toupper(static_cast<unsigned char>(c))
                           : std::tolower(static_cast<unsigned char>(c));
        return Value::str(r);
      };
    } else if (m == "strip" || m == "lstrip" || m == "rstrip") {
      // As the reference: all whitespace, whatever the argument.
      fn->call = [s, m](const Args&, const Kwargs&) {
        if (m == "lstrip") return Value::str(trim_start(s));
        if (m == "rstrip") return Value::str(trim_end(s));
        return Value::str(trim_end(trim_start(s)));
      };
    } else if (m == "startswith" || m == "endswith") {
      fn->call = [s, m](const Args& a, const Kwargs&) {
        if (a.empty()) throw Error(m + "() needs an argument");
        auto test = [&](const std::string& p) {
          if (p.size() > s.size()) return false;
          return m == "startswith" ? s.compare(0, p.size(), p) == 0
                                   : s.compare(s.size() - p.size(), p.size(), p) == 0;
        };
        if (a[0].kind == Value::kString) return Value::boolean(test(a[0].s));
        if (a[0].kind == Value::kArray) {
          for (const auto& x : *a[0].a) {
            if (x.kind == Value::kString && test(x.s)) return Value::boolean(true);
          }
          return Value::boolean(false);
        }
        throw Error(m + "() needs a string or a tuple of strings");
      };
    } else if (m == "split") {
      fn->call = [s](const Args& a, const Kwargs&) {
        Array out;
        if (a.empty() || a[0].kind == Value::kNull) {
          std::istringstream in(s);
          std::string w;
          while (in >> w) out.push_back(Value::str(w));
          return Value::array(std::move(out));
        }
        if (a[0].kind != Value::kString || a[0].s.empty())
          throw Error("split() needs a non-empty string");
        const std::string& sep = a[0].s;
        int64_t max = a.size() > 1 && a[1].kind == Value::kInt ? a[1].i : -1;
        size_t from = 0;
        for (;;) {
          const size_t at = s.find(sep, from);
          if (at == std::string::npos || (max >= 0 && static_cast<int64_t>(out.size()) >= max))
            break;
          out.push_back(Value::str(s.substr(from, at - from)));
          from = at + sep.size();
        }
        out.push_back(Value::str(s.substr(from)));
        return Value::array(std::move(out));
      };
    } else if (m == "replace") {
      fn->call = [s](const Args& a, const Kwargs&) {
        if (a.size() < 2 || a[0].kind != Value::kString || a[1].kind != Value::kString) {
          throw Error("replace() needs two strings");
        }
        int64_t count = a.size() > 2 && a[2].kind == Value::kInt ? a[2].i : -1;
        std::string r;
        const std::string& from = a[0].s;
        if (from.empty()) throw Error("replace() of an empty string is not supported");
        size_t p = 0;
        for (;;) {
          const size_t at = s.find(from, p);
          if (at == std::string::npos || count == 0) break;
          r.append(s, p, at - p);
          r += a[1].s;
          p = at + from.size();
          if (count > 0) --count;
        }
        r.append(s, p, std::string::npos);
        return Value::str(r);
      };
    } else if (m == "title" || m == "capitalize") {
      fn->call = [s, m](const Args&, const Kwargs&) {
        std::string r = s;
        bool start = true;
        for (size_t i = 0; i < r.size(); ++i) {
          if (m == "capitalize") {
            if (i == 0) r[i] = std::toupper(static_cast<unsigned char>(r[i]));
            continue;
          }
          r[i] = start ? std::toupper(static_cast<unsigned char>(r[i]))
                       : std::tolower(static_cast<unsigned char>(r[i]));
          start = std::isspace(static_cast<unsigned char>(r[i])) != 0;
        }
        return Value::str(r);
      };
    } else {
      return Value();  // unknown attribute: undefined
    }
    return v;
  }

  Value call_global(const std::string& n, const Args& a, const Kwargs& kw) {
    if (n == "raise_exception") throw Error(a.empty() ? "raise_exception()" : to_string(a[0]));
    if (n == "strftime_now") {  // transformers' global: the local time, strftime's format
      if (a.empty() || a[0].kind != Value::kString) throw Error("strftime_now(format)");
      std::tm tm{};
      localtime_r(&now_, &tm);
      char buf[256];
      const size_t len = std::strftime(buf, sizeof(buf), a[0].s.c_str(), &tm);
      return Value::str(std::string(buf, len));
    }
    if (n == "namespace") {
      Value v = Value::object();
      for (const auto& [k, x] : kw) v.o->items.emplace_back(k, x);
      return v;
    }
    if (n == "range") {
      int64_t start = 0, stop = 0, step = 1;
      if (a.size() == 1) {
        stop = a[0].i;
      } else if (a.size() >= 2) {
        start = a[0].i;
        stop = a[1].i;
        if (a.size() > 2) step = a[2].i;
      }
      if (step == 0) throw Error("range() step must not be 0");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value::integer(i));
        if (out.size() > 1000000) throw Error("range() too long");
      }
      return Value::array(std::move(out));
    }
    throw Error("unknown function '" + n + "'");
  }

  Value filter(const std::string& f, const Value& x, const Args& a, const Kwargs& kw) {
    auto need = [&](Value::Kind k, const char* what) {
      if (x.kind != k) throw Error("filter " + f + " needs " + what);
    };
    if (f == "length" || f == "count") {
      if (x.kind == Value::kString) return Value::integer(static_cast<int64_t>(x.s.size()));
      if (x.kind == Value::kArray) return Value::integer(static_cast<int64_t>(x.a->size()));
      if (x.kind == Value::kObject) return Value::integer(static_cast<int64_t>(x.o->items.size()));
      throw Error("filter length needs a string, list or mapping");
    }
    if (f == "tojson") {
      int indent = 0;
      for (const auto& [k, v] : kw) {
        if (k == "indent" && v.kind == Value::kInt) indent = static_cast<int>(v.i);
      }
      if (!a.empty() && a[0].kind == Value::kInt) indent = static_cast<int>(a[0].i);
      return Value::str(to_json(x, indent, 0));
    }
    if (f == "string") return Value::str(to_string(x));
    if (f == "trim") {
      need(Value::kString, "a string");
      return Value::str(trim_end(trim_start(x.s)));
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
      need(Value::kString, "a string");
      return member(x, f).fn->call({}, {});
    }
    if (f == "default" || f == "d") {
      const bool boolean = (a.size() > 1 && a[1].truthy());
      if (x.kind == Value::kUndefined || (boolean && !x.truthy()))
        return a.empty() ? Value::str("") : a[0];
      return x;
    }
    if (f == "first" || f == "last") {
      if (x.kind == Value::kArray) {
        if (x.a->empty()) return Value();
        return f == "first" ? x.a->front() : x.a->back();
      }
      if (x.kind == Value::kString) {
        if (x.s.empty()) return Value();
        return Value::str(std::string(1, f == "first" ? x.s.front() : x.s.back()));
      }
      throw Error("filter " + f + " needs a list or a string");
    }
    if (f == "list") {
      if (x.kind == Value::kArray) return x;
      if (x.kind == Value::kObject) return member(x, "keys").fn->call({}, {});
      if (x.kind == Value::kString) {
        Array out;
        for (char c : x.s) out.push_back(Value::str(std::string(1, c)));
        return Value::array(std::move(out));
      }
      throw Error("filter list needs an iterable");
    }
    if (f == "reverse") {
      if (x.kind == Value::kString) return Value::str(std::string(x.s.rbegin(), x.s.rend()));
      need(Value::kArray, "a list");
      Array r(x.a->rbegin(), x.a->rend());
      return Value::array(std::move(r));
    }
    if (f == "join") {
      need(Value::kArray, "a list");
      const std::string sep = a.empty() ? "" : to_string(a[0]);
      std::string r;
      for (size_t i = 0; i < x.a->size(); ++i) r += (i ? sep : "") + to_string((*x.a)[i]);
      return Value::str(r);
    }
    if (f == "int") {
      if (x.kind == Value::kInt) return x;
      if (x.kind == Value::kFloat) return Value::integer(static_cast<int64_t>(x.f));
      if (x.kind == Value::kString) return Value::integer(std::strtoll(x.s.c_str(), nullptr, 10));
      return Value::integer(0);
    }
    if (f == "float") {
      if (x.is_number()) return Value::number(x.num());
      if (x.kind == Value::kString) return Value::number(std::strtod(x.s.c_str(), nullptr));
      return Value::number(0);
    }
    if (f == "abs") {
      if (x.kind == Value::kInt) return Value::integer(x.i < 0 ? -x.i : x.i);
      if (x.kind == Value::kFloat) return Value::number(std::fabs(x.f));
      throw Error("filter abs needs a number");
    }
    if (f == "items") return member(x, "items").fn->call({}, {});
    if (f == "unique") {
      need(Value::kArray, "a list");
      Array out;
      for (const auto& v : *x.a) {
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, v); }))
          out.push_back(v);
      }
      return Value::array(std::move(out));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "map" || f == "select" || f == "reject") {
      need(Value::kArray, "a list");
      Array out;
      for (const auto& v : *x.a) {
        if (f == "map") {
          std::string attr;
          for (const auto& [k, kv] : kw) {
            if (k == "attribute") attr = to_string(kv);
          }
          if (!attr.empty()) {
            out.push_back(v.kind == Value::kObject ? member(v, attr) : Value());
          } else if (!a.empty()) {
            Args rest(a.begin() + 1, a.end());
            out.push_back(filter(to_string(a[0]), v, rest, {}));
          }
          continue;
        }
        Value subject = v;
        size_t ti = 0;
        if (f == "selectattr" || f == "rejectattr") {
          if (a.empty()) throw Error("filter " + f + " needs an attribute");
          subject = v.kind == Value::kObject ? member(v, to_string(a[0])) : Value();
          ti = 1;
        }
        bool keep = subject.truthy();
        if (a.size() > ti)
          keep = test(to_string(a[ti]), subject, Args(a.begin() + ti + 1, a.end()));
        if (f == "rejectattr" || f == "reject") keep = !keep;
        if (keep) out.push_back(v);
      }
      return Value::array(std::move(out));
    }
    if (f == "indent") {
      need(Value::kString, "a string");
      int64_t width = a.empty() ? 4 : a[0].i;
      bool first = a.size() > 1 && a[1].truthy();
      for (const auto& [k, kv] : kw) {
        if (k == "width") width = kv.i;
        if (k == "first") first = kv.truthy();
      }
      const std::string pad(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
      std::string r;
      size_t p = 0;
      bool line_start = true;
      bool is_first = true;
      while (p <= x.s.size()) {
        const size_t nl = x.s.find('\n', p);
        const std::string ln = x.s.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
        if (line_start && ((is_first && first) || (!is_first && !ln.empty()))) r += pad;
        r += ln;
        is_first = false;
        if (nl == std::string::npos) break;
        r += "\n";
        p = nl + 1;
      }
      return Value::str(r);
    }
    if (f == "replace") {
      need(Value::kString, "a string");
      return member(x, "replace").fn->call(a, kw);
    }
    if (f == "sort") {
      need(Value::kArray, "a list");
      Array r = *x.a;
      std::stable_sort(r.begin(), r.end(), [](const Value& p, const Value& q) {
        if (p.is_number() && q.is_number()) return p.num() < q.num();
        return to_string(p) < to_string(q);
      });
      return Value::array(std::move(r));
    }
    throw Error("unknown filter '" + f + "'");
  }

  bool test(const std::string& t, const Value& x, const Args& a) {
    if (t == "defined") return x.kind != Value::kUndefined;
    if (t == "undefined") return x.kind == Value::kUndefined;
    if (t == "none") return x.kind == Value::kNull;
    if (t == "string") return x.kind == Value::kString;
    if (t == "number") return x.is_number();
    if (t == "integer") return x.kind == Value::kInt;
    if (t == "float") return x.kind == Value::kFloat;
    if (t == "boolean") return x.kind == Value::kBool;
    if (t == "true") return x.kind == Value::kBool && x.b;
    if (t == "false") return x.kind == Value::kBool && !x.b;
    if (t == "mapping") return x.kind == Value::kObject;
    if (t == "sequence" || t == "iterable") {
      return x.kind == Value::kArray || x.kind == Value::kString || x.kind == Value::kObject;
    }
    if (t == "callable") return x.kind == Value::kFunction;
    if (t == "odd" || t == "even") {
      if (x.kind != Value::kInt) throw Error("test " + t + " needs an integer");
      return (x.i % 2 != 0) == (t == "odd");
    }
    if (t == "equalto" || t == "eq" || t == "==") return !a.empty() && equal(x, a[0]);
    if (t == "ne" || t == "!=") return a.empty() || !equal(x, a[0]);
    if (t == "in") {
      return !a.empty() && binary("in", x, a[0]).b;
    }
    throw Error("unknown test '" + t + "'");
  }

  Value binary(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.kind == Value::kUndefined) return Value::boolean(op == "not in");
      if (r.kind == Value::kString) {
        if (l.kind != Value::kString) throw Error("'in <string>' needs a string on the left");
        found = r.s.find(l.s) != std::string::npos;
      } else if (r.kind == Value::kArray) {
        found = std::any_of(r.a->begin(), r.a->end(), [&](const Value& v) { return equal(v, l); });
      } else if (r.kind == Value::kObject) {
        found = l.kind == Value::kString && r.o->find(l.s) != nullptr;
      } else {
        throw Error("'in' needs a string, list or mapping on the right");
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    if (l.kind == Value::kUndefined || r.kind == Value::kUndefined) {
      throw Error("cannot apply " + op + " to an undefined value");
    }
    if (l.kind == Value::kNull || r.kind == Value::kNull)
      throw Error("cannot apply " + op + " to none");
    if (op == "~") return Value::str(to_string(l) + to_string(r));
    if (l.is_number() && r.is_number()) {
      const bool fl = l.kind == Value::kFloat || r.kind == Value::kFloat;
      const double a = l.num(), b = r.num();
      if (op == "+") return fl ? Value::number(a + b) : Value::integer(l.i + r.i);
      if (op == "-") return fl ? Value::number(a - b) : Value::integer(l.i - r.i);
      if (op == "*") return fl ? Value::number(a * b) : Value::integer(l.i * r.i);
      if (op == "/") {
        return Value::number(a / b);
      }
      if (op == "//") {
        if (b == 0) throw Error("division by zero");
        return fl ? Value::number(std::floor(a / b))
                  : Value::integer(static_cast<int64_t>(std::floor(a / b)));
      }
      if (op == "%") {
        if (!fl) {
          if (r.i == 0) throw Error("modulo by zero");
          return Value::integer(l.i % r.i);
        }
        return Value::number(std::fmod(a, b));
      }
      if (op == "<") return Value::boolean(a < b);
      if (op == ">") return Value::boolean(a > b);
      if (op == "<=") return Value::boolean(a <= b);
      if (op == ">=") return Value::boolean(a >= b);
    }
    if (l.kind == Value::kArray && r.kind == Value::kArray && op == "+") {
      Array c = *l.a;
      c.insert(c.end(), r.a->begin(), r.a->end());
      return Value::array(std::move(c));
    }
    if ((l.kind == Value::kString || r.kind == Value::kString) && op == "+") {
      return Value::str(to_string(l) + to_string(r));
    }
    if (l.kind == Value::kString && r.kind == Value::kString) {
      if (op == "<") return Value::boolean(l.s < r.s);
      if (op == ">") return Value::boolean(l.s > r.s);
      if (op == "<=") return Value::boolean(l.s <= r.s);
      if (op == ">=") return Value::boolean(l.s >= r.s);
    }
    if (l.kind == Value::kString && r.kind == Value::kInt && op == "*") {
      std::string s;
      for (int64_t i = 0; i < r.i && s.size() < (1u << 24); ++i) s += l.s;
      return Value::str(s);
    }
    throw Error("unsupported operation " + op);
  }

  Value slice(const Value& x, const Expr& e, Scope& s) {
    auto part = [&](int k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      Value v = eval(*e.args[k], s);
      if (v.kind == Value::kNull || v.kind == Value::kUndefined) return std::nullopt;
      if (v.kind != Value::kInt) throw Error("slice indices must be integers");
      return v.i;
    };
    const auto start = part(1), stop = part(2), step_o = part(3);
    const int64_t step = step_o.value_or(1);
    if (step == 0) throw Error("slice step must not be 0");
    int64_t n;
    if (x.kind == Value::kArray) {
      n = static_cast<int64_t>(x.a->size());
    } else if (x.kind == Value::kString) {
      n = static_cast<int64_t>(x.s.size());
    } else {
      throw Error("only lists and strings can be sliced");
    }
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t i = *v < 0 ? *v + n : *v;
      return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t b = clamp(start, step > 0 ? 0 : n - 1), en = clamp(stop, step > 0 ? n : -1);
    Array out;
    std::string str;
    for (int64_t i = b; step > 0 ? i < en : i > en; i += step) {
      if (x.kind == Value::kArray) {
        out.push_back((*x.a)[i]);
      } else {
        str += x.s[i];
      }
    }
    return x.kind == Value::kArray ? Value::array(std::move(out)) : Value::str(str);
  }

  Value eval(const Expr& e, Scope& s) {
    switch (e.kind) {
      case Expr::kLiteral:
        return e.literal;
      case Expr::kName: {
        if (e.name == "true" || e.name == "True") return Value::boolean(true);
        if (e.name == "false" || e.name == "False") return Value::boolean(false);
        if (e.name == "none" || e.name == "None") return Value::null();
        return s.lookup(e.name);
      }
      case Expr::kList: {
        Array a;
        for (const auto& x : e.args) a.push_back(eval(*x, s));
        return Value::array(std::move(a));
      }
      case Expr::kDict: {
        Value d = Value::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], s);
          d.o->items.emplace_back(to_string(k), eval(*e.args[i + 1], s));
        }
        return d;
      }
      case Expr::kAttr:
        return member(eval(*e.args[0], s), e.name);
      case Expr::kItem: {
        Value x = eval(*e.args[0], s);
        Value k = eval(*e.args[1], s);
        if (x.kind == Value::kArray && k.kind == Value::kInt) {
          const int64_t i = norm_index(k.i, static_cast<int64_t>(x.a->size()));
          if (i < 0 || i >= static_cast<int64_t>(x.a->size())) return Value();
          return (*x.a)[i];
        }
        if (x.kind == Value::kString && k.kind == Value::kInt) {
          const int64_t i = norm_index(k.i, static_cast<int64_t>(x.s.size()));
          if (i < 0 || i >= static_cast<int64_t>(x.s.size())) return Value();
          return Value::str(std::string(1, x.s[i]));
        }
        if (k.kind == Value::kString) return member(x, k.s);
        if (x.kind == Value::kUndefined) throw Error("cannot index undefined");
        return Value();
      }
      case Expr::kSlice:
        return slice(eval(*e.args[0], s), e, s);
      case Expr::kCall: {
        Args a;
        Kwargs kw;
        for (size_t i = 1; i < e.args.size(); ++i) a.push_back(eval(*e.args[i], s));
        for (const auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x, s));
        const Expr& callee = *e.args[0];
        if (callee.kind == Expr::kName) {
          Value f = s.lookup(callee.name);
          if (f.kind == Value::kFunction) return f.fn->call(a, kw);
          return call_global(callee.name, a, kw);
        }
        Value f = eval(callee, s);
        if (f.kind != Value::kFunction) throw Error("cannot call a value that is not a function");
        return f.fn->call(a, kw);
      }
      case Expr::kFilter: {
        Args a;
        Kwargs kw;
        Value x = eval(*e.args[0], s);
        for (size_t i = 1; i < e.args.size(); ++i) a.push_back(eval(*e.args[i], s));
        for (const auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v, s));
        return filter(e.name, x, a, kw);
      }
      case Expr::kTest: {
        const bool r = test(e.name, eval(*e.args[0], s), {});
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::kUnary: {
        Value x = eval(*e.args[0], s);
        if (e.name == "not") return Value::boolean(!x.truthy());
        if (!x.is_number()) throw Error("unary " + e.name + " needs a number");
        if (e.name == "+") return x;
        return x.kind == Value::kInt ? Value::integer(-x.i) : Value::number(-x.f);
      }
      case Expr::kBinary: {
        if (e.name == "and") {
          Value l = eval(*e.args[0], s);
          return l.truthy() ? eval(*e.args[1], s) : l;
        }
        if (e.name == "or") {
          Value l = eval(*e.args[0], s);
          return l.truthy() ? l : eval(*e.args[1], s);
        }
        return binary(e.name, eval(*e.args[0], s), eval(*e.args[1], s));
      }
      case Expr::kTernary:
        return eval(*e.args[0], s).truthy() ? eval(*e.args[1], s) : eval(*e.args[2], s);
    }
    return Value();
  }
};

}  // namespace

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

StatusOr<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  try {
    auto impl = std::make_shared<Impl>();
    impl->body = Parser(lex(source)).parse_template();
    ChatTemplate t;
    t.impl_ = std::move(impl);
    return t;
  } catch (const Error& e) {
    return invalid_argument(std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template: ") + e.what());
  }
}

StatusOr<std::string> ChatTemplate::render(const Json& context) const {
  return render(context, std::time(nullptr));
}

StatusOr<std::string> ChatTemplate::render(const Json& context, std::time_t now) const {
  if (!impl_) return failed_precondition("chat template: not parsed");
  try {
    Scope globals(nullptr);
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) globals.set(k, from_json(v));
    }
    Scope top(&globals);
    Interpreter in(now);
    return in.run(impl_->body, top);
  } catch (const Error& e) {
    return invalid_argument(e.what());
  } catch (const BreakSignal&) {
    return invalid_argument("break outside a loop");
  } catch (const ContinueSignal&) {
    return invalid_argument("continue outside a loop");
  } catch (const std::exception& e) {
    return invalid_argument(e.what());
  }
}

namespace {
std::string token_text(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}
}  // namespace

StatusOr<ChatTemplateConfig> read_chat_template_config(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  ChatTemplateConfig c;
  if (j.contains("bos_token")) c.bos_token = token_text(j["bos_token"]);
  if (j.contains("eos_token")) c.eos_token = token_text(j["eos_token"]);
  // A chat_template.jinja beside it wins, as transformers loads it (the
  // published gpt-oss directories keep their template there).
  const std::string file = model_dir + "/chat_template.jinja";
  if (std::ifstream f(file); f.good()) {
    c.source.assign(std::istreambuf_iterator<char>(f), {});
    if (f.bad()) return not_found(file + ": cannot be read");
    return c;
  }
  if (!j.contains("chat_template") || j["chat_template"].is_null()) {
    return not_found(path + ": no chat_template");
  }
  const Json& t = j["chat_template"];
  if (t.is_string()) {
    c.source = t.get<std::string>();
  } else if (t.is_array()) {
    for (const auto& e : t) {
      if (e.is_object() && e.contains("name") && e["name"] == "default" &&
          e.contains("template") && e["template"].is_string()) {
        c.source = e["template"].get<std::string>();
      }
    }
    if (c.source.empty()) return invalid_argument(path + ": chat_template has no 'default' entry");
  } else {
    return invalid_argument(path + ": chat_template must be a string or a list");
  }
  return c;
}

}  // namespace msinfer::server
