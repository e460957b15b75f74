// Attribute access and the methods of strings and mappings (startswith,
// split, strip, get, items, ...), and the global functions (range,
// namespace, raise_exception, strftime_now).
#include <cstdint>
#include <ctime>
#include <memory>
#include <utility>

#include "internal/interpreter.h"

namespace msinfer::jinja {

Value Interpreter::member(const Value& obj, const std::string& key) {
  if (obj.kind == Value::kObject) {
    if (Value* v = obj.o->find(key)) return *v;
    static const char* kMethods[] = {"get", "items", "keys", "values"};
    for (const char* m : kMethods) {
      if (key == m) return method(obj, key);
    }
    return Value();
  }
  if (obj.kind == Value::kString) {
    if (key == "length") return Value::integer(static_cast<int64_t>(character_count(obj.s)));
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

Value Interpreter::method(const Value& self, const std::string& m) {
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
      fn->call = [this, self, m](const Args&, const Kwargs&) {
        Array out;
        for (const auto& [k, x] : self.o->items) {
          if (m == "items") out.push_back(Value::array({Value::str(k), x}));
          if (m == "keys") out.push_back(Value::str(k));
          if (m == "values") out.push_back(x);
        }
        budget_.copied(list_bytes(out));
        return list(std::move(out));
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
    fn->call = [this, s](const Args& a, const Kwargs&) {
      // One item per piece: as many as the string has bytes, each a Value.
      Array out;
      size_t bytes = 0;
      auto add = [&](std::string piece) {
        bytes += sizeof(Value) + piece.size();
        budget_.size(bytes, "a list the template built");
        budget_.step();
        out.push_back(Value::str(std::move(piece)));
      };
      if (a.empty() || a[0].kind == Value::kNull) {
        std::istringstream in(s);
        std::string w;
        while (in >> w) add(std::move(w));
        return Value::array(std::move(out));
      }
      if (a[0].kind != Value::kString || a[0].s.empty())
        throw Error("split() needs a non-empty string");
      const std::string& sep = a[0].s;
      int64_t max = a.size() > 1 && a[1].kind == Value::kInt ? a[1].i : -1;
      size_t from = 0;
      for (;;) {
        const size_t at = s.find(sep, from);
        if (at == std::string::npos || (max >= 0 && static_cast<int64_t>(out.size()) >= max)) break;
        add(s.substr(from, at - from));
        from = at + sep.size();
      }
      add(s.substr(from));
      return Value::array(std::move(out));
    };
  } else if (m == "replace") {
    fn->call = [this, s](const Args& a, const Kwargs&) {
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
        budget_.size(r.size() + (at - p) + a[1].s.size(), "a string the template built");
        budget_.copied(at - p + a[1].s.size());
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

Value Interpreter::call_global(const std::string& n, const Args& a, const Kwargs& kw) {
  if (n == "raise_exception") {
    throw Error(a.empty() ? "raise_exception()" : to_string(a[0], budget_));
  }
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
    // ceil((stop - start) / step) items, in unsigned arithmetic: the span
    // of two int64s may be past int64.
    uint64_t count = 0;
    if (step > 0 ? start < stop : start > stop) {
      const uint64_t span = step > 0 ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                                     : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
      const uint64_t stride =
          step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
      count = (span - 1) / stride + 1;
    }
    budget_.size(count > budget_.max_bytes() / sizeof(Value) ? SIZE_MAX : count * sizeof(Value),
                 "a list the template built");
    budget_.step(static_cast<int64_t>(count));
    Array out;
    out.reserve(count);
    int64_t i = start;
    for (uint64_t k = 0; k < count; ++k) {
      out.push_back(Value::integer(i));
      if (k + 1 < count) i += step;  // the last item is within int64; so is each before it
    }
    return Value::array(std::move(out));
  }
  throw Error("unknown function '" + n + "'");
}

}  // namespace msinfer::jinja
