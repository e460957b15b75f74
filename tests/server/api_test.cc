// Request parsing and validation, stop strings across token boundaries, the
// Prometheus exposition, and the benchmark client's reading of stream events.
#include "msinfer/server/api.h"

#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "../common/byte_tokenizer.h"
#include "../common/prometheus_text.h"
#include "msinfer/core/process.h"
#include "msinfer/server/bench_client.h"
#include "msinfer/server/metrics.h"

namespace msinfer::server {
namespace {

ApiContext ctx() {
  ApiContext c;
  c.served_model_name = "m";
  c.vocab = 100;
  c.max_model_len = 64;
  return c;
}

TEST(ParseRequest, DefaultsAndLimits) {
  ApiRequest r;
  ASSERT_FALSE(parse_request(R"({"prompt": [1, 2, 3]})", false, ctx(), &r));
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.sampling.max_tokens, 61);  // the model length left
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.f);
  ASSERT_FALSE(parse_request(R"({"model": "m", "prompt": [[5]], "max_tokens": 4, "temperature": 0,
      "top_k": 3, "seed": 9, "stop": ["x", ""], "stream": true, "stream_options": {"include_usage": true},
      "logprobs": 2, "frequency_penalty": 0.5})",
                             false, ctx(), &r));
  EXPECT_EQ(r.sampling.max_tokens, 4);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.seed, 9u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 0.5f);
}

using testing::byte_tokenizer;

const ChatTemplate& simple_template() {
  static const ChatTemplate t =
      std::move(ChatTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}")).value();
  return t;
}

// Every JSON type in the fields that take objects: a 400 naming the field,
// never an exception (a content part's `"type": 1` aborted the server).
TEST(ParseRequest, WrongJsonTypesAreNamedNeverThrown) {
  ApiRequest r;
  ApiContext chat_ctx = ctx();
  chat_ctx.vocab = 256;
  chat_ctx.tokenizer = &byte_tokenizer();
  chat_ctx.chat_template = &simple_template();
  for (const char* v : {"1", "null", "[]", "{}", "true", "\"json_object\""}) {
    const std::string body = std::string(R"({"prompt": [1], "response_format": {"type": )") + v + "}}";
    auto e = parse_request(body, false, ctx(), &r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, "response_format") << body;
    const std::string chat = std::string(R"({"messages": [{"role": "user", "content": [{"type": )") +
                             v + R"(, "text": "x"}]}]})";
    e = parse_request_fields(chat, true, chat_ctx, &r);
    ASSERT_TRUE(e.has_value()) << chat;
    EXPECT_EQ(e->param, "messages[0].content") << chat;
  }
  EXPECT_FALSE(parse_request(R"({"prompt": [1], "response_format": {"type": "text"}})", false,
                             ctx(), &r));
  ASSERT_FALSE(parse_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})", true,
      chat_ctx, &r));
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{'h', 'i'}));
  // null is the default, for max_tokens as for every other field.
  ASSERT_FALSE(parse_request(R"({"prompt": [1, 2], "max_tokens": null})", false, ctx(), &r));
  EXPECT_EQ(r.sampling.max_tokens, 62);
  // Beyond the context without overflowing prompt + max_tokens (UBSan).
  auto e = parse_request(R"({"prompt": [1], "max_tokens": 9223372036854775807})", false, ctx(), &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "max_tokens");
}

// The HTTP thread runs only parse_request_fields(): text is kept, not
// tokenized, and refused beyond max_prompt_bytes; resolve_prompt() tokenizes
// it (on the prompt pool) against a deadline.
TEST(ParseRequest, TextIsTokenizedOnlyByResolvePrompt) {
  ApiContext c = ctx();
  c.vocab = 256;
  c.tokenizer = &byte_tokenizer();
  c.max_prompt_bytes = 40;
  ApiRequest r;
  ASSERT_FALSE(parse_request_fields(R"({"prompt": "abc", "max_tokens": 5})", false, c, &r));
  EXPECT_TRUE(needs_tokenizer(r));
  EXPECT_TRUE(r.prompt.empty());
  ASSERT_FALSE(resolve_prompt(c, &r, std::chrono::steady_clock::now() + std::chrono::hours(1)));
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(r.sampling.max_tokens, 5);
  // Beyond the byte cap: refused before any tokenization.
  auto big = parse_request_fields("{\"prompt\": \"" + std::string(41, 'x') + "\"}", false, c, &r);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->param, "prompt");
  EXPECT_NE(big->message.find("--max-prompt-bytes"), std::string::npos);
  // A deadline that has passed: refused, naming the prompt.
  ASSERT_FALSE(parse_request_fields(R"({"prompt": "abc"})", false, c, &r));
  auto late = resolve_prompt(c, &r, std::chrono::steady_clock::now() - std::chrono::seconds(1));
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->param, "prompt");
  EXPECT_NE(late->message.find("--tokenize-timeout"), std::string::npos);
  // Token ids need no tokenizer.
  ASSERT_FALSE(parse_request_fields(R"({"prompt": [1, 2]})", false, c, &r));
  EXPECT_FALSE(needs_tokenizer(r));
}

