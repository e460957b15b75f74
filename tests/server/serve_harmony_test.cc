// `msinfer serve` with a gpt-oss model and the o200k tokenizer (harmony's
// special tokens), through the official openai npm client: the chat's prompt
// is the harmony rendering, and the answer is split into reasoning_content
// and content as the generated tokens say, streamed or not.
//
// Random weights would answer with arbitrary tokens, never a channel header,
// so the test writes the checkpoint's embedding and lm_head rows of a few
// tokens to make the next token depend on the current one only (a Markov
// chain over harmony's grammar: `<|channel|>` -> analysis | final ->
// `<|message|>` -> words -> more words | `<|end|>` | `<|return|>`, `<|end|>`
// -> `<|start|>` -> assistant -> `<|channel|>`). Sampled with a seed, each
// answer is a random, well-formed harmony stream; the test checks the split
// against the tokens the same answer reports as logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <regex>

#include "../common/serve_process.h"
#include "msinfer/core/bf16.h"
#include "msinfer/core/json.h"
#include "msinfer/model/tokenizer.h"

namespace msinfer {
namespace {

using testing::kBin;
using testing::node_modules;
using testing::Server;
using testing::source_dir;
namespace fs = std::filesystem;

fs::path tokenizer_dir() { return source_dir() / ".cache" / "tokenizers" / "gptoss"; }

// Rewrites rows of two bf16 [vocab, hidden] tensors of a safetensors file in place.
struct Safetensors {
  std::string path;
  std::string bytes;
  Json header;
  size_t data_at = 0;
  bool load(const std::string& p) {
    path = p;
    // One read: the file holds two 200k-row tensors, and a character at a
    // time took seconds under ASan.
    std::ifstream f(p, std::ios::binary | std::ios::ate);
    if (!f) return false;
    bytes.resize(static_cast<size_t>(f.tellg()));
    f.seekg(0);
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f || bytes.size() < 8) return false;
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    header = Json::parse(bytes.substr(8, n));
    data_at = 8 + n;
    return true;
  }
  uint16_t* tensor(const std::string& name, int64_t* rows, int64_t* cols) {
    const Json& t = header.at(name);
    EXPECT_EQ(t.at("dtype"), "BF16") << name;
    *rows = t.at("shape")[0];
    *cols = t.at("shape").size() > 1 ? t.at("shape")[1].get<int64_t>() : 1;
    return reinterpret_cast<uint16_t*>(bytes.data() + data_at +
                                       t.at("data_offsets")[0].get<size_t>());
  }
  void save() { std::ofstream(path, std::ios::binary) << bytes; }
};

class ServeHarmony : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(tokenizer_dir() / "tokenizer.json") || !fs::exists(node_modules() / "openai")) {
      return;
    }
    dir_ = new fs::path(fs::path(::testing::TempDir()) /
                        ("msinfer-harmony-" + std::to_string(::getpid())));
    ASSERT_EQ(std::system((kBin + " make-model --preset tiny-gpt-oss --tokenizer " +
                           tokenizer_dir().string() + " --out " + dir_->string() + " >/dev/null")
                              .c_str()),
              0);
    auto tok = model::Tokenizer::load(dir_->string());
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tokenizer_ = new model::Tokenizer(std::move(tok).value());
    auto id = [&](const std::string& text) {
      const std::vector<int32_t> v = tokenizer_->encode(text, false);
      EXPECT_EQ(v.size(), 1u) << "'" << text << "' is not one token";
      return v.empty() ? 0 : v[0];
    };
    const int32_t channel = id("<|channel|>"), message = id("<|message|>"), end = id("<|end|>"),
                  start = id("<|start|>"), ret = id("<|return|>"), assistant = id("assistant"),
                  analysis = id("analysis"), final_ = id("final"), hi = id(" Hi"),
                  there = id(" there"), world = id(" 世界"), bang = id("!");
    // Successors and their weights (probability proportional).
    const std::map<int32_t, std::vector<std::pair<int32_t, double>>> next = {
        {assistant, {{channel, 1}}},
        {channel, {{analysis, 1}, {final_, 1}}},
        {analysis, {{message, 1}}},
        {final_, {{message, 1}}},
        {message, {{hi, 1}, {there, 1}, {world, 1}, {bang, 1}}},
        {hi, {{there, 2}, {world, 2}, {bang, 2}, {end, 1}, {ret, 0.4}}},
        {there, {{hi, 2}, {world, 2}, {bang, 2}, {end, 1}, {ret, 0.4}}},
        {world, {{hi, 2}, {there, 2}, {bang, 2}, {end, 1}, {ret, 0.4}}},
        {bang, {{hi, 2}, {there, 2}, {world, 2}, {end, 1}, {ret, 0.4}}},
        {end, {{start, 1}}},
        {start, {{assistant, 1}}},
    };
    Safetensors st;
    ASSERT_TRUE(st.load((*dir_ / "model.safetensors").string()));
    int64_t V = 0, H = 0, V2 = 0, H2 = 0, one = 0, hn = 0;
    uint16_t* embed = st.tensor("model.embed_tokens.weight", &V, &H);
    uint16_t* head = st.tensor("lm_head.weight", &V2, &H2);
    uint16_t* norm = st.tensor("model.norm.weight", &hn, &one);
    ASSERT_EQ(V, V2);
    ASSERT_EQ(H, H2);
    ASSERT_LE(static_cast<int64_t>(next.size()), H);
    auto put = [](uint16_t* at, float v) {
      const bf16 b = float_to_bf16(v);
      std::memcpy(at, &b, 2);
    };
    auto get = [](const uint16_t* at) {
      bf16 b;
      std::memcpy(&b, at, 2);
      return bf16_to_float(b);
    };
    // Token x's embedding: 1000 along axis k(x), so that the residual
    // stream (what the layers add is O(1)) is that axis, and the final norm
    // makes it sqrt(H) * norm[k] there. lm_head's row y: logit 30 + ln(w)
    // for each x with successor y, 0 for every other token.
    std::memset(head, 0, static_cast<size_t>(V * H) * 2);
    int k = 0;
    for (const auto& [x, succ] : next) {
      for (int64_t c = 0; c < H; ++c) put(embed + x * H + c, c == k ? 1000.f : 0.f);
      const float scale = std::sqrt(static_cast<float>(H)) * get(norm + k);
      for (const auto& [y, w] : succ) {
        put(head + y * H + k, (30.f + static_cast<float>(std::log(w))) / scale);
      }
      ++k;
    }
    st.save();
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) {
      std::error_code ec;
      fs::remove_all(*dir_, ec);
    }
    delete dir_;
    dir_ = nullptr;
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) {
      GTEST_SKIP() << "needs .cache/tokenizers/gptoss (scripts/fetch-tokenizers) and the openai "
                      "npm client (scripts/fetch-js-clients)";
    }
    ASSERT_NE(tokenizer_, nullptr) << "the suite's set-up failed";
  }
  void expect_harmony_chats(const std::string& deployment);
  static fs::path* dir_;
  static model::Tokenizer* tokenizer_;  // the model's (o200k): loading it takes seconds under ASan
};
fs::path* ServeHarmony::dir_ = nullptr;
model::Tokenizer* ServeHarmony::tokenizer_ = nullptr;

