// The harmony format (gpt-oss): the built-in renderer against the format's
// own examples (github.com/openai/harmony, test-data/) and against gpt-oss's
// published chat template rendered by msinfer's Jinja interpreter; the
// channel parser on well-formed, split and malformed token streams; the API
// layer's use of both. The o200k tokenizer comes from scripts/fetch-tokenizers.
#include "msinfer/server/harmony.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "../common/chat_conversations.h"
#include "msinfer/server/api.h"
#include "msinfer/server/chat_template.h"

namespace msinfer::server {
namespace {

namespace fs = std::filesystem;

constexpr auto msg = testing::chat_message;

const std::string kSystem =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n";
const std::string kChannels =
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.<|end|>";

std::string render(const Json& messages, bool gen = true, HarmonyOptions o = {}) {
  auto r = render_harmony(messages, gen, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : "";
}

TEST(HarmonyRender, TheFormatsOwnExamples) {
  // harmony's test_simple_convo.txt (no date given: no date line).
  EXPECT_EQ(render(Json::array({msg("user", "What is 2 + 2?")})),
            kSystem + "\nReasoning: medium\n\n" + kChannels +
                "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant");
  // test_dropping_cot_by_default.txt's conversation: history as final channels.
  HarmonyOptions o;
  o.reasoning_effort = "high";
  o.current_date = "2021-01-01";
  EXPECT_EQ(render(Json::array({msg("user", "What is 2 + 2?"), msg("assistant", "2 + 2 equals 4."),
                                msg("user", "What about 9 / 2?")}),
                   true, o),
            kSystem + "Current date: 2021-01-01\n\nReasoning: high\n\n" + kChannels +
                "<|start|>user<|message|>What is 2 + 2?<|end|>"
                "<|start|>assistant<|channel|>final<|message|>2 + 2 equals 4.<|end|>"
                "<|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant");
}

TEST(HarmonyRender, SystemMessageIsTheDeveloperMessage) {
  HarmonyOptions o;
  o.reasoning_effort = "low";
  // The published template ends the instructions with a blank line (the
  // harmony library does not; msinfer follows the template).
  EXPECT_EQ(render(Json::array({msg("system", "Answer like a robot."), msg("user", "Hi"),
                                msg("system", "later: left out")}),
                   true, o),
            kSystem + "\nReasoning: low\n\n" + kChannels +
                "<|start|>developer<|message|># Instructions\n\nAnswer like a robot.\n\n<|end|>"
                "<|start|>user<|message|>Hi<|end|><|start|>assistant");
  // An empty system message writes no developer message.
  EXPECT_EQ(render(Json::array({msg("system", ""), msg("user", "x")}), false),
            kSystem + "\nReasoning: medium\n\n" + kChannels + "<|start|>user<|message|>x<|end|>");
}

TEST(HarmonyRender, LastAssistantTurnWithoutGenerationPrompt) {
  EXPECT_EQ(render(Json::array({msg("user", "q"), msg("assistant", "a")}), false),
            kSystem + "\nReasoning: medium\n\n" + kChannels +
                "<|start|>user<|message|>q<|end|>"
                "<|start|>assistant<|channel|>final<|message|>a<|return|>");
}

TEST(HarmonyRender, RefusesToolsAndChannelTags) {
  auto t = render_harmony(Json::array({msg("user", "q"), msg("tool", "42")}), true, {});
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("messages[1]"), std::string::npos);
  auto c = render_harmony(
      Json::array({msg("assistant", "<|channel|>final<|message|>x"), msg("user", "q")}), true, {});
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("messages[0].content"), std::string::npos);
}

// Messages of any shape render or are refused, never throw: a role that is
// no string is no role (the message is left out), a message that is no
// object is left out (found by the server fuzzer: {"role": 9223372036854775807}).
TEST(HarmonyRender, MessagesOfAnyShapeNeverThrow) {
  const Json odd =
      Json::array({Json{{"role", 9223372036854775807LL}}, Json{{"role", Json::array()}}, Json(3),
                   Json{{"role", "user"}, {"content", 7}}, msg("user", "q")});
  auto r = render_harmony(odd, true, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto plain = render_harmony(
      Json::array({Json{{"role", "user"}, {"content", ""}}, msg("user", "q")}), true, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*r, *plain);  // the odd ones left out; content 7 is no text
}

// gpt-oss's chat_template.jinja (huggingface.co/openai/gpt-oss-20b,
// Apache-2.0) is not in this repository: point MSINFER_GPT_OSS_CHAT_TEMPLATE
// at a copy to run this test.
TEST(HarmonyRender, SameTextAsThePublishedTemplate) {
  const char* path = std::getenv("MSINFER_GPT_OSS_CHAT_TEMPLATE");
  if (path == nullptr || !fs::exists(path)) {
    GTEST_SKIP() << "set MSINFER_GPT_OSS_CHAT_TEMPLATE to gpt-oss's chat_template.jinja";
  }
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto tpl = ChatTemplate::parse(ss.str());
  ASSERT_TRUE(tpl.ok()) << tpl.status().message();
  const std::time_t now = 1700000000;  // 2023-11-14 (UTC)
  // The shared corpus, whitespace, and a last assistant turn.
  std::vector<Json> conversations = testing::chat_conversations();
  conversations.push_back(Json::array(
      {msg("user", "  padded \n\n"), msg("assistant", "\n reply \n"), msg("user", "tabs\there")}));
  conversations.push_back(Json::array({msg("user", "q"), msg("assistant", "a")}));
  int compared = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    for (bool gen : {true, false}) {
      for (const char* effort : {"", "low", "medium", "high"}) {
        Json ctx{{"messages", conversations[i]}, {"add_generation_prompt", gen}};
        HarmonyOptions o;
        o.current_date = harmony_date(now);
        if (*effort != '\0') {
          ctx["reasoning_effort"] = effort;
          o.reasoning_effort = effort;
        }
        auto want = tpl->render(ctx, now);
        ASSERT_TRUE(want.ok()) << i << ": " << want.status().message();
        EXPECT_EQ(render(conversations[i], gen, o), *want)
            << "conversation " << i << " add_generation_prompt " << gen << " effort " << effort;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 96);
}

// The published directories keep the template in chat_template.jinja:
// read_chat_template_config() takes it from there, before tokenizer_config's key.
TEST(HarmonyRender, TheTemplateFileBesideTokenizerConfig) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("harmony-tpl-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|return|>"})";
  EXPECT_EQ(read_chat_template_config(dir.string()).status().code(), StatusCode::kNotFound);
  std::ofstream(dir / "chat_template.jinja") << "{{ messages[0].content }}<|start|>assistant";
  auto c = read_chat_template_config(dir.string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->source, "{{ messages[0].content }}<|start|>assistant");
  EXPECT_EQ(c->eos_token, "<|return|>");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "other"})";
  EXPECT_EQ(read_chat_template_config(dir.string())->source,
            "{{ messages[0].content }}<|start|>assistant");
  fs::remove_all(dir);
}

