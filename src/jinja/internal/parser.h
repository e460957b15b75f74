// The parser: tokens to a syntax tree. Throws Error naming the line of a
// syntax error.
#pragma once

#include <vector>

#include "ast.h"
#include "lexer.h"

namespace msinfer::jinja {

Body parse_template(std::vector<Token> tokens);

}  // namespace msinfer::jinja