// The split the tokens say: each body after `<|channel|>NAME<|message|>` up
// to the next special token; analysis bodies are the reasoning, final
// bodies the content (null: no such message).
struct Split {
  Json reasoning, content;
};
Split split(const std::string& raw) {
  Split s;
  static const std::regex body(R"(<\|channel\|>(\w+)<\|message\|>((?:(?!<\|)[\s\S])*))");
  for (auto it = std::sregex_iterator(raw.begin(), raw.end(), body); it != std::sregex_iterator();
       ++it) {
    Json& side = (*it)[1] == "analysis" ? s.reasoning : s.content;
    side = (side.is_null() ? std::string() : side.get<std::string>()) + (*it)[2].str();
  }
  return s;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
  return buf;
}

// Serves the model with `deployment` and checks the chats of 8 seeds.
void ServeHarmony::expect_harmony_chats(const std::string& deployment) {
  Server s("--max-num-seqs 4 " + deployment, *dir_);
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  std::string user;
  for (int i = 0; i < 30; ++i) user += "The quick brown fox jumps over the lazy dog. ";
  const Json messages = Json::array({{{"role", "system"}, {"content", "Answer in one word."}},
                                     {{"role", "user"}, {"content", user}}});
  // The prompt the chat must be, written out (OpenAI's harmony format, as
  // gpt-oss's published template renders it).
  const std::string prompt =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\nCurrent date: " +
      today() +
      "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be "
      "included for every message.<|end|><|start|>developer<|message|># Instructions\n\n"
      "Answer in one word.\n\n<|end|><|start|>user<|message|>" +
      user + "<|end|><|start|>assistant";
  const int64_t prompt_tokens = static_cast<int64_t>(tokenizer_->encode(prompt, false).size());
  // A completion of that text and more first: its KV blocks go to the prefix
  // cache, and the chat's prompt finds every whole block of it there only if
  // its tokens are the same.
  const std::string model = dir_->filename().string();
  auto warm = testing::post(
      s, "/v1/completions",
      Json{{"model", model},
           {"prompt", prompt + " and some more words after it, as many as a block holds. " + user},
           {"max_tokens", 1},
           {"add_special_tokens", false}}
          .dump());
  ASSERT_EQ(warm.status, 200) << warm.body;

  const std::string out = testing::run_capture(
      "node " + (source_dir() / "tests" / "server" / "openai_harmony.js").string() + " " +
      node_modules().string() + " " + s.url() + " " + model + " '" + messages.dump() +
      "' 40 1 2 3 4 5 6 7 8");
  ASSERT_FALSE(out.empty()) << s.stderr_text();
  const Json r = Json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object() && r.contains("answers")) << out;
  int both = 0, returned = 0;
  for (const Json& a : r["answers"]) {
    SCOPED_TRACE("seed " + a["seed"].dump());
    const Json& p = a["plain"];
    EXPECT_EQ(p["usage"]["prompt_tokens"], prompt_tokens);
    if (a["seed"] == 1) {
      EXPECT_EQ(p["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
                (prompt_tokens - 1) / 128 * 128);
    }
    std::string raw;
    for (const Json& t : p["tokens"]) raw += t.get<std::string>();
    const Split want = split(raw);
    EXPECT_EQ(p["reasoning_content"], want.reasoning) << raw;
    EXPECT_EQ(p["content"], want.content) << raw;
    EXPECT_EQ(p["usage"]["completion_tokens"], p["tokens"].size());
    const bool stopped = !p["tokens"].empty() && p["tokens"].back() == "<|return|>";
    EXPECT_EQ(p["finish_reason"], stopped ? "stop" : "length") << raw;
    // Streamed, with and without logprobs: the same answer in pieces.
    for (const char* key : {"stream", "stream_logprobs"}) {
      const Json& st = a[key];
      EXPECT_EQ(st["reasoning_content"], want.reasoning.is_null() ? "" : want.reasoning) << key;
      EXPECT_EQ(st["content"], want.content.is_null() ? "" : want.content) << key;
      EXPECT_EQ(st["finish_reason"], p["finish_reason"]) << key;
      EXPECT_EQ(st["usage"]["prompt_tokens"], prompt_tokens) << key;
      EXPECT_EQ(st["usage"]["completion_tokens"], p["tokens"].size()) << key;
    }
    both += !want.reasoning.is_null() && !want.content.is_null();
    returned += stopped;
  }
  // The chain gave each case at least once over the seeds.
  EXPECT_GT(both, 0);
  EXPECT_GT(returned, 0);
  EXPECT_EQ(r["effort"]["low"]["status"], 200);
  EXPECT_EQ(r["effort"]["high"]["status"], 200);
  EXPECT_EQ(r["effort"]["extreme"]["status"], 400);
  EXPECT_EQ(r["effort"]["extreme"]["param"], "reasoning_effort");
}

TEST_F(ServeHarmony, ChatsAreHarmonyAndAnswersSplitByChannel) { expect_harmony_chats(""); }

// The same through a disaggregated deployment: the split is the server's,
// the tokens come from attention and expert workers (two micro-batches, the
// experts over two workers).
TEST_F(ServeHarmony, DisaggregatedChatsAreSplitTheSameWay) {
  expect_harmony_chats("--attention-workers 1 --expert-workers 2 --micro-batches 2");
}

}  // namespace
}  // namespace msinfer