// A chat template that does too much fails the one request (400, naming the
// limit), within jinja's limits and the request's deadline (issue 43: a
// fuzzed template rendered for minutes).
TEST(ParseRequest, AnExpensiveChatTemplateFailsItsRequestNamingTheLimit) {
  ApiContext c = ctx();
  c.vocab = 256;
  c.tokenizer = &byte_tokenizer();
  const ChatTemplate loops =
      std::move(ChatTemplate::parse("{% for a in range(100000) %}{% for b in range(100000) "
                                    "%}{% endfor %}{% endfor %}{{ messages[0].content }}"))
          .value();
  const ChatTemplate big = std::move(ChatTemplate::parse("{{ 'x' * 100000000 }}")).value();
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}]})";
  ApiRequest r;
  // Past the deadline: the same answer as a prompt not tokenized in time.
  c.chat_template = &loops;
  ASSERT_FALSE(parse_request_fields(body, true, c, &r));
  auto late = resolve_prompt(c, &r, std::chrono::steady_clock::now());
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->http_status, 400);
  EXPECT_EQ(late->param, "messages");
  EXPECT_NE(late->message.find("--tokenize-timeout"), std::string::npos) << late->message;
  // Past the size limit: the default 32 MiB, or room for the contents of a
  // conversation of max_prompt_bytes four times over.
  c.chat_template = &big;
  for (const auto& [prompt_bytes, limit] :
       {std::pair<int64_t, const char*>{1000, "33554432"}, {16 << 20, "67108864"}}) {
    c.max_prompt_bytes = prompt_bytes;
    ASSERT_FALSE(parse_request_fields(body, true, c, &r));
    auto e = resolve_prompt(c, &r, std::chrono::steady_clock::time_point::max());
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 400);
    EXPECT_NE(e->message.find("chat template: a string the template built passed the size limit (" +
                              std::string(limit) + " bytes)"),
              std::string::npos)
        << e->message;
  }
}

TEST(ParseRequest, Refusals) {
  ApiRequest r;
  struct Case {
    const char* body;
    int status;
  } cases[] = {
      {"", 400},
      {"{", 400},
      {"3", 400},
      {R"({"prompt": "text"})", 400} /* no tokenizer */,
      {R"({"prompt": [100]})", 400},
      {R"({"prompt": [1], "max_tokens": 64})", 400},
      {R"({"prompt": [1], "max_tokens": 1.5})", 400},
      {R"({"prompt": [1], "top_k": -2})", 400},
      {R"({"prompt": [1], "presence_penalty": 3})", 400},
      {R"({"prompt": [1], "stop": 5})", 400},
      {R"({"prompt": [1], "stream_options": {}})", 400},
      {R"({"prompt": [1], "echo": true})", 400},
      {R"({"prompt": [1], "model": "other"})", 404},
      {R"({"prompt": [[1], [2]]})", 400},
      {R"({"prompt": [1], "logprobs": 21})", 400},
      {R"({"prompt": [1], "seed": 1e300})", 400},
  };
  for (const auto& c : cases) {
    auto e = parse_request(c.body, false, ctx(), &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->http_status, c.status) << c.body;
    EXPECT_EQ(e->body()["error"]["code"], c.status);
  }
  // A temperature a float cannot hold is named as the bad field (it used to
  // reach the sampler's own check, which names no field).
  auto hot = parse_request(R"({"prompt": [1], "temperature": 1e308})", false, ctx(), &r);
  ASSERT_TRUE(hot.has_value());
  EXPECT_EQ(hot->http_status, 400);
  EXPECT_EQ(hot->param, "temperature");
  EXPECT_FALSE(
      parse_request(R"({"prompt": [1], "max_tokens": 2, "temperature": 3e38})", false, ctx(), &r)
          .has_value());
  auto chat = parse_request(R"({"messages": [{"role": "user", "content": "x"}]})", true, ctx(), &r);
  ASSERT_TRUE(chat.has_value());  // no chat template in this context
  EXPECT_EQ(chat->param, "messages");
}

