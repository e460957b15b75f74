// The lexer: template source to tokens, after the reference's whitespace
// pre-pass (trim_blocks, lstrip_blocks, the '-' markers).
#pragma once

#include <string>
#include <vector>

namespace msinfer::jinja {

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
std::string preprocess(std::string t);
// Throws Error naming the line for a malformed template.
std::vector<Token> lex(const std::string& src_in);

}  // namespace msinfer::jinja
