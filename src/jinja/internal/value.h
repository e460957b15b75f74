// The values a template computes with, as the reference renderer
// (@huggingface/jinja) has them: undefined and none apart, integers and
// floats apart, lists and mappings shared by reference (a namespace()'s
// attributes are set in place), mappings in insertion order. Errors are
// thrown as jinja::Error inside the interpreter; Template turns them into
// Statuses at its boundary.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/core/json.h"

namespace msinfer::jinja {

struct Value;
using Array = std::vector<Value>;
struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  bool assigned = false;  // a template set one of its attributes (Interpreter)
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

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // Lists and mappings nest as deep as a template makes them (a list of a
  // list of ..., a chain of namespaces): their last owner frees them one
  // level at a time, never recursing as deep as they nest.
  ~Value() {
    if (a || o) release();
  }

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

 private:
  void release() noexcept;
};

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A render past one of its limits (RenderOptions): Template reports it as
// RESOURCE_EXHAUSTED, or DEADLINE_EXCEEDED when `deadline`.
struct LimitError : Error {
  LimitError(const std::string& what, bool past_deadline) : Error(what), deadline(past_deadline) {}
  bool deadline;
};

// What one render may still spend (RenderOptions' limits), charged as it
// goes: step() for work, size() for a value about to be built. Throws
// LimitError past a limit. One render's, used on its thread only.
class Budget {
 public:
  // One step per this many bytes copied into a value.
  static constexpr size_t kBytesPerStep = 64;
  // The clock is read once per this many steps (tens of microseconds).
  static constexpr int64_t kStepsPerClockRead = 4096;

  Budget(int64_t max_steps, size_t max_bytes, std::chrono::steady_clock::time_point deadline);
  // n units of work.
  void step(int64_t n = 1) {
    steps_ += n;
    if (steps_ >= next_check_) check();
  }
  // n bytes copied (a string looked up or built).
  void copied(size_t n) { step(static_cast<int64_t>(n / kBytesPerStep)); }
  // A value of n bytes is about to be built; `what` names it in the error
  // ("the rendered text", "a string the template built", ...).
  void size(size_t n, const char* what) const {
    if (n > max_bytes_) too_large(what);
  }
  size_t max_bytes() const { return max_bytes_; }
  int64_t steps() const { return steps_; }

 private:
  void check();
  [[noreturn]] void too_large(const char* what) const;

  int64_t steps_ = 0;
  int64_t max_steps_;
  int64_t next_check_;
  size_t max_bytes_;
  std::chrono::steady_clock::time_point deadline_;
};

// What a list holds, as size() counts it: its items, and the bytes of the
// strings among them (lists and mappings among them are shared, not copied).
size_t list_bytes(const Array& a);
inline size_t item_bytes(const Value& v) { return sizeof(Value) + v.s.size(); }

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Callable {
  std::function<Value(const Args&, const Kwargs&)> call;
};

// A template's globals from JSON (the render context).
Value from_json(const Json& j);
// A number as JavaScript's String(number) writes it.
std::string js_number(double d);
// A whole double as an integer where int64 holds it, else the double
// (beyond int64, and NaN and the infinities): integer arithmetic that
// overflows goes on in doubles, as the reference's numbers do.
Value integer_or_number(double d);

// A value as text, as the reference converts it (none: "null", a list:
// its items joined by ","); {{ }} prints none and undefined as nothing.
// Lists share their items, so a list nested n deep can print 2^n items:
// `budget` is charged for each item and bounds the text and the depth.
std::string to_string(const Value& v, Budget& budget);
// A JSON string literal, invalid UTF-8 replaced.
std::string json_string(const std::string& s);
// tojson as the reference writes it: ", " and ": " separators, or indented;
// charged to `budget` as to_string is (a namespace can hold itself).
std::string to_json(const Value& v, int indent, Budget& budget);
// The nesting of lists and mappings that to_string and to_json follow.
inline constexpr int kMaxPrintDepth = 256;
// The reference compares with JavaScript's loose equality (==): a boolean
// compares as 0/1, a string with a number as the number it spells ("" is 0),
// null equals undefined only.
double js_to_number(const Value& v);
bool equal(const Value& x, const Value& y);
// A string as a sequence, as Jinja (Python) sees it: its characters (code
// points), each as its UTF-8 bytes; a byte that starts no well-formed
// character is one of its own. Loops, indexing, slices, length, first,
// last, list and reverse over a string use these, so none splits a
// character.
std::vector<std::string> characters(const std::string& s);
// characters(s).size(), without making them. (characters() is the
// definition: the interpreter walks with the functions below, which the
// tests compare with it.)
size_t character_count(const std::string& s);
// The bytes of characters(s)[k] as {offset, length} (k < 0: counted from
// the end, as Python's s[k]), walking only as far as k from the end it
// starts at; {npos, 0} when there is no such character.
std::pair<size_t, size_t> character_span(const std::string& s, int64_t k);
// The byte after the character that starts at s[i] (i < s.size()), and the
// start of the character that ends at s[e] (0 < e, e the end of one): steps
// through characters(s) without making them.
size_t next_character(const std::string& s, size_t i);
size_t previous_character(const std::string& s, size_t e);

// JavaScript's String.prototype.trim whitespace, in UTF-8: the length of the
// whitespace character at s[i] (0: none).
size_t ws_len(const std::string& s, size_t i);
std::string trim_start(const std::string& s);
std::string trim_end(const std::string& s);

}  // namespace msinfer::jinja
