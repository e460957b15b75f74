// The chat-template renderer against the reference renderer
// @huggingface/jinja (npm, run with node), byte for byte, on the templates of
// the real tokenizer packages (Qwen3, DeepSeek-V3) and those make-model
// writes (Llama-2-chat for the Llama-2 tokenizer, ChatML), over a corpus of
// conversations; plus the Jinja constructs one by one.
#include "msinfer/server/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../common/chat_conversations.h"
#include "../common/subprocess.h"
#include "msinfer/model/make_model.h"

namespace msinfer::server {
namespace {

namespace fs = std::filesystem;

fs::path source_dir() { return fs::path(MSINFER_SOURCE_DIR); }
fs::path node_modules() { return source_dir() / ".cache" / "npm" / "node_modules"; }

constexpr auto msg = testing::chat_message;

// The shared corpus, and whitespace and reasoning.
std::vector<Json> conversations() {
  std::vector<Json> all = testing::chat_conversations();
  all.push_back(Json::array({msg("user", "  padded with spaces \n\n"),
                             msg("assistant", "\n  reply  \n"), msg("user", "tabs\there")}));
  all.push_back(Json::array({msg("user", "Think first"),
                             msg("assistant", "<think>\nsome reasoning\n</think>\n\nThe answer."),
                             msg("user", "Again")}));
  return all;
}

struct Case {
  std::string name, source, bos, eos;
};

std::vector<Case> cases(const fs::path& tmp) {
  std::vector<Case> out;
  for (const char* pkg : {"qwen3", "deepseek_v3"}) {
    const fs::path dir = source_dir() / ".cache" / "tokenizers" / pkg;
    auto c = read_chat_template_config(dir.string());
    if (c.ok()) out.push_back({pkg, c->source, c->bos_token, c->eos_token});
  }
  // make-model's templates: Llama-2-chat (with the real Llama-2 tokenizer's
  // special tokens, as small-mixtral writes them) and ChatML.
  for (const char* preset : {"tiny-mixtral", "tiny-qwen3moe"}) {
    model::MakeModelOptions o;
    o.preset = preset;
    o.out_dir = (tmp / preset).string();
    EXPECT_TRUE(model::make_model(o).ok());
    auto c = read_chat_template_config(o.out_dir);
    EXPECT_TRUE(c.ok()) << preset << ": " << c.status().message();
    if (c.ok()) out.push_back({preset, c->source, c->bos_token, c->eos_token});
  }
  return out;
}

class ChatTemplateReference : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(node_modules() / "@huggingface" / "jinja")) {
      GTEST_SKIP() << "run scripts/fetch-js-clients first";
    }
    tmp_ = fs::path(::testing::TempDir()) / ("msinfer-jinja-" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  fs::path tmp_;
};

TEST_F(ChatTemplateReference, EqualsHuggingFaceJinjaByteForByte) {
  const auto all = cases(tmp_);
  ASSERT_GE(all.size(), 2u);
  int compared = 0;
  for (const auto& c : all) {
    auto t = ChatTemplate::parse(c.source);
    ASSERT_TRUE(t.ok()) << c.name << ": " << t.status().message();
    Json contexts = Json::array();
    for (const auto& conv : conversations()) {
      for (bool gen : {true, false}) {
        contexts.push_back({{"messages", conv},
                            {"bos_token", c.bos},
                            {"eos_token", c.eos},
                            {"add_generation_prompt", gen}});
      }
    }
    const fs::path in = tmp_ / (c.name + ".json");
    std::ofstream(in) << Json{{"template", c.source}, {"contexts", contexts}}.dump();
    const std::string out = testing::run_capture(
        "node " + (source_dir() / "tests" / "server" / "render_jinja.js").string() + " " +
        node_modules().string() + " " + in.string());
    ASSERT_FALSE(out.empty()) << c.name << ": node failed";
    const Json ref = Json::parse(out);
    ASSERT_EQ(ref.size(), contexts.size());
    for (size_t i = 0; i < contexts.size(); ++i) {
      auto mine = t->render(contexts[i]);
      SCOPED_TRACE(c.name + " context " + contexts[i].dump());
      if (ref[i].contains("error")) {
        EXPECT_FALSE(mine.ok()) << "the reference raised: " << ref[i]["error"];
      } else {
        ASSERT_TRUE(mine.ok()) << mine.status().message();
        EXPECT_EQ(*mine, ref[i]["text"].get<std::string>());
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 40);
}

StatusOr<std::string> render(const std::string& src, const Json& ctx = Json::object()) {
  MSI_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(src));
  return t.render(ctx);
}

TEST(ChatTemplate, Constructs) {
  EXPECT_EQ(*render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% "
                    "endif %}{% endfor %}"),
            "11,22,33");
  EXPECT_EQ(*render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i "
                    "%}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(*render("{{ 'a,b,c'.split(',')[-1] }}{{ [1,2,3][::-1] | join('-') }}"), "c3-2-1");
  EXPECT_EQ(*render("{{ x is defined }}{{ y is none }}{{ 'b' in 'abc' }}", {{"y", nullptr}}),
            "falsetruetrue");
  EXPECT_EQ(*render("{{ 'x' if a else 'y' }}{{ a | default('d') }}", {{"a", false}}), "yfalse");
  // JavaScript's loose equality, as the reference: "" == false, "1" == 1.
  EXPECT_EQ(*render("{{ '' == false }}{{ '1' == 1 }}{{ 'a' != false }}"), "truetruetrue");
  EXPECT_EQ(*render("{{ {'k': [1, 'v']} | tojson }}"), "{\"k\": [1, \"v\"]}");
  // `}}` inside a dict literal closes the literal, not the expression; the
  // lexer counts the tag's open braces (reset at each tag).
  EXPECT_EQ(*render("{{ {'a': {'b': {}}} | tojson }}|{% set d = {'x': {'y': 2}} %}{{ d.x.y }}"
                    "|{{ {} | length }}{{ '}' }}"),
            "{\"a\": {\"b\": {}}}|2|0}");
  EXPECT_FALSE(ChatTemplate::parse("{{ {'a': 1 }}").ok());
  EXPECT_EQ(*render("{%- if true -%}\n  a {{- ' b' -}}  \n{%- endif -%}\n {#- c -#} d"), "a bd");
  EXPECT_EQ(
      *render(
          "{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m('A') }}{{ m('C', b='D') }}"),
      "[AB][CD]");
  EXPECT_EQ(*render("  {%- if true -%}  x  {%- endif %}\n"), "x");
  EXPECT_EQ(*render("{% for m in ms if m.r == 'u' %}{{ m.c }}{% endfor %}",
                    {{"ms", Json::array({{{"r", "u"}, {"c", "1"}}, {{"r", "a"}, {"c", "2"}}})}}),
            "1");
}

// A string is a sequence of characters, not bytes, as in Jinja (Python):
// loops, indexing, slices, length, first, last, list and reverse never split
// a UTF-8 character ("é" is two bytes, "😀" four).
TEST(ChatTemplate, StringsAreSequencesOfCharacters) {
  const Json ctx{{"s", "h\xc3\xa9llo \xf0\x9f\x98\x80!"}};  // "héllo 😀!"
  EXPECT_EQ(*render("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[1] }}|{{ s[-2] }}", ctx),
            "\xc3\xa9l|!\xf0\x9f\x98\x80 oll\xc3\xa9h|\xc3\xa9|\xf0\x9f\x98\x80");
  EXPECT_EQ(*render("{{ s | length }}|{{ s | first }}{{ 'é' | last }}|{{ s | reverse }}", ctx),
            "8|h\xc3\xa9|!\xf0\x9f\x98\x80 oll\xc3\xa9h");
  EXPECT_EQ(*render("{% for c in s %}{{ c }}.{% endfor %}|{{ s | list | join(',') }}", ctx),
            "h.\xc3\xa9.l.l.o. .\xf0\x9f\x98\x80.!.|h,\xc3\xa9,l,l,o, ,\xf0\x9f\x98\x80,!");
}

// Integer arithmetic past int64 goes on in doubles, as the reference's
// numbers are (no signed overflow: the server fuzzer found '+' overflowing,
// UBSan's report); a whole double prints as the reference's toFixed(1) does.
// The rest stays exact integers.
TEST(ChatTemplate, IntegersPastInt64BecomeNumbersNotOverflows) {
  EXPECT_EQ(*render("{{ 9223372036854775807 + 3 }}"), "9223372036854775808.0");
  EXPECT_EQ(*render("{{ -9223372036854775807 - 3 }}"), "-9223372036854775808.0");
  EXPECT_EQ(*render("{{ 4611686018427387904 * 4 }}"), "18446744073709551616.0");
  EXPECT_EQ(*render("{{ 9223372036854775807 - 1 }}|{{ -(9223372036854775807) }}|"
                    "{{ 9223372036854775807 // 1 }}|{{ -7 // 2 }}|{{ 7 // -2 }}"),
            "9223372036854775806|-9223372036854775807|9223372036854775807|-4|-4");
  EXPECT_EQ(*render("{% set m = -9223372036854775807 - 1 %}{{ m }}|{{ -m }}|{{ m | abs }}|"
                    "{{ m // -1 }}|{{ m % -1 }}"),
            "-9223372036854775808|9223372036854775808.0|9223372036854775808.0|"
            "9223372036854775808.0|0");
  EXPECT_EQ(*render("{{ x | int }}|{{ 2.9 | int }}|{{ -2.9 | int }}", {{"x", 1e300}}),
            "1e+300|2|-2");
  EXPECT_EQ(*render("{{ range(9223372036854775806, 9223372036854775807, 2) | list | length }}"),
            "1");
}

// Numbers print as the reference (JavaScript) prints them: plain digits
// from 1e-6 up to 1e21, exponents beyond, whole floats with ".0".
TEST(ChatTemplate, NumbersPrintAsJavaScriptPrintsThem) {
  // A whole number in the context is an integer, as the reference has it
  // (Number.isInteger); past int64 it stays a double (the reference prints
  // 1e20 without ".0").
  const Json x{{"a", 1e20}, {"b", 1e21}, {"c", 0.000001}, {"d", 1e-7}, {"e", -1.5e-10}, {"w", 3.0}};
  EXPECT_EQ(*render("{{ 0.1 + 0.2 }}|{{ a }}|{{ b }}|{{ c }}|{{ d }}|{{ e }}|{{ w }}", x),
            "0.30000000000000004|100000000000000000000.0|1e+21|0.000001|1e-7|-1.5e-10|3");
  EXPECT_EQ(
      *render("{{ 2.5 }}|{{ 3.0 }}|{{ -0.0 }}|{{ [1.5, 2.0] | tojson }}|{{ [e] | tojson }}", x),
      "2.5|3.0|0.0|[1.5, 2]|[-1.5e-10]");
}

TEST(ChatTemplate, ErrorsAreStatusesNotCrashes) {
  EXPECT_FALSE(ChatTemplate::parse("{% if %}").ok());
  EXPECT_FALSE(ChatTemplate::parse("{% for x in y %}").ok());
  EXPECT_FALSE(ChatTemplate::parse("{{ 'unterminated }}").ok());
  EXPECT_FALSE(render("{{ raise_exception('no') }}").ok());
  EXPECT_FALSE(render("{{ x.y.z }}").ok());
  EXPECT_FALSE(render("{{ 1 + none }}").ok());
}

}  // namespace
}  // namespace msinfer::server

namespace msinfer::server {
namespace {

// tokenizer_config.json is the model's, but a malformed one must be an error
// (or be passed over), never an abort: a non-string `name` in the list of
// templates threw nlohmann::type_error out of `serve` (exit 134, issue 43).
TEST(ChatTemplateConfig, MistypedEntriesAreSkippedOrRefused) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("msinfer-tc-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "tokenizer_config.json") << text;
    return read_chat_template_config(dir.string());
  };
  auto named = write(R"({"chat_template": [{"name": 5, "template": "a"},
                                           {"name": "default", "template": "b"}]})");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(named->source, "b");
  auto none = write(R"({"chat_template": [{"name": null, "template": "a"}, 3, []]})");
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no 'default' entry"), std::string::npos);
  EXPECT_FALSE(write(R"({"chat_template": 7})").ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace msinfer::server
