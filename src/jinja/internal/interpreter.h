// The interpreter: runs a parsed template over a scope of values. One
// Interpreter renders one template once, on one thread (it counts macro
// depth, and charges its work and the values it builds to its Budget); the
// syntax tree it reads is shared and never written. Its operations are spread over files by job:
// statements and expressions (interpreter.cc), attributes, methods and global functions
// (methods.cc), filters and tests (filters.cc).
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ast.h"
#include "value.h"

namespace msinfer::jinja {

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
  Interpreter(std::time_t now, Budget budget) : now_(now), budget_(budget) {}
  // Empties the mappings whose attributes the template set: one can hold
  // itself (ns.me = ns, or through a list), a cycle that would outlive the
  // render. Destroy it before the scopes of the render.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  // The text of `b` (a template, a macro's body, a block set's).
  std::string run(const Body& b, Scope& s) {
    std::string out;
    exec(b, s, out);
    return out;
  }
  Budget& budget() { return budget_; }
  // A list the template built, checked against the size limit.
  Value list(Array a) {
    budget_.size(list_bytes(a), "a list the template built");
    return Value::array(std::move(a));
  }

  // Statements (interpreter.cc).
  void exec(const Body& body, Scope& s, std::string& out);
  void exec(const Stmt& st, Scope& s, std::string& out);
  void exec_for(const Stmt& st, Scope& s, std::string& out);
  // Expressions (interpreter.cc).
  Value eval(const Expr& e, Scope& s);
  Value binary(const std::string& op, const Value& l, const Value& r);
  Value slice(const Value& x, const Expr& e, Scope& s);
  // obj.key: an item of a mapping, a string's or a mapping's method, a
  // length (methods.cc).
  Value member(const Value& obj, const std::string& key);
  Value method(const Value& self, const std::string& m);
  Value call_global(const std::string& n, const Args& a, const Kwargs& kw);
  // x | f(a, kw) and x is t(a) (filters.cc): the filter table, the tests.
  Value filter(const std::string& f, const Value& x, const Args& a, const Kwargs& kw);
  bool test(const std::string& t, const Value& x, const Args& a);

 private:
  // What a loop iteration and a macro call cost, in steps: each makes a
  // scope, and an iteration its `loop` object, several times the work of
  // evaluating an expression (about 250 ns against 30 ns).
  static constexpr int64_t kIterationSteps = 8;
  static constexpr int64_t kCallSteps = 8;

  // Text appended to a render's output (the template's, a macro's, a block
  // set's), within the size limit.
  void append(std::string& out, const std::string& text);
  Value eval_node(const Expr& e, Scope& s);
  // l ~ r, and + of a string: both as text, within the size limit.
  Value concatenate(const Value& l, const Value& r);

  std::time_t now_;  // what strftime_now() formats
  Budget budget_;
  int calls_ = 0;
  std::vector<std::weak_ptr<Object>> assigned_;  // the mappings ~Interpreter empties

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
};

}  // namespace msinfer::jinja
