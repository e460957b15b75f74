// The answer to one completion request (POST /v1/completions or
// /v1/chat/completions): turns the engine's token events into what the
// client reads, OpenAI's way: SSE chunks for a stream (text held for the
// --stream-interval rounds, logprobs, finish reasons, usage), one JSON body
// otherwise (best_of's ranking). It writes nothing itself: the connection
// (Session) writes what it returns. Event-loop thread only.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/runtime/engine.h"
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
  // This round's (take) text, logprobs and end; the strings keep their
  // capacity from round to round.
  std::string round_text, round_reasoning;
  Json round_logprobs;
  bool round_touched = false, round_ended = false;
};

class CompletionAnswer {
 public:
  // `req` resolved (prompt tokenized); `id` the scheduler's; `object_id`
  // the response's id ("cmpl-..." or "chatcmpl-..."); ctx gives the
  // tokenizer, the harmony encoding and the served model's name.
  CompletionAnswer(ApiRequest req, int64_t id, std::string object_id, std::time_t created,
                   const ApiContext& ctx, std::string system_fingerprint);

  int64_t id() const { return id_; }
  const ApiRequest& request() const { return req_; }
  // The answer is complete or abandoned: nothing more is taken.
  bool done() const { return done_; }
  void abandon() { done_ = true; }

  // A stream's first events (a chat's: each choice's role), before any token.
  std::string stream_start() const;

  // What one round of token events (one engine step's, or several)
  // adds to the answer.
  struct Round {
    std::string sse;     // a stream: SSE events to write now (may be empty)
    bool ended = false;  // every choice ended: the answer is complete (done())
    Json body;           // not a stream, ended: the response body
    // Every choice ended by stop strings while the engine's sequences run on:
    // the request should be cancelled in the engine.
    bool cancel = false;
  };
  // flush: the round where held stream text goes out (every stream_interval-th).
  // A stream's chunks go out choice by choice in index order within a round,
  // so n choices interleave as OpenAI's do; each choice ends with its own
  // finish_reason chunk, the response once every choice has ended.
  Round take(std::span<const runtime::TokenEvent> events, bool flush);

  // The error answer for a request the engine or deployment failed (a
  // stream writes it as an SSE event; its status line is out already).
  static ApiError error_for(const Status& st);

 private:
  Json base(bool chunked) const;
  Json stream_chunk(int index, const Json& delta_or_text, const Json& logprobs,
                    const Json& finish_reason) const;
  // stream_chunk(index, text, null, null) as SSE, from a template made on
  // the choice's first call: the JSON of every other field is the same for
  // the whole stream, so only the text is escaped per token (nlohmann builds
  // and sorts a tree per chunk otherwise: most of the server's time per token).
  // reasoning: the chunk's delta is {"reasoning_content": text} (harmony).
  std::string text_chunk(int index, const std::string& text, bool reasoning = false);
  // Logprobs of `ev` in the API's shape, appended to `acc`. Each token's text
  // is what it adds to the text after the token before it
  // (TextStream::token_bytes), so the tokens join into the text; the
  // alternatives are read in the same place.
  void add_logprobs(Choice& ch, const runtime::TokenEvent& ev, Json* acc) const;
  // Event `ev` into its choice's round state.
  void take_event(const runtime::TokenEvent& ev);
  // A stream's events for this round.
  std::string stream_round(bool flush);
  // The generated tokens of every choice returned (usage: the prompt once,
  // the completions summed).
  int64_t completion_tokens() const;
  // Every choice ended, not a stream: the body. With best_of > n, the n
  // sequences with the highest cumulative logprob (vLLM's rule), best first,
  // as choices 0..n-1; the others are dropped (usage counts the returned ones).
  Json final_body();

  ApiRequest req_;
  int64_t id_ = 0;
  std::string object_id_;
  std::time_t created_ = 0;
  std::string model_, system_fingerprint_;
  std::vector<Choice> choices_;  // req_.best_of of them, by TokenEvent::index
  int64_t open_ = 0;             // choices not ended
  bool done_ = false;
  int64_t cached_tokens_ = -1;  // from the request's first token event (-1: none yet)
};

}  // namespace msinfer::server