// n and best_of (issue 47): n up to ApiContext::max_n (serve --max-n),
// best_of (completions) from n up to the same bound, defaulting to n; a
// stream refuses best_of != n; best_of > n makes the engine report each
// token's logprob (to rank the sequences) without asking the client's.
TEST(ParseRequest, NAndBestOf) {
  ApiRequest r;
  ASSERT_FALSE(parse_request(R"({"prompt": [1], "max_tokens": 2})", false, ctx(), &r));
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.best_of, 1);
  ASSERT_FALSE(parse_request(R"({"prompt": [1], "max_tokens": 2, "n": 3})", false, ctx(), &r));
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.best_of, 3);
  EXPECT_EQ(r.sampling.logprobs, -1);
  ASSERT_FALSE(
      parse_request(R"({"prompt": [1], "max_tokens": 2, "n": 2, "best_of": 5})", false, ctx(), &r));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 5);
  EXPECT_EQ(r.sampling.logprobs, 0);  // for the ranking
  EXPECT_FALSE(r.logprobs);           // not reported
  ASSERT_FALSE(parse_request(R"({"prompt": [1], "max_tokens": 2, "best_of": 2, "logprobs": 3})",
                             false, ctx(), &r));
  EXPECT_EQ(r.sampling.logprobs, 3);
  EXPECT_TRUE(r.logprobs);
  ApiContext c = ctx();
  c.max_n = 8;
  ASSERT_FALSE(parse_request(R"({"prompt": [1], "max_tokens": 2, "n": 8})", false, c, &r));
  ASSERT_FALSE(
      parse_request(R"({"prompt": [1], "max_tokens": 2, "n": 4, "stream": true})", false, c, &r));
  EXPECT_EQ(r.best_of, 4);
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"prompt": [1], "n": 9})", "n"},
      {R"({"prompt": [1], "n": 0})", "n"},
      {R"({"prompt": [1], "n": "2"})", "n"},
      {R"({"prompt": [1], "n": 3, "best_of": 2})", "best_of"},
      {R"({"prompt": [1], "best_of": 9})", "best_of"},
      {R"({"prompt": [1], "best_of": 2, "stream": true})", "best_of"},
      {R"({"prompt": [1], "n": 2, "best_of": 3, "stream": true})", "best_of"},
  };
  for (const auto& k : cases) {
    auto e = parse_request(k.body, false, c, &r);
    ASSERT_TRUE(e.has_value()) << k.body;
    EXPECT_EQ(e->http_status, 400) << k.body;
    EXPECT_EQ(e->param, k.param) << k.body << ": " << e->message;
  }
  auto many = parse_request(R"({"prompt": [1], "n": 9})", false, c, &r);
  ASSERT_TRUE(many.has_value());
  EXPECT_NE(many->message.find("--max-n"), std::string::npos) << many->message;
  // Chat: n, but best_of is not a chat field (ignored, as vLLM's unknown fields).
  ApiContext chat_ctx = c;
  chat_ctx.vocab = 256;
  chat_ctx.tokenizer = &byte_tokenizer();
  chat_ctx.chat_template = &simple_template();
  ASSERT_FALSE(parse_request(
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 2, "best_of": 1})",
      true, chat_ctx, &r));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 2);
  auto chat_many = parse_request(R"({"messages": [{"role": "user", "content": "x"}], "n": 9})",
                                 true, chat_ctx, &r);
  ASSERT_TRUE(chat_many.has_value());
  EXPECT_EQ(chat_many->param, "n");
}

