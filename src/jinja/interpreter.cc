// The interpreter's statements (output, if, for, set, macro, break,
// continue) and expressions (names, literals, items, slices, calls,
// operators), with the reference renderer's semantics.
#include "internal/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

namespace msinfer::jinja {

Interpreter::~Interpreter() {
  for (const auto& w : assigned_) {
    if (std::shared_ptr<Object> o = w.lock()) o->items.clear();
  }
}

void Interpreter::exec(const Body& body, Scope& s, std::string& out) {
  for (const auto& st : body) exec(*st, s, out);
}

void Interpreter::append(std::string& out, const std::string& text) {
  budget_.size(out.size() + text.size(), "the rendered text");
  budget_.copied(text.size());
  out += text;
}

void Interpreter::exec(const Stmt& st, Scope& s, std::string& out) {
  budget_.step();
  switch (st.kind) {
    case Stmt::kText:
      append(out, st.text);
      return;
    case Stmt::kOutput: {
      Value v = eval(*st.expr, s);
      if (v.kind != Value::kNull && v.kind != Value::kUndefined) {
        append(out, v.kind == Value::kString ? v.s : to_string(v, budget_));
      }
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
        if (!obj.o->assigned) {
          obj.o->assigned = true;
          assigned_.push_back(obj.o);
        }
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
        budget_.step(kCallSteps);
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

void Interpreter::exec_for(const Stmt& st, Scope& s, std::string& out) {
  Value it = eval(*st.expr, s);
  // The items, copied (a loop's body may rebind what it loops over).
  Array items;
  if (it.kind == Value::kArray) {
    budget_.copied(list_bytes(*it.a));
    items = *it.a;
  } else if (it.kind == Value::kObject) {
    budget_.step(static_cast<int64_t>(it.o->items.size()));
    for (const auto& [k, v] : it.o->items) items.push_back(Value::str(k));
  } else if (it.kind == Value::kString) {
    // A character each: a list of that many strings.
    const size_t n = character_count(it.s);
    budget_.size(n * sizeof(Value) + it.s.size(), "a list the template built");
    budget_.copied(n * sizeof(Value));
    items.reserve(n);
    for (size_t i = 0; i < it.s.size();) {
      const size_t next = next_character(it.s, i);
      items.push_back(Value::str(it.s.substr(i, next - i)));
      i = next;
    }
  } else {
    throw Error("cannot loop over " + to_string(it, budget_));
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
    budget_.step(kIterationSteps);
    Scope body(&s);
    Value loop = Value::object();
    auto& L = loop.o->items;
    L.reserve(9);
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

Value Interpreter::eval(const Expr& e, Scope& s) {
  budget_.step();
  Value v = eval_node(e, s);
  // A string is copied wherever it goes (a name's value, a member, a result).
  if (v.kind == Value::kString) budget_.copied(v.s.size());
  return v;
}

Value Interpreter::eval_node(const Expr& e, Scope& s) {
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
      return list(std::move(a));
    }
    case Expr::kDict: {
      Value d = Value::object();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], s);
        d.o->items.emplace_back(to_string(k, budget_), eval(*e.args[i + 1], s));
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
        const auto [at, len] = character_span(x.s, k.i);
        if (at == std::string::npos) return Value();
        return Value::str(x.s.substr(at, len));
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
      if (x.kind == Value::kInt) {  // -INT64_MIN is past int64
        return x.i == INT64_MIN ? Value::number(9223372036854775808.0) : Value::integer(-x.i);
      }
      return Value::number(-x.f);
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

Value Interpreter::concatenate(const Value& l, const Value& r) {
  std::string text = to_string(l, budget_);
  const std::string right = to_string(r, budget_);
  budget_.size(text.size() + right.size(), "a string the template built");
  text += right;
  return Value::str(std::move(text));
}

Value Interpreter::binary(const std::string& op, const Value& l, const Value& r) {
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
  if (op == "~") return concatenate(l, r);
  if (l.is_number() && r.is_number()) {
    const bool fl = l.kind == Value::kFloat || r.kind == Value::kFloat;
    const double a = l.num(), b = r.num();
    // Integers that overflow int64 go on as doubles (integer_or_number).
    int64_t v = 0;
    if (op == "+") {
      if (!fl && !__builtin_add_overflow(l.i, r.i, &v)) return Value::integer(v);
      return Value::number(a + b);
    }
    if (op == "-") {
      if (!fl && !__builtin_sub_overflow(l.i, r.i, &v)) return Value::integer(v);
      return Value::number(a - b);
    }
    if (op == "*") {
      if (!fl && !__builtin_mul_overflow(l.i, r.i, &v)) return Value::integer(v);
      return Value::number(a * b);
    }
    if (op == "/") {
      return Value::number(a / b);
    }
    if (op == "//") {
      if (b == 0) throw Error("division by zero");
      if (fl) return Value::number(std::floor(a / b));
      if (l.i == INT64_MIN && r.i == -1) return Value::number(9223372036854775808.0);
      int64_t q = l.i / r.i;  // rounded toward zero; floor it
      if (l.i % r.i != 0 && (l.i < 0) != (r.i < 0)) --q;
      return Value::integer(q);
    }
    if (op == "%") {
      if (!fl) {
        if (r.i == 0) throw Error("modulo by zero");
        if (r.i == -1) return Value::integer(0);  // INT64_MIN % -1 overflows
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
    const size_t bytes = list_bytes(*l.a) + list_bytes(*r.a);
    budget_.size(bytes, "a list the template built");
    budget_.copied(bytes);
    Array c = *l.a;
    c.insert(c.end(), r.a->begin(), r.a->end());
    return Value::array(std::move(c));
  }
  if ((l.kind == Value::kString || r.kind == Value::kString) && op == "+") {
    return concatenate(l, r);
  }
  if (l.kind == Value::kString && r.kind == Value::kString) {
    if (op == "<") return Value::boolean(l.s < r.s);
    if (op == ">") return Value::boolean(l.s > r.s);
    if (op == "<=") return Value::boolean(l.s <= r.s);
    if (op == ">=") return Value::boolean(l.s >= r.s);
  }
  if (l.kind == Value::kString && r.kind == Value::kInt && op == "*") {
    if (r.i <= 0 || l.s.empty()) return Value::str("");
    const uint64_t times = static_cast<uint64_t>(r.i);
    const size_t bytes = times > budget_.max_bytes() / l.s.size() ? SIZE_MAX : l.s.size() * times;
    budget_.size(bytes, "a string the template built");
    budget_.copied(bytes);
    std::string s;
    s.reserve(bytes);
    for (uint64_t i = 0; i < times; ++i) s += l.s;
    return Value::str(std::move(s));
  }
  throw Error("unsupported operation " + op);
}

Value Interpreter::slice(const Value& x, const Expr& e, Scope& s) {
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
    n = static_cast<int64_t>(character_count(x.s));
  } else {
    throw Error("only lists and strings can be sliced");
  }
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v < 0 ? *v + n : *v;
    return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), en = clamp(stop, step > 0 ? n : -1);
  // The indices b, b + step, ... before en; none past int64 (b and en lie
  // in [-1, n], so a step that large ends the slice).
  auto advance = [&](int64_t i) -> std::optional<int64_t> {
    int64_t next;
    if (__builtin_add_overflow(i, step, &next) || (step > 0 ? next >= en : next <= en))
      return std::nullopt;
    return next;
  };
  if (step > 0 ? b >= en : b <= en) return x.kind == Value::kArray ? list({}) : Value::str("");
  if (x.kind == Value::kArray) {
    Array out;
    for (std::optional<int64_t> i = b; i; i = advance(*i)) out.push_back((*x.a)[*i]);
    return list(std::move(out));
  }
  // A string: its characters walked once, from character b, |step| at a time.
  const std::string& str = x.s;
  std::string out;
  size_t at = character_span(str, b).first;
  for (std::optional<int64_t> i = b;;) {
    out.append(str, at, next_character(str, at) - at);
    const std::optional<int64_t> next = advance(*i);
    if (!next) break;
    for (int64_t k = *i; k != *next; k += step > 0 ? 1 : -1) {
      at = step > 0 ? next_character(str, at) : previous_character(str, at);
    }
    i = next;
  }
  return Value::str(std::move(out));
}

}  // namespace msinfer::jinja
