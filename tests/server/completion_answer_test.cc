// A completion's answer without a server (CompletionAnswer): token events
// in, what the client reads out. A byte-level tokenizer makes token t the
// byte t, so the texts are easy to read.
#include "internal/completion_answer.h"

#include <gtest/gtest.h>

#include "../common/byte_tokenizer.h"
#include "internal/http_wire.h"

namespace msinfer::server {
namespace {

using testing::byte_tokenizer;

ApiContext context() {
  ApiContext c;
  c.served_model_name = "m";
  c.vocab = 256;
  c.max_model_len = 4096;
  c.tokenizer = &byte_tokenizer();
  return c;
}

// A completion request; `chat`: answered as a chat (the answer only reads
// the flag: rendering messages is the template's, tested elsewhere).
ApiRequest request(const std::string& body, bool chat = false) {
  ApiRequest r;
  const ApiContext c = context();
  auto err = parse_request(body, false, c, &r);
  EXPECT_FALSE(err) << err->message;
  err = resolve_prompt(c, &r, std::chrono::steady_clock::time_point::max());
  EXPECT_FALSE(err) << err->message;
  r.chat = chat;
  return r;
}

runtime::TokenEvent token(char c, int index = 0,
                          runtime::FinishReason end = runtime::FinishReason::kNone,
                          float logprob = 0) {
  runtime::TokenEvent ev;
  ev.token = static_cast<unsigned char>(c);
  ev.index = index;
  ev.finish_reason = end;
  ev.finished = end != runtime::FinishReason::kNone;
  ev.logprob = logprob;
  return ev;
}

// The SSE events of a stream, as JSON (the last, [DONE], as a string).
std::vector<Json> events_of(const std::string& sse_text) {
  std::vector<Json> out;
  size_t at = 0;
  while ((at = sse_text.find("data: ", at)) != std::string::npos) {
    const size_t end = sse_text.find("\n\n", at);
    const std::string data = sse_text.substr(at + 6, end - at - 6);
    out.push_back(data == "[DONE]" ? Json(data) : Json::parse(data));
    at = end;
  }
  return out;
}

TEST(CompletionAnswerTest, APlainAnswerIsOneBodyWhenEveryChoiceEnds) {
  CompletionAnswer a(request(R"({"prompt": "hi", "max_tokens": 3})"), 7, "cmpl-x", 123, context(),
                     "fp");
  const runtime::TokenEvent first[] = {token('a'), token('b')};
  auto r = a.take(first, false);
  EXPECT_FALSE(r.ended);
  EXPECT_TRUE(r.sse.empty());
  EXPECT_TRUE(r.body.is_null());
  const runtime::TokenEvent last[] = {token('c', 0, runtime::FinishReason::kLength)};
  r = a.take(last, false);
  ASSERT_TRUE(r.ended);
  EXPECT_FALSE(r.cancel);
  EXPECT_TRUE(a.done());
  EXPECT_EQ(r.body["id"], "cmpl-x");
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_EQ(r.body["created"], 123);
  EXPECT_EQ(r.body["model"], "m");
  EXPECT_EQ(r.body["system_fingerprint"], "fp");
  EXPECT_EQ(r.body["choices"][0]["text"], "abc");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 3);
  EXPECT_TRUE(a.take(last, false).body.is_null()) << "nothing is taken once it ended";
}

// A chat stream: the role first, the first text at once, later text held
// until a flush round, each choice's finish, usage, [DONE].
TEST(CompletionAnswerTest, AChatStreamHoldsTextUntilAFlushRound) {
  CompletionAnswer a(request(R"({"prompt": "hi", "max_tokens": 3,
      "stream": true, "stream_options": {"include_usage": true}})",
                             true),
                     1, "chatcmpl-y", 1, context(), "fp");
  auto start = events_of(a.stream_start());
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0]["choices"][0]["delta"]["role"], "assistant");
  const runtime::TokenEvent t1[] = {token('x')}, t2[] = {token('y')},
                            t3[] = {token('z', 0, runtime::FinishReason::kLength)};
  auto e = events_of(a.take(t1, false).sse);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(e[0]["choices"][0]["delta"]["content"], "x");
  EXPECT_TRUE(a.take(t2, false).sse.empty()) << "held for the flush round";
  const auto r = a.take(t3, false);
  ASSERT_TRUE(r.ended);
  e = events_of(r.sse);
  ASSERT_EQ(e.size(), 4u);  // the held and last text, the finish, usage, [DONE]
  EXPECT_EQ(e[0]["choices"][0]["delta"]["content"], "yz");
  EXPECT_EQ(e[1]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(e[2]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(e[3], "[DONE]");
}

// Stop strings end a choice the engine has not seen end: the answer says
// to cancel the request; the text stops before the stop string.
TEST(CompletionAnswerTest, AStopStringEndsTheAnswerAndAsksForTheCancel) {
  CompletionAnswer a(request(R"({"prompt": "hi", "max_tokens": 9, "stop": ["cd"]})"), 2, "cmpl-z",
                     1, context(), "fp");
  const runtime::TokenEvent t[] = {token('a'), token('b'), token('c'), token('d')};
  const auto r = a.take(t, false);
  ASSERT_TRUE(r.ended);
  EXPECT_TRUE(r.cancel);
  EXPECT_EQ(r.body["choices"][0]["text"], "ab");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
}

// best_of 3, n 2: the two sequences with the highest cumulative logprob,
// best first; usage counts the returned ones.
TEST(CompletionAnswerTest, BestOfKeepsTheMostLikelySequences) {
  CompletionAnswer a(request(R"({"prompt": "hi", "max_tokens": 1, "n": 2, "best_of": 3})"), 3,
                     "cmpl-b", 1, context(), "fp");
  const auto end = runtime::FinishReason::kLength;
  const runtime::TokenEvent t[] = {token('p', 0, end, -3.f), token('q', 1, end, -0.5f),
                                   token('r', 2, end, -1.f)};
  const auto r = a.take(t, false);
  ASSERT_TRUE(r.ended);
  ASSERT_EQ(r.body["choices"].size(), 2u);
  EXPECT_EQ(r.body["choices"][0]["text"], "q");
  EXPECT_EQ(r.body["choices"][1]["text"], "r");
  EXPECT_EQ(r.body["choices"][1]["index"], 1);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 2);
}

TEST(CompletionAnswerTest, EngineFailuresMapToTheirHttpErrors) {
  EXPECT_EQ(CompletionAnswer::error_for(invalid_argument("bad")).http_status, 400);
  EXPECT_EQ(CompletionAnswer::error_for(resource_exhausted("too long")).http_status, 400);
  const ApiError e = CompletionAnswer::error_for(Status(StatusCode::kUnavailable, "worker died"));
  EXPECT_EQ(e.http_status, 503);
  EXPECT_EQ(e.body()["error"]["message"], "worker died");
}

}  // namespace
}  // namespace msinfer::server
