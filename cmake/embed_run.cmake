# Script mode: writes OUTPUT, a header with INPUT's text as a raw string literal.
file(READ ${INPUT} content)
string(FIND "${content}" ")msinfer_embed\"" bad)
if(NOT bad EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter")
endif()
file(WRITE ${OUTPUT} "// Generated from ${INPUT}; do not edit.\n#pragma once\n#include <string_view>\n"
  "namespace msinfer::embedded {\ninline constexpr std::string_view ${SYMBOL} = R\"msinfer_embed(${content})msinfer_embed\";\n}\n")
