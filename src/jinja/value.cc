// Values: conversions from JSON and to text and JSON as the reference
// renderer writes them, its loose equality, and JavaScript's whitespace.
#include "internal/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace msinfer::jinja {

Budget::Budget(int64_t max_steps, size_t max_bytes, std::chrono::steady_clock::time_point deadline)
    // At most 2^62 (no limit in practice), so that the counts below never
    // pass int64.
    : max_steps_(std::min<int64_t>(max_steps, int64_t{1} << 62)),
      max_bytes_(max_bytes),
      deadline_(deadline) {
  next_check_ = std::min(max_steps_ + 1, kStepsPerClockRead);
}

void Budget::check() {
  if (steps_ > max_steps_) {
    throw LimitError("the template ran past its step limit (" + std::to_string(max_steps_) +
                         " steps: statements, expressions, loop iterations, calls, copies)",
                     false);
  }
  if (deadline_ != std::chrono::steady_clock::time_point::max() &&
      std::chrono::steady_clock::now() >= deadline_) {
    throw LimitError("the template was still rendering at its deadline (after " +
                         std::to_string(steps_) + " steps)",
                     true);
  }
  next_check_ = std::min(max_steps_ + 1, steps_ + kStepsPerClockRead);
}

void Budget::too_large(const char* what) const {
  throw LimitError(
      std::string(what) + " passed the size limit (" + std::to_string(max_bytes_) + " bytes)",
      false);
}

size_t list_bytes(const Array& a) {
  size_t n = 0;
  for (const Value& v : a) n += item_bytes(v);
  return n;
}

namespace {

// The lists and mappings whose last owner is gone, still to be freed: while
// one is being freed, those it held wait here instead of being freed inside
// it. Set on this thread while Value::release() frees.
struct Unowned {
  std::vector<std::shared_ptr<Array>> arrays;
  std::vector<std::shared_ptr<Object>> objects;
};
thread_local Unowned* unowned = nullptr;

}  // namespace

void Value::release() noexcept {
  Unowned* pending = unowned;
  Unowned mine;
  if (pending == nullptr) pending = &mine;
  // Only this Value holds them (render-local values, one thread): move them
  // out before its members are destroyed. Shared ones are only let go.
  if (a && a.use_count() == 1) pending->arrays.push_back(std::move(a));
  if (o && o.use_count() == 1) pending->objects.push_back(std::move(o));
  if (pending != &mine) return;  // an outer release() frees them
  unowned = &mine;
  while (!mine.arrays.empty() || !mine.objects.empty()) {
    if (!mine.arrays.empty()) {
      std::shared_ptr<Array> x = std::move(mine.arrays.back());
      mine.arrays.pop_back();
      x.reset();  // its items' containers join the lists above
    } else {
      std::shared_ptr<Object> x = std::move(mine.objects.back());
      mine.objects.pop_back();
      x.reset();
    }
  }
  unowned = nullptr;
}

Value* Object::find(const std::string& k) {
  for (auto& [key, v] : items) {
    if (key == k) return &v;
  }
  return nullptr;
}

Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::null();
    case Json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned:  // past INT64_MAX: a double
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Value::number(static_cast<double>(j.get<uint64_t>()));
      }
      return Value::integer(j.get<int64_t>());
    case Json::value_t::number_float: {
      // The reference makes a whole number an integer (Number.isInteger):
      // a context's 3.0 prints "3", as there.
      const double d = j.get<double>();
      return std::trunc(d) == d ? integer_or_number(d) : Value::number(d);
    }
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

Value integer_or_number(double d) {
  // [-2^63, 2^63): int64's range, both ends exact as doubles.
  if (d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
    return Value::integer(static_cast<int64_t>(d));
  }
  return Value::number(d);
}