// ---- the parser, on the o200k tokenizer ----

fs::path tokenizer_dir() {
  return fs::path(MSINFER_SOURCE_DIR) / ".cache" / "tokenizers" / "gptoss";
}

class HarmonyParse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(tokenizer_dir() / "tokenizer.json")) return;
    auto t = model::Tokenizer::load(tokenizer_dir().string());
    ASSERT_TRUE(t.ok()) << t.status().message();
    tok_ = new model::Tokenizer(std::move(t).value());
    auto h = HarmonyTokens::of(*tok_);
    ASSERT_TRUE(h.has_value());
    ids_ = *h;
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << "no " << tokenizer_dir() << " (scripts/fetch-tokenizers)";
  }

  std::vector<int32_t> ids(const std::string& text) { return tok_->encode(text, false); }

  // Pushes every token, checking that each piece is whole UTF-8 characters
  // and holds no special token's text.
  struct Out {
    std::string reasoning, content;
    bool has_reasoning, has_content;
  };
  Out parse(const std::vector<int32_t>& tokens) {
    HarmonyParser p(*tok_, ids_);
    Out o;
    auto take = [&](const HarmonyDelta& d) {
      for (const std::string* s : {&d.reasoning, &d.content}) {
        EXPECT_EQ(model::utf8_complete_prefix(*s), s->size());
        EXPECT_EQ(s->find("<|"), std::string::npos) << *s;
      }
      o.reasoning += d.reasoning;
      o.content += d.content;
    };
    for (int32_t t : tokens) take(p.push(t));
    take(p.finish());
    o.has_reasoning = p.has_reasoning();
    o.has_content = p.has_content();
    return o;
  }

  static model::Tokenizer* tok_;
  static HarmonyTokens ids_;
};
model::Tokenizer* HarmonyParse::tok_ = nullptr;
HarmonyTokens HarmonyParse::ids_;