// vLLM's sampling fields reach SamplingParams; each bad value is a 400 naming
// its field; max_completion_tokens works on /v1/completions too.
TEST(ParseRequest, VllmSamplingFields) {
  ApiRequest r;
  ASSERT_FALSE(parse_request(R"({"prompt": [1, 2], "max_completion_tokens": 9, "min_p": 0.25,
      "repetition_penalty": 1.3, "min_tokens": 4, "stop_token_ids": [7, 99],
      "include_stop_str_in_output": true, "skip_special_tokens": false,
      "add_special_tokens": false})",
                             false, ctx(), &r));
  EXPECT_EQ(r.sampling.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.25f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.3f);
  EXPECT_EQ(r.sampling.min_tokens, 4);
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{7, 99}));
  EXPECT_TRUE(r.include_stop_str_in_output);
  EXPECT_FALSE(r.skip_special_tokens);
  EXPECT_EQ(r.add_special_tokens, std::optional<bool>(false));
  const struct {
    const char* body;
    const char* param;
  } bad[] = {
      {R"({"prompt": [1], "stop_token_ids": [100]})", "stop_token_ids"},  // beyond the vocabulary
      {R"({"prompt": [1], "stop_token_ids": [-1]})", "stop_token_ids"},
      {R"({"prompt": [1], "stop_token_ids": 5})", "stop_token_ids"},
      {R"({"prompt": [1], "min_p": 1.5})", "min_p"},
      {R"({"prompt": [1], "repetition_penalty": 0})", "repetition_penalty"},
      {R"({"prompt": [1], "repetition_penalty": -1})", "repetition_penalty"},
      {R"({"prompt": [1], "min_tokens": -1})", "min_tokens"},
      {R"({"prompt": [1], "max_tokens": 3, "min_tokens": 4})", "min_tokens"},
      {R"({"prompt": [1], "max_completion_tokens": 0})", "max_completion_tokens"},
      {R"({"prompt": [1], "max_completion_tokens": 64})", "max_completion_tokens"},
      {R"({"prompt": [1], "include_stop_str_in_output": 1})", "include_stop_str_in_output"},
  };
  for (const auto& c : bad) {
    auto e = parse_request(c.body, false, ctx(), &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->http_status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body;
  }
  // A disaggregated deployment takes them like the co-located engine.
  ApiContext d = ctx();
  d.disaggregated = true;
  EXPECT_FALSE(parse_request(R"({"prompt": [1], "max_tokens": 4, "min_p": 0.5,
      "repetition_penalty": 1.5, "min_tokens": 2, "stop_token_ids": [3]})",
                             false, d, &r));
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.5f);
  EXPECT_EQ(r.sampling.min_tokens, 2);
}

// Without a seed each request draws a fresh one; a seed is kept.
TEST(ParseRequest, UnseededRequestsGetFreshSeeds) {
  std::set<uint64_t> seeds;
  for (int i = 0; i < 8; ++i) {
    ApiRequest r;
    ASSERT_FALSE(parse_request(R"({"prompt": [1]})", false, ctx(), &r));
    EXPECT_FALSE(r.seeded);
    seeds.insert(r.sampling.seed);
  }
  EXPECT_EQ(seeds.size(), 8u);
  ApiRequest r;
  ASSERT_FALSE(parse_request(R"({"prompt": [1], "seed": 0})", false, ctx(), &r));
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.sampling.seed, 0u);
}

// docs/SERVING.md's table of request fields is request_fields(), row for row,
// and the parser does what each row says: an honoured or no-effect field with
// its example value parses, a refused one is a 400 naming it (its defaults
// still parse).
TEST(RequestFields, TheDocsTableMatchesTheParser) {
  std::ifstream f(std::string(MSINFER_SOURCE_DIR) + "/docs/SERVING.md");
  ASSERT_TRUE(f.good());
  std::string line;
  bool in_table = false;
  std::set<std::tuple<std::string, std::string, std::string>> doc;
  const std::regex row(
      R"(^\| `([a-z_.]+)` \| (both|completions|chat) \| (honoured|no effect|refused) \|)");
  while (std::getline(f, line)) {
    if (line.rfind("### Request fields", 0) == 0)
      in_table = true;
    else if (in_table && line.rfind("#", 0) == 0)
      break;
    std::smatch m;
    if (in_table && std::regex_search(line, m, row)) {
      EXPECT_TRUE(doc.emplace(m[1], m[2], m[3]).second) << "listed twice: " << line;
    }
  }
  const char* kEndpoint[] = {"both", "completions", "chat"};
  std::set<std::tuple<std::string, std::string, std::string>> code;
  for (const RequestField& rf : request_fields()) {
    code.emplace(rf.name, kEndpoint[static_cast<int>(rf.endpoint)], field_use_name(rf.use));
  }
  for (const auto& c : code) {
    EXPECT_TRUE(doc.count(c)) << "docs/SERVING.md lacks the row for " << std::get<0>(c) << " ("
                              << std::get<1>(c) << ", " << std::get<2>(c) << ")";
  }
  for (const auto& d : doc) {
    EXPECT_TRUE(code.count(d)) << "docs/SERVING.md lists " << std::get<0>(d) << " ("
                               << std::get<1>(d) << ", " << std::get<2>(d)
                               << ") but the parser does not";
  }
  ApiContext chat_ctx = ctx();
  chat_ctx.vocab = 256;
  chat_ctx.tokenizer = &byte_tokenizer();
  chat_ctx.chat_template = &simple_template();
  for (const RequestField& rf : request_fields()) {
    const std::string name = rf.name;
    if (name == "model" || name == "prompt" || name == "messages") continue;
    for (bool chat : {false, true}) {
      if (rf.endpoint == (chat ? FieldEndpoint::kCompletions : FieldEndpoint::kChat)) continue;
      auto body_with = [&](const Json& v) {
        Json b =
            chat ? Json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"logprobs", true}}
                 : Json{{"prompt", {1, 2, 3}}};
        b["max_tokens"] = 4;
        b["stream"] = true;
        if (const size_t dot = name.find('.'); dot != std::string::npos) {
          b[name.substr(0, dot)][name.substr(dot + 1)] = v;
        } else {
          b[name] = v;
        }
        return b.dump();
      };
      ApiRequest r;
      auto e = parse_request(body_with(Json::parse(rf.example)), chat, chat ? chat_ctx : ctx(), &r);
      if (rf.use == FieldUse::kRefused) {
        ASSERT_TRUE(e.has_value()) << name << " (chat " << chat << ") was accepted";
        EXPECT_EQ(e->http_status, 400) << name;
        EXPECT_EQ(e->param, name) << e->message;
        for (const Json& ok : Json::parse(rf.allowed)) {
          EXPECT_FALSE(parse_request(body_with(ok), chat, chat ? chat_ctx : ctx(), &r))
              << name << " = " << ok.dump();
        }
      } else {
        EXPECT_FALSE(e.has_value()) << name << " (chat " << chat << "): " << e->message;
      }
    }
  }
}