std::string js_number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return "0";  // and -0, as JavaScript writes it
  // The shortest digits that read back as d, and their decimal exponent.
  char b[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(b, sizeof(b), "%.*e", p - 1, d);
    if (std::strtod(b, nullptr) == d) break;
  }
  std::string digits;
  const char* c = b;
  const bool negative = *c == '-';
  if (negative) ++c;
  for (; *c != 'e'; ++c) {
    if (*c != '.') digits += *c;
  }
  const int k = static_cast<int>(digits.size());
  const int n = std::atoi(c + 1) + 1;  // d = 0.digits x 10^n
  // ECMAScript's Number::toString: plain digits below 1e21 and down to 1e-6,
  // else d.ddde+x.
  std::string out = negative ? "-" : "";
  if (k <= n && n <= 21) {
    out += digits + std::string(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 < 0 ? "e-" : "e+") + std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string json_string(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// A value that is not a list as text.
std::string to_text(const Value& v) {
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
      // The reference: a whole number as toFixed(1) writes it ("3.0"; past
      // 1e21 as toString), any other as toString.
      if (v.f == 0) return "0.0";  // -0 too
      if (std::fmod(v.f, 1.0) == 0 && std::fabs(v.f) < 1e21) {
        char b[400];
        std::snprintf(b, sizeof(b), "%.1f", v.f);
        return b;
      }
      return js_number(v.f);
    case Value::kString:
      return v.s;
    case Value::kArray:
      throw Error("to_text of a list");  // to_string() prints lists
    case Value::kObject:
      return "[object Map]";
    case Value::kFunction:
      return "[function]";
  }
  return "";
}

[[noreturn]] void too_deep() {
  throw LimitError("a value nested more than " + std::to_string(kMaxPrintDepth) +
                       " lists or mappings deep (or holding itself) cannot be printed",
                   false);
}

// tojson of v, at `depth` lists and mappings deep, appended to *out.
void append_json(const Value& v, int indent, int depth, Budget& b, std::string* out) {
  b.step();
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNull:
      *out += "null";
      break;
    case Value::kBool:
      *out += v.b ? "true" : "false";
      break;
    case Value::kInt:
      *out += std::to_string(v.i);
      break;
    case Value::kFloat:
      *out += js_number(v.f);
      break;
    case Value::kString:
      b.copied(v.s.size());
      *out += json_string(v.s);
      break;
    case Value::kArray:
    case Value::kObject: {
      if (depth >= kMaxPrintDepth) too_deep();
      const size_t ind = indent > 0 ? static_cast<size_t>(indent) : 0;
      b.size(ind * static_cast<size_t>(depth + 1) + 1, "a string the template built");
      const std::string base = "\n" + std::string(ind * static_cast<size_t>(depth), ' ');
      const std::string child = base + std::string(ind, ' ');
      if (v.kind == Value::kArray) {
        *out += '[';
        if (ind > 0) *out += child;
        for (size_t i = 0; i < v.a->size(); ++i) {
          if (i > 0) *out += ind > 0 ? "," + child : ", ";
          append_json((*v.a)[i], indent, depth + 1, b, out);
        }
        if (ind > 0) *out += base;
        *out += ']';
      } else {
        *out += '{';
        for (size_t i = 0; i < v.o->items.size(); ++i) {
          const auto& [k, e] = v.o->items[i];
          if (i > 0) *out += ind > 0 ? "," : ", ";
          if (ind > 0) *out += child;
          *out += '"';
          *out += k;
          *out += "\": ";
          append_json(e, indent, depth + 1, b, out);
        }
        if (ind > 0) *out += base;
        *out += '}';
      }
      break;
    }
    case Value::kFunction:
      throw Error("cannot convert a function to JSON");
  }
  b.size(out->size(), "a string the template built");
}

// to_string of v, at `depth` lists deep, appended to *out.
void append_text(const Value& v, int depth, Budget& b, std::string* out) {
  b.step();
  if (v.kind != Value::kArray) {
    b.copied(v.s.size());
    *out += to_text(v);
  } else {
    if (depth >= kMaxPrintDepth) too_deep();
    for (size_t i = 0; i < v.a->size(); ++i) {
      if (i > 0) *out += ',';
      append_text((*v.a)[i], depth + 1, b, out);
    }
  }
  b.size(out->size(), "a string the template built");
}

}  // namespace

// tojson as the reference writes it: ", " and ": " separators, or indented.
std::string to_json(const Value& v, int indent, Budget& budget) {
  std::string out;
  append_json(v, indent, 0, budget, &out);
  return out;
}

std::string to_string(const Value& v, Budget& budget) {
  if (v.kind == Value::kString) {  // the common case: no recursion, no copy to charge twice
    budget.copied(v.s.size());
    return v.s;
  }
  std::string out;
  append_text(v, 0, budget, &out);
  return out;
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

namespace {

// The length of the character at s[i] (1 for a byte that starts none).
size_t character_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 1;
  }
  return n;
}

}  // namespace

std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = character_at(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t character_count(const std::string& s) {
  size_t count = 0;
  for (size_t i = 0; i < s.size(); ++count) {
    i += static_cast<unsigned char>(s[i]) < 0x80 ? 1 : character_at(s, i);
  }
  return count;
}

size_t next_character(const std::string& s, size_t i) {
  return i + (static_cast<unsigned char>(s[i]) < 0x80 ? 1 : character_at(s, i));
}

size_t previous_character(const std::string& s, size_t e) {
  // Every byte that is not a continuation byte (10xxxxxx) starts a character
  // (none before it can take it in), so the character that ends at e starts
  // at the nearest such byte within 4 bytes if that one's character ends at
  // e, else it is the last byte alone.
  auto continuation = [&](size_t i) { return (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80; };
  const size_t last = e - 1;
  if (!continuation(last)) return last;
  for (size_t q = last; q > 0 && last - q < 3;) {
    --q;
    if (!continuation(q)) return q + character_at(s, q) == e ? q : last;
  }
  return last;
}

std::pair<size_t, size_t> character_span(const std::string& s, int64_t k) {
  constexpr std::pair<size_t, size_t> kNone{std::string::npos, 0};
  if (k >= 0) {
    size_t i = 0;
    for (; k > 0 && i < s.size(); --k) i = next_character(s, i);
    if (i >= s.size()) return kNone;
    return {i, next_character(s, i) - i};
  }
  size_t e = s.size();
  for (; k < -1 && e > 0; ++k) e = previous_character(s, e);
  if (e == 0) return kNone;
  const size_t b = previous_character(s, e);
  return {b, e - b};
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

}  // namespace msinfer::jinja