TEST_F(HarmonyParse, TheO200kTokenizerHasHarmonysIds) {
  EXPECT_EQ(ids_.start, 200006);
  EXPECT_EQ(ids_.end, 200007);
  EXPECT_EQ(ids_.message, 200008);
  EXPECT_EQ(ids_.channel, 200005);
  EXPECT_EQ(ids_.constrain, 200003);
  EXPECT_EQ(ids_.ret, 200002);
  EXPECT_EQ(ids_.call, 200012);
}

TEST_F(HarmonyParse, AnalysisThenFinal) {
  // As gpt-oss answers after `<|start|>assistant` (harmony's
  // test_simple_reasoning_response, with the text of its ids).
  const Out o =
      parse(ids("<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. "
                "Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4."
                "<|return|>"));
  EXPECT_EQ(o.reasoning, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
  EXPECT_EQ(o.content, "2 + 2 = 4.");
  EXPECT_TRUE(o.has_reasoning && o.has_content);
}

TEST_F(HarmonyParse, CharactersSplitAcrossTokensComeWhole) {
  // Byte-level tokens cut 🌍 and 世界 inside their UTF-8 bytes; the checks in
  // parse() see every piece whole. Token by token, the pieces join up.
  const std::string text = "Grüße 世界 🌍🌍🌍 — ok";
  std::vector<int32_t> t = ids("<|channel|>analysis<|message|>" + text + "<|end|>");
  const std::vector<int32_t> f = ids("<|start|>assistant<|channel|>final<|message|>" + text);
  t.insert(t.end(), f.begin(), f.end());
  HarmonyParser p(*tok_, ids_);
  std::vector<std::string> pieces;
  std::string reasoning, content;
  for (int32_t id : t) {
    HarmonyDelta d = p.push(id);
    reasoning += d.reasoning;
    content += d.content;
    if (!d.content.empty()) pieces.push_back(d.content);
  }
  HarmonyDelta d = p.finish();
  reasoning += d.reasoning;
  content += d.content;
  EXPECT_EQ(reasoning, text);
  EXPECT_EQ(content, text);  // generation cut off inside the final message
  EXPECT_GT(pieces.size(), 3u);
  EXPECT_EQ(parse(t).content, text);
}

TEST_F(HarmonyParse, NoFinalChannel) {
  // max_tokens ends it inside the reasoning: no content at all (null).
  const Out o = parse(ids("<|channel|>analysis<|message|>Let me think about"));
  EXPECT_EQ(o.reasoning, "Let me think about");
  EXPECT_TRUE(o.has_reasoning);
  EXPECT_FALSE(o.has_content);
  EXPECT_EQ(o.content, "");
  // Cut off in the next header: the header is dropped.
  const Out h =
      parse(ids("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin"));
  EXPECT_EQ(h.reasoning, "x");
  EXPECT_FALSE(h.has_content);
}

TEST_F(HarmonyParse, PlainTextIsContent) {
  // A model that ignores the format: its text, given at the end.
  HarmonyParser p(*tok_, ids_);
  std::string early;
  for (int32_t id : ids("Just some words, no channels.")) early += p.push(id).content;
  EXPECT_EQ(early, "");
  EXPECT_EQ(p.finish().content, "Just some words, no channels.");
  EXPECT_TRUE(p.has_content());
  EXPECT_FALSE(p.has_reasoning());
  // Text before the first harmony token is a header's: dropped.
  const Out o = parse(ids("assistant<|channel|>final<|message|>hi<|return|>"));
  EXPECT_EQ(o.content, "hi");
}

TEST_F(HarmonyParse, OtherChannelsAreContent) {
  // commentary with a recipient and a constraint (a tool call's shape), a
  // made-up channel, none at all: content; <|call|> ends the answer.
  EXPECT_EQ(parse(ids("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}"
                      "<|call|><|start|>assistant<|channel|>final<|message|>dropped"))
                .content,
            "{\"a\": 1}");
  EXPECT_EQ(parse(ids("<|channel|>weird<|message|>w<|end|><|start|>assistant<|message|>n<|end|>"))
                .content,
            "wn");
  // "analysis" must be the whole channel name.
  const Out o = parse(ids("<|channel|>analysisx<|message|>a<|end|>"));
  EXPECT_EQ(o.content, "a");
  EXPECT_FALSE(o.has_reasoning);
}

TEST_F(HarmonyParse, MalformedStreams) {
  // <|start|> missing after <|end|>: the text is a header all the same.
  Out o = parse(ids("<|channel|>analysis<|message|>r<|end|>assistant<|channel|>final<|message|>c"));
  EXPECT_EQ(o.reasoning, "r");
  EXPECT_EQ(o.content, "c");
  // <|end|> missing: <|start|> or <|channel|> inside a message ends it;
  // <|message|> inside a message is dropped.
  o =
      parse(ids("<|channel|>analysis<|message|>r1<|message|>r2<|start|>assistant<|channel|>final"
                "<|message|>c1<|channel|>analysis<|message|>r3"));
  EXPECT_EQ(o.reasoning, "r1r2r3");
  EXPECT_EQ(o.content, "c1");
  // After <|return|> nothing counts; other special tokens are never text.
  std::vector<int32_t> t = ids("<|channel|>final<|message|>a");
  t.push_back(*tok_->token_id("<|endoftext|>"));
  t.push_back(*tok_->token_id("<|reserved_200001|>"));
  const std::vector<int32_t> rest = ids("b<|return|>c<|channel|>analysis<|message|>d");
  t.insert(t.end(), rest.begin(), rest.end());
  o = parse(t);
  EXPECT_EQ(o.content, "ab");
  EXPECT_EQ(o.reasoning, "");
  // Only special tokens, in any order: no text, no crash.
  std::vector<int32_t> specials = {ids_.message, ids_.end,     ids_.channel,   ids_.message,
                                   ids_.start,   ids_.message, ids_.constrain, ids_.end};
  o = parse(specials);
  EXPECT_EQ(o.reasoning + o.content, "");
}

// A seeded random stream of harmony tokens and words: the split equals the
// one the rendered text shows (each body after `<|channel|>NAME<|message|>`).
TEST_F(HarmonyParse, RandomWellFormedStreams) {
  std::mt19937 rng(7);
  const char* words[] = {"a", " b", "é", "世", "🌍", " the", "\n"};
  for (int round = 0; round < 50; ++round) {
    std::string text, want_r, want_c;
    const int messages = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < messages; ++m) {
      const bool analysis = rng() % 2 == 0;
      if (m > 0) text += "<|start|>assistant";
      text += std::string("<|channel|>") + (analysis ? "analysis" : "final") + "<|message|>";
      std::string body;
      for (int w = static_cast<int>(rng() % 6); w > 0; --w) body += words[rng() % 7];
      text += body + (m + 1 == messages ? "<|return|>" : "<|end|>");
      (analysis ? want_r : want_c) += body;
    }
    const Out o = parse(ids(text));
    EXPECT_EQ(o.reasoning, want_r) << text;
    EXPECT_EQ(o.content, want_c) << text;
  }
}

