// The filters (x | f(args)), one function each, found by name in one table,
// and the tests (x is t). A filter that is given the wrong kind of value
// names itself as the template wrote it (an alias: "count", "d").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "internal/interpreter.h"

namespace msinfer::jinja {
namespace {

// One filter's call: the name it was called by, the value it filters and
// its arguments.
struct FilterCall {
  Interpreter& in;
  const std::string& f;
  const Value& x;
  const Args& a;
  const Kwargs& kw;
  void need(Value::Kind k, const char* what) const {
    if (x.kind != k) throw Error("filter " + f + " needs " + what);
  }
};
using Filter = Value (*)(const FilterCall&);

Value length(const FilterCall& c) {
  const Value& x = c.x;
  if (x.kind == Value::kString) return Value::integer(static_cast<int64_t>(character_count(x.s)));
  if (x.kind == Value::kArray) return Value::integer(static_cast<int64_t>(x.a->size()));
  if (x.kind == Value::kObject) return Value::integer(static_cast<int64_t>(x.o->items.size()));
  throw Error("filter length needs a string, list or mapping");
}

Value tojson(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  int indent = 0;
  for (const auto& [k, v] : kw) {
    if (k == "indent" && v.kind == Value::kInt) indent = static_cast<int>(v.i);
  }
  if (!a.empty() && a[0].kind == Value::kInt) indent = static_cast<int>(a[0].i);
  return Value::str(to_json(x, indent, in.budget()));
}

Value string(const FilterCall& c) { return Value::str(to_string(c.x, c.in.budget())); }

Value trim(const FilterCall& c) {
  c.need(Value::kString, "a string");
  return Value::str(trim_end(trim_start(c.x.s)));
}

// upper, lower, title, capitalize: the string method of the same name.
Value string_method(const FilterCall& c) {
  c.need(Value::kString, "a string");
  return c.in.member(c.x, c.f).fn->call({}, {});
}

Value default_value(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  const bool boolean = (a.size() > 1 && a[1].truthy());
  if (x.kind == Value::kUndefined || (boolean && !x.truthy()))
    return a.empty() ? Value::str("") : a[0];
  return x;
}

Value first_or_last(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  if (x.kind == Value::kArray) {
    if (x.a->empty()) return Value();
    return f == "first" ? x.a->front() : x.a->back();
  }
  if (x.kind == Value::kString) {
    if (x.s.empty()) return Value();
    const auto [at, len] = character_span(x.s, f == "first" ? 0 : -1);
    return Value::str(x.s.substr(at, len));
  }
  throw Error("filter " + f + " needs a list or a string");
}

Value list(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  if (x.kind == Value::kArray) return x;
  if (x.kind == Value::kObject) return in.member(x, "keys").fn->call({}, {});
  if (x.kind == Value::kString) {
    const size_t n = character_count(x.s);
    in.budget().size(n * sizeof(Value) + x.s.size(), "a list the template built");
    in.budget().copied(n * sizeof(Value));
    Array out;
    out.reserve(n);
    for (size_t i = 0; i < x.s.size();) {
      const size_t next = next_character(x.s, i);
      out.push_back(Value::str(x.s.substr(i, next - i)));
      i = next;
    }
    return Value::array(std::move(out));
  }
  throw Error("filter list needs an iterable");
}

Value reverse(const FilterCall& c) {
  const Value& x = c.x;
  if (x.kind == Value::kString) {
    std::string r;
    r.reserve(x.s.size());
    for (size_t e = x.s.size(); e > 0;) {
      const size_t b = previous_character(x.s, e);
      r.append(x.s, b, e - b);
      e = b;
    }
    return Value::str(std::move(r));
  }
  c.need(Value::kArray, "a list");
  Array r(x.a->rbegin(), x.a->rend());
  return Value::array(std::move(r));
}

Value join(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  c.need(Value::kArray, "a list");
  Budget& b = in.budget();
  const std::string sep = a.empty() ? "" : to_string(a[0], b);
  std::string r;
  for (size_t i = 0; i < x.a->size(); ++i) {
    const std::string item = to_string((*x.a)[i], b);
    b.size(r.size() + (i ? sep.size() : 0) + item.size(), "a string the template built");
    b.copied(sep.size());
    if (i) r += sep;
    r += item;
  }
  return Value::str(std::move(r));
}

Value to_int(const FilterCall& c) {
  const Value& x = c.x;
  if (x.kind == Value::kInt) return x;
  if (x.kind == Value::kFloat) return integer_or_number(std::trunc(x.f));
  if (x.kind == Value::kString) return Value::integer(std::strtoll(x.s.c_str(), nullptr, 10));
  return Value::integer(0);
}

Value to_float(const FilterCall& c) {
  const Value& x = c.x;
  if (x.is_number()) return Value::number(x.num());
  if (x.kind == Value::kString) return Value::number(std::strtod(x.s.c_str(), nullptr));
  return Value::number(0);
}

Value abs(const FilterCall& c) {
  const Value& x = c.x;
  if (x.kind == Value::kInt) {  // -INT64_MIN is past int64
    if (x.i == INT64_MIN) return Value::number(9223372036854775808.0);
    return Value::integer(x.i < 0 ? -x.i : x.i);
  }
  if (x.kind == Value::kFloat) return Value::number(std::fabs(x.f));
  throw Error("filter abs needs a number");
}

Value items(const FilterCall& c) { return c.in.member(c.x, "items").fn->call({}, {}); }

Value unique(const FilterCall& c) {
  const Value& x = c.x;
  c.need(Value::kArray, "a list");
  Array out;
  for (const auto& v : *x.a) {
    c.in.budget().step(static_cast<int64_t>(out.size()) + 1);  // the comparisons
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, v); }))
      out.push_back(v);
  }
  return Value::array(std::move(out));
}

