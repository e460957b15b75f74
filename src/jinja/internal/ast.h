// The syntax tree the parser builds and the interpreter runs. Immutable
// once parsed: a parsed template is shared by every thread that renders it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.h"

namespace msinfer::jinja {

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

}  // namespace msinfer::jinja