// Garbage: seeded random mixes of every harmony token, words, pieces of
// UTF-8 characters and other special tokens. Whatever comes, no special
// token's text, no piece of a character, and nothing after <|return|>.
TEST_F(HarmonyParse, RandomGarbage) {
  std::vector<int32_t> pool = {
      ids_.start,     ids_.end, ids_.message, ids_.channel,
      ids_.constrain, ids_.ret, ids_.call,    *tok_->token_id("<|endoftext|>")};
  for (const char* w : {"analysis", "final", "assistant", " to=functions.x", " hi", "\n"}) {
    for (int32_t id : ids(w)) pool.push_back(id);
  }
  // 🌍 is F0 9F 8C 8D: byte-level tokens that hold parts of it.
  for (int32_t id : ids("🌍🌍 世界")) pool.push_back(id);
  std::mt19937 rng(11);
  for (int round = 0; round < 2000; ++round) {
    std::vector<int32_t> t(rng() % 40);
    for (int32_t& id : t) id = pool[rng() % pool.size()];
    const Out o = parse(t);  // checks every piece
    const auto ret = std::find(t.begin(), t.end(), ids_.ret);
    if (ret != t.end() && ret + 1 != t.end()) {
      const Out cut = parse(std::vector<int32_t>(t.begin(), ret + 1));
      EXPECT_EQ(o.reasoning, cut.reasoning);
      EXPECT_EQ(o.content, cut.content);
    }
  }
}