// selectattr, rejectattr, map, select, reject.
Value select_or_map(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  c.need(Value::kArray, "a list");
  Budget& b = in.budget();
  Array out;
  size_t bytes = 0;  // map's items are new values: the list is checked as it grows
  for (const auto& v : *x.a) {
    b.step();
    if (f == "map") {
      std::string attr;
      for (const auto& [k, kv] : kw) {
        if (k == "attribute") attr = to_string(kv, b);
      }
      if (!attr.empty()) {
        out.push_back(v.kind == Value::kObject ? in.member(v, attr) : Value());
      } else if (!a.empty()) {
        Args rest(a.begin() + 1, a.end());
        out.push_back(in.filter(to_string(a[0], b), v, rest, {}));
      } else {
        continue;
      }
      bytes += item_bytes(out.back());
      b.size(bytes, "a list the template built");
      b.copied(out.back().s.size());
      continue;
    }
    Value subject = v;
    size_t ti = 0;
    if (f == "selectattr" || f == "rejectattr") {
      if (a.empty()) throw Error("filter " + f + " needs an attribute");
      subject = v.kind == Value::kObject ? in.member(v, to_string(a[0], b)) : Value();
      ti = 1;
    }
    bool keep = subject.truthy();
    if (a.size() > ti) {
      keep = in.test(to_string(a[ti], b), subject, Args(a.begin() + ti + 1, a.end()));
    }
    if (f == "rejectattr" || f == "reject") keep = !keep;
    if (keep) out.push_back(v);
  }
  return Value::array(std::move(out));
}

Value indent(const FilterCall& c) {
  const auto& [in, f, x, a, kw] = c;
  c.need(Value::kString, "a string");
  int64_t width = a.empty() ? 4 : a[0].i;
  bool first = a.size() > 1 && a[1].truthy();
  for (const auto& [k, kv] : kw) {
    if (k == "width") width = kv.i;
    if (k == "first") first = kv.truthy();
  }
  const size_t pad_bytes = static_cast<size_t>(std::max<int64_t>(0, width));
  in.budget().size(pad_bytes, "a string the template built");
  const std::string pad(pad_bytes, ' ');
  std::string r;
  size_t p = 0;
  bool line_start = true;
  bool is_first = true;
  while (p <= x.s.size()) {
    const size_t nl = x.s.find('\n', p);
    const std::string ln = x.s.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
    const bool padded = line_start && ((is_first && first) || (!is_first && !ln.empty()));
    in.budget().size(r.size() + (padded ? pad.size() : 0) + ln.size() + 1,
                     "a string the template built");
    in.budget().copied((padded ? pad.size() : 0) + ln.size());
    if (padded) r += pad;
    r += ln;
    is_first = false;
    if (nl == std::string::npos) break;
    r += "\n";
    p = nl + 1;
  }
  return Value::str(r);
}

Value replace(const FilterCall& c) {
  c.need(Value::kString, "a string");
  return c.in.member(c.x, "replace").fn->call(c.a, c.kw);
}

Value sort(const FilterCall& c) {
  c.need(Value::kArray, "a list");
  Budget& b = c.in.budget();
  b.copied(list_bytes(*c.x.a));
  Array r = *c.x.a;
  // A comparison that throws (past the budget) leaves r, a copy, unsorted.
  std::stable_sort(r.begin(), r.end(), [&b](const Value& p, const Value& q) {
    b.step();
    if (p.is_number() && q.is_number()) return p.num() < q.num();
    return to_string(p, b) < to_string(q, b);
  });
  return Value::array(std::move(r));
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> kFilters = {
      {"length", length},
      {"count", length},
      {"tojson", tojson},
      {"string", string},
      {"trim", trim},
      {"upper", string_method},
      {"lower", string_method},
      {"title", string_method},
      {"capitalize", string_method},
      {"default", default_value},
      {"d", default_value},
      {"first", first_or_last},
      {"last", first_or_last},
      {"list", list},
      {"reverse", reverse},
      {"join", join},
      {"int", to_int},
      {"float", to_float},
      {"abs", abs},
      {"items", items},
      {"unique", unique},
      {"selectattr", select_or_map},
      {"rejectattr", select_or_map},
      {"map", select_or_map},
      {"select", select_or_map},
      {"reject", select_or_map},
      {"indent", indent},
      {"replace", replace},
      {"sort", sort},
  };
  return kFilters;
}

}  // namespace

Value Interpreter::filter(const std::string& f, const Value& x, const Args& a, const Kwargs& kw) {
  const auto& table = filters();
  const auto it = table.find(f);
  if (it == table.end()) throw Error("unknown filter '" + f + "'");
  return it->second(FilterCall{*this, f, x, a, kw});
}

bool Interpreter::test(const std::string& t, const Value& x, const Args& a) {
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
}  // namespace msinfer::jinja