// The smallest tokenizer that makes text: one token per letter a, b, c, d.
StatusOr<model::Tokenizer> abcd_tokenizer() {
  const Json tj = {{"model",
                    {{"type", "BPE"},
                     {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}}},
                     {"merges", Json::array()}}},
                   {"added_tokens", Json::array()}};
  return model::Tokenizer::from_json(tj, nullptr, "test");
}

TEST(TextStreamTest, IncludeStopStrAndMinTokens) {
  auto t = abcd_tokenizer();
  ASSERT_TRUE(t.ok()) << t.status().message();
  TextStreamOptions o;
  o.include_stop_str = true;
  TextStream s(&*t, {"bc", "cd"}, o);
  std::string out = s.push(0);
  out += s.push(1);
  out += s.push(2);  // "abc": "bc" ends it, kept
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out, "abc");
  EXPECT_EQ(s.push(3), "");
  // min_tokens 3: the "bc" inside the first three tokens does not stop; the
  // one that ends with the fifth does.
  o.include_stop_str = false;
  o.min_tokens = 3;
  TextStream m(&*t, {"bc"}, o);
  std::string mo;
  for (int32_t id : {0, 1, 2, 1, 2, 3}) mo += m.push(id);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(mo, "abc");
}

TEST(TextStreamTest, StopStringAcrossTokensIsNeverEmitted) {
  auto t = abcd_tokenizer();
  ASSERT_TRUE(t.ok()) << t.status().message();
  TextStream s(&*t, {"bc"});
  std::string out = s.push(0);  // a
  out += s.push(1);             // b: held back, may start "bc"
  EXPECT_EQ(out, "a");
  out += s.push(2);  // c completes the stop string
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out, "a");
  TextStream s2(&*t, {"bd"});
  std::string o2 = s2.push(1);
  o2 += s2.push(2);
  o2 += s2.push(3);
  o2 += s2.finish();
  EXPECT_FALSE(s2.stopped());
  EXPECT_EQ(o2, "bcd");
}