// ---- the API layer ----

TEST_F(HarmonyParse, ChatRequestsRenderHarmonyAndStopAtReturn) {
  ApiContext ctx;
  ctx.served_model_name = "m";
  ctx.tokenizer = tok_;
  ctx.harmony = &ids_;
  ctx.vocab = tok_->vocab_size();
  ctx.max_model_len = 4096;
  ApiRequest r;
  auto e = parse_request(
      R"({"messages": [{"role": "developer", "content": "Be terse."},
                       {"role": "user", "content": "Hi"}],
          "reasoning_effort": "high", "max_tokens": 8})",
      true, ctx, &r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_TRUE(r.harmony);
  HarmonyOptions o;
  o.reasoning_effort = "high";
  o.current_date = harmony_date(std::time(nullptr));
  const std::string want =
      render(Json::array({msg("system", "Be terse."), msg("user", "Hi")}), true, o);
  EXPECT_EQ(r.prompt, tok_->encode(want, false));
  EXPECT_NE(want.find("Reasoning: high"), std::string::npos);
  const auto& stops = r.sampling.stop_token_ids;
  EXPECT_NE(std::find(stops.begin(), stops.end(), ids_.ret), stops.end());
  EXPECT_NE(std::find(stops.begin(), stops.end(), ids_.call), stops.end());
  // A bad effort is a 400 naming the field, on any model.
  for (const char* bad : {R"("extreme")", "3", R"("")"}) {
    ApiRequest b;
    auto err = parse_request(
        std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": )") +
            bad + "}",
        true, ctx, &b);
    ASSERT_TRUE(err.has_value()) << bad;
    EXPECT_EQ(err->http_status, 400);
    EXPECT_EQ(err->param, "reasoning_effort");
  }
  // A completion is not harmony: no added stop tokens.
  ApiRequest c;
  ASSERT_FALSE(parse_request(R"({"prompt": "Hi", "max_tokens": 4})", false, ctx, &c).has_value());
  EXPECT_FALSE(c.harmony);
  EXPECT_TRUE(c.sampling.stop_token_ids.empty());
}

}  // namespace
}  // namespace msinfer::server
