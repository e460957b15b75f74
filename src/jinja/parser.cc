// A recursive-descent parser of the Jinja subset (statements, then
// expressions by precedence: ternary, or, and, not, comparison, additive,
// ~, multiplicative, unary, tests, filters, postfix, primary).
#include "internal/parser.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

namespace msinfer::jinja {
namespace {

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

}  // namespace

Body parse_template(std::vector<Token> tokens) {
  return Parser(std::move(tokens)).parse_template();
}

}  // namespace msinfer::jinja
