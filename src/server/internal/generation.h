// One generation request in flight on a connection and its choices: what
// the answer's writer (http_generation.cc) keeps between rounds. Event-loop
// thread only.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/server/api.h"
#include "msinfer/server/harmony.h"

namespace msinfer::server {

// One sequence of a generation: choices[index] of the answer (with
// best_of > n, a candidate for one).
struct Choice {
  std::optional<TextStream> text;
  // A harmony chat (ApiRequest::harmony): splits the tokens by channel;
  // `text` then only looks for stop strings in the content.
  std::optional<HarmonyParser> harmony;
  std::string reasoning;  // non-streaming: the whole reasoning (harmony)
  int64_t completion_tokens = 0;
  double cumulative_logprob = 0;  // of its tokens (best_of ranks by it)
  std::string content;            // non-streaming: the whole text
  Json logprobs;                  // non-streaming: accumulated
  int64_t text_offset = 0;        // characters of the text before the next logprob token
  int32_t logprob_before = -1;    // the token before the next logprob token
  std::string finish;             // OpenAI's finish_reason once it ended
  bool engine_finished = false;   // the engine's sequence ended (not only a stop string)
  // The usual stream chunk (text, no logprobs, no finish) around its text;
  // made once (text_chunk).
  std::string chunk_prefix, chunk_suffix;
  std::string reasoning_prefix, reasoning_suffix;  // the same around reasoning_content
  // Streamed text waiting for the next flush round (every --stream-interval
  // steps; the first text goes out at once: the interval never delays the
  // first token).
  std::string held_text, held_reasoning;
  bool sent_text = false;
  // This round's (on_tokens) text, logprobs and end; the strings keep
  // their capacity from round to round.
  std::string round_text, round_reasoning;
  Json round_logprobs;
  bool round_touched = false, round_ended = false;
};

// One generation request in flight on this connection.
struct Generation {
  int64_t id = 0;
  ApiRequest req;
  std::vector<Choice> choices;  // req.best_of of them, by TokenEvent::index
  int64_t open = 0;             // choices not ended
  std::string object_id;
  std::time_t created = 0;
  bool done = false;
  int64_t cached_tokens = -1;  // from the request's first token event (-1: none yet)
};

}  // namespace msinfer::server