// Logprob tokens join into the text (issue 47): on a SentencePiece tokenizer
// with byte fallback (Llama 2: the leading space of every word but the first,
// characters outside its vocabulary as <0xNN> bytes) and on a byte-level one
// (Qwen3: a character split across tokens), each token's bytes after the one
// before it, concatenated, are the text's bytes; a part of a character is
// written as "bytes:\\xNN" and a whole one as itself.
TEST(TextStreamTest, LogprobTokensJoinIntoTheText) {
  const std::string text =
      "select fabric \xe2\x80\x94 \xf0\x9f\xa6\x8a jumps  over 3.14 \xe4\xb8\xad\xe6\x96\x87!";
  for (const char* name : {"llama2", "qwen3"}) {
    const std::string dir = std::string(MSINFER_SOURCE_DIR) + "/.cache/tokenizers/" + name;
    if (!std::ifstream(dir + "/tokenizer.json")) GTEST_SKIP() << "run scripts/fetch-tokenizers first";
    auto t = model::Tokenizer::load(dir);
    ASSERT_TRUE(t.ok()) << t.status().message();
    const std::vector<int32_t> ids = t->encode(text, /*add_special_tokens=*/false);
    TextStream s(&*t, {});
    const std::vector<std::string> chars = model::utf8_characters(text);
    std::string written, joined;
    int64_t offset = 0;
    bool partial = false;
    int32_t before = -1;
    for (int32_t id : ids) {
      written += s.push(id);
      const std::string bytes = s.token_bytes(id, before);
      joined += bytes;
      const std::string tok = logprob_token(bytes);
      if (tok.rfind("bytes:", 0) == 0) {
        partial = true;
        EXPECT_EQ(tok.size(), 6 + 4 * bytes.size()) << name << ": " << tok;
      } else {
        EXPECT_EQ(tok, bytes) << name;
      }
      // text_offset: a whole token is the text's characters from its offset on.
      if (tok == bytes) {
        std::string at;
        for (int64_t c = offset; c < offset + text_offset_advance(bytes); ++c) at += chars.at(c);
        EXPECT_EQ(at, bytes) << name << " at " << offset;
      }
      offset += text_offset_advance(bytes);
      before = id;
    }
    written += s.finish();
    EXPECT_EQ(joined, written) << name;
    EXPECT_EQ(written, text) << name;
    EXPECT_TRUE(partial) << name << ": the text should split a character across tokens";
    EXPECT_EQ(offset, static_cast<int64_t>(model::utf8_characters(text).size())) << name;
  }
  EXPECT_EQ(logprob_token("\xe2\x80"), "bytes:\\xe2\\x80");
  EXPECT_EQ(logprob_token("\x80"), "bytes:\\x80");
  EXPECT_EQ(logprob_token(" \xe2\x80\x94"), " \xe2\x80\x94");
}

