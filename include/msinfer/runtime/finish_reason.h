// Why a sequence ended (TokenEvent::finish_reason): eos (an EOS token), stop
// (a stop_token_ids token; the server's stop strings end a request there
// too), length (max_tokens), error (the deployment lost the request,
// TokenEvent::error says why). The names are the control protocol's.
#pragma once

#include <string>

#include "msinfer/core/status.h"

namespace msinfer::runtime {

enum class FinishReason { kNone, kEos, kStop, kLength, kError };

inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

inline StatusOr<FinishReason> parse_finish_reason(const std::string& s) {
  for (FinishReason r : {FinishReason::kNone, FinishReason::kEos, FinishReason::kStop,
                         FinishReason::kLength, FinishReason::kError}) {
    if (s == finish_reason_name(r)) return r;
  }
  return invalid_argument("unknown finish reason '" + s + "'");
}

}  // namespace msinfer::runtime