TEST(MetricsTest, PrometheusText) {
  Metrics m("m");
  m.add_prompt_tokens(5);
  const std::vector<double> ttft = {0.03, 0.5}, itl = {0.01, 0.01, 0.02, 0.3, 0.001};
  m.observe_step(ttft, itl);
  m.request_finished("length", 1.2);
  Metrics::Gauges g;
  g.running = 2;
  g.kv_usage = 0.5;
  g.engine_busy_s = 2.5;
  g.engine_step_s = 2.25;
  g.engine_steps = 17;
  const std::string t = m.render(g);
  EXPECT_NE(t.find("msinfer:engine_busy_seconds_total{model_name=\"m\"} 2.5\n"), std::string::npos);
  EXPECT_NE(t.find("msinfer:engine_step_seconds_total{model_name=\"m\"} 2.25\n"),
            std::string::npos);
  EXPECT_NE(t.find("msinfer:engine_steps_total{model_name=\"m\"} 17\n"), std::string::npos);
  EXPECT_NE(t.find("msinfer:num_requests_running{model_name=\"m\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("msinfer:kv_cache_usage_perc{model_name=\"m\"} 0.5\n"), std::string::npos);
  EXPECT_NE(t.find("msinfer:prompt_tokens_total{model_name=\"m\"} 5\n"), std::string::npos);
  EXPECT_NE(
      t.find("msinfer:request_success_total{model_name=\"m\",finished_reason=\"length\"} 1\n"),
      std::string::npos);
  EXPECT_NE(t.find("msinfer:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.04\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("msinfer:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.02\"} 0\n"),
            std::string::npos);
  // One step's observations: every token counted once, each in its histogram.
  EXPECT_NE(t.find("msinfer:generation_tokens_total{model_name=\"m\"} 7\n"), std::string::npos);
  EXPECT_NE(t.find("msinfer:time_to_first_token_seconds_count{model_name=\"m\"} 2\n"),
            std::string::npos);
  EXPECT_NE(t.find("msinfer:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.01\"} 3\n"),
            std::string::npos);
  EXPECT_NE(t.find("msinfer:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.025\"} 4\n"),
            std::string::npos);
  EXPECT_NE(t.find("msinfer:inter_token_latency_seconds_count{model_name=\"m\"} 5\n"),
            std::string::npos);
  EXPECT_NE(t.find("# TYPE msinfer:e2e_request_latency_seconds histogram\n"), std::string::npos);
  EXPECT_EQ(t.find("msinfer:expert_balance"), std::string::npos);  // no routing window: none
  // The routing window: rows per expert summed over layers, and the ratios.
  g.routing = Json{{"layers", 2},
                   {"experts", 3},
                   {"expert_tokens", {{4, 0, 2}, {1, 5, 0}}},
                   {"expert_balance", 1.5},
                   {"worker_balance", 1.25},
                   {"placement_switches", 3}};
  const std::string r = m.render(g);
  EXPECT_NE(r.find("msinfer:expert_window_tokens{model_name=\"m\",expert=\"0\"} 5\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("msinfer:expert_window_tokens{model_name=\"m\",expert=\"1\"} 5\n"),
            std::string::npos);
  EXPECT_NE(r.find("msinfer:expert_window_tokens{model_name=\"m\",expert=\"2\"} 2\n"),
            std::string::npos);
  EXPECT_NE(r.find("msinfer:expert_balance{model_name=\"m\"} 1.5\n"), std::string::npos);
  EXPECT_NE(r.find("msinfer:expert_worker_balance{model_name=\"m\"} 1.25\n"), std::string::npos);
  EXPECT_NE(r.find("# TYPE msinfer:expert_placement_switches_total counter\n"
                   "msinfer:expert_placement_switches_total{model_name=\"m\"} 3\n"),
            std::string::npos)
      << r;
  // The processes of a tensor-parallel group are told apart by tp_rank (one
  // series each); a worker without tensor parallelism has no such label.
  g.workers = {Json{{"role", "attention"}, {"index", 0}, {"tp_rank", 0}, {"busy_fraction", 0.5}},
               Json{{"role", "attention"}, {"index", 0}, {"tp_rank", 1}, {"busy_fraction", 0.25}},
               Json{{"role", "expert"}, {"index", 0}, {"busy_fraction", 0.75}}};
  const std::string w = m.render(g);
  EXPECT_NE(w.find("msinfer:worker_busy_fraction{model_name=\"m\",role=\"attention\",index=\"0\","
                   "tp_rank=\"1\"} 0.25\n"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("msinfer:worker_busy_fraction{model_name=\"m\",role=\"expert\",index=\"0\"} "
                   "0.75\n"),
            std::string::npos)
      << w;
  // A deployment's workers by role; none co-located (above).
  EXPECT_EQ(w.find("msinfer:workers_live"), std::string::npos);
  g.roles = {{"attention", 1, 2, 1, 0}, {"expert", 3, 3, 2, 2}};
  const std::string roles = m.render(g);
  for (const char* line : {"# TYPE msinfer:worker_deaths_total counter\n"
                           "msinfer:worker_deaths_total{model_name=\"m\",role=\"attention\"} 1\n"
                           "msinfer:worker_deaths_total{model_name=\"m\",role=\"expert\"} 2\n",
                           "# TYPE msinfer:worker_restarts_total counter\n"
                           "msinfer:worker_restarts_total{model_name=\"m\",role=\"attention\"} 0\n"
                           "msinfer:worker_restarts_total{model_name=\"m\",role=\"expert\"} 2\n",
                           "# TYPE msinfer:workers_live gauge\n"
                           "msinfer:workers_live{model_name=\"m\",role=\"attention\"} 1\n"
                           "msinfer:workers_live{model_name=\"m\",role=\"expert\"} 3\n",
                           "msinfer:workers_expected{model_name=\"m\",role=\"attention\"} 2\n"}) {
    EXPECT_NE(roles.find(line), std::string::npos) << line << "\n" << roles;
  }
  // Prefill workers' K/V transfers: counters only where there are some.
  EXPECT_EQ(roles.find("msinfer:kv_transfers_total"), std::string::npos);
  g.kv_transfers = Metrics::Gauges::KvTransfers{7, 4096, 1};
  const std::string kv = m.render(g);
  for (const char* line : {"# TYPE msinfer:kv_transfers_total counter\n"
                           "msinfer:kv_transfers_total{model_name=\"m\"} 7\n",
                           "msinfer:kv_transfer_bytes_total{model_name=\"m\"} 4096\n",
                           "msinfer:kv_transfer_fallbacks_total{model_name=\"m\"} 1\n"}) {
    EXPECT_NE(kv.find(line), std::string::npos) << line << "\n" << kv;
  }
  // The process_* family of this process, as the Prometheus clients write
  // it (no labels), with the values /proc gives. /proc counts CPU time in
  // clock ticks (10 ms), and on a fast machine this test had used less than
  // one (the check read 0): it first uses 50 ms.
  while (std::clock() < CLOCKS_PER_SEC / 20) {
  }
  auto p = read_process_stats();
  const double cpu_s = static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_GT(p->cpu_seconds, 0);
  EXPECT_NEAR(p->cpu_seconds, cpu_s, 0.05);
  EXPECT_GT(p->resident_bytes, 1 << 20);
  EXPECT_GE(p->virtual_bytes, p->resident_bytes);
  EXPECT_GE(p->open_fds, 3);
  EXPECT_TRUE(p->max_fds < 0 || p->max_fds >= p->open_fds);
  EXPECT_NEAR(p->start_time_seconds, static_cast<double>(std::time(nullptr)), 3600);
  const auto samples = testing::parse_metrics(roles);
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    EXPECT_TRUE(samples.count(name)) << name << " missing:\n" << roles;
    EXPECT_NE(roles.find(std::string("# HELP ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NEAR(samples.at("process_start_time_seconds"), p->start_time_seconds, 0.02);
  EXPECT_NE(roles.find("# TYPE process_cpu_seconds_total counter\n"), std::string::npos);
  g.process = false;
  EXPECT_EQ(m.render(g).find("process_"), std::string::npos);
}

// The benchmark client reads token chunks without a JSON parse: it must say
// what a full parse says, on this server's compact chunks and on another
// server's spaced ones, and must not take a key's name inside a text value
// for the key.
TEST(StreamEvent, TheFastPathAgreesWithAFullParse) {
  // The reference: nlohmann's parse of the payload.
  auto reference_text = [](const std::string& data) {
    const Json j = Json::parse(data);
    if (!j.contains("choices") || j["choices"].empty()) return false;
    const Json& c = j["choices"][0];
    if (c.contains("text") && !c["text"].get<std::string>().empty()) return true;
    for (const char* key : {"content", "reasoning_content"}) {
      if (c.contains("delta") && c["delta"].contains(key) &&
          !c["delta"][key].get<std::string>().empty())
        return true;
    }
    return false;
  };
  const std::vector<std::string> chunks = {
      R"({"choices":[{"finish_reason":null,"index":0,"logprobs":null,"text":"K"}],"usage":null})",
      R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":""}],"usage":null})",
      R"({"choices":[{"delta":{"content":"","role":"assistant"},"index":0}],"usage":null})",
      R"({"choices":[{"delta":{"content":"\u00e9"},"index":0}],"usage":null})",
      R"({"choices":[{"delta":{},"finish_reason":"length","index":0}],"usage":null})",
      // Texts that quote a key: escaped, so not a key.
      R"({"choices":[{"index":0,"text":"\"text\":\"\"usage\":{"}],"usage":null})",
      R"({"choices":[{"index":0,"logprobs":{"tokens":["\"text\":\"x"]},"text":""}]})",
      R"({"choices":[{"index":0,"text":"\""}]})",
      // Spaced JSON (another server): the full parse decides.
      R"({"choices": [{"index": 0, "text": "a"}], "usage": null})",
      R"({"choices": [{"index": 0, "text": ""}]})",
      R"({"choices": [{"delta": {"content": "b"}}]})",
      // Harmony: the reasoning streams first, and counts as text.
      R"({"choices":[{"delta":{"reasoning_content":"r"},"index":0}],"usage":null})",
      R"({"choices":[{"delta":{"reasoning_content":""},"index":0}],"usage":null})",
      R"({"choices": [{"delta": {"reasoning_content": "s"}}]})",
  };
  for (const std::string& c : chunks) {
    const StreamEvent e = read_stream_event(c);
    EXPECT_EQ(e.text, reference_text(c)) << c;
    EXPECT_FALSE(e.done) << c;
    EXPECT_FALSE(e.has_usage) << c;
    EXPECT_TRUE(e.error.empty()) << c;
  }
  EXPECT_TRUE(read_stream_event(chunks[0]).text);
  EXPECT_FALSE(read_stream_event(chunks[1]).text);
  EXPECT_TRUE(read_stream_event(chunks[5]).text);
  EXPECT_FALSE(read_stream_event(chunks[6]).text);
  EXPECT_TRUE(read_stream_event(chunks[11]).text);
  EXPECT_FALSE(read_stream_event(chunks[12]).text);
  StreamEvent usage = read_stream_event(
      R"({"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7}})");
  EXPECT_TRUE(usage.has_usage);
  EXPECT_EQ(usage.prompt_tokens, 4);
  EXPECT_EQ(usage.completion_tokens, 3);
  EXPECT_FALSE(usage.text);
  EXPECT_EQ(usage.cached_tokens, 0);
  EXPECT_EQ(
      read_stream_event(
          R"({"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":300,"total_tokens":303,"prompt_tokens_details":{"cached_tokens":256}}})")
          .cached_tokens,
      256);
  EXPECT_EQ(read_stream_event(R"({"error":{"message":"worker gone","type":"x"}})").error,
            "worker gone");
  EXPECT_EQ(read_stream_event(R"({"error":"plain"})").error, "error event");
  EXPECT_TRUE(read_stream_event("[DONE]").done);
  const StreamEvent junk = read_stream_event("not json");
  EXPECT_FALSE(junk.text || junk.done || junk.has_usage || !junk.error.empty());
}

}  // namespace
}  // namespace msinfer::server
