#include "msinfer/model/tokenizer.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "../common/subprocess.h"
#include "msinfer/model/make_model.h"

namespace msinfer::model {
namespace {

namespace fs = std::filesystem;

// A hand-made byte-level BPE: bytes as GPT-2 characters, merges "h e", "he l", "hel l", ...
Json byte_level_tokenizer() {
  Json vocab = Json::object();
  int id = 0;
  for (const char* t : {"h", "e", "l", "o", "\xc4\xa0" /* Ġ = space */, "w", "r", "d", "he", "hel",
                        "hell", "hello", "\xc4\xa0w", "\xc4\xa0wo"}) {
    vocab[t] = id++;
  }
  return Json{{"model",
               {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", {"h e", "he l", "hel l", "hell o", "\xc4\xa0 w", "\xc4\xa0w o"}}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"added_tokens", {{{"id", 100}, {"content", "<|end|>"}, {"special", true}}}}};
}

TEST(TokenizerTest, ByteLevelBpeMergesByRank) {
  auto t = Tokenizer::from_json(byte_level_tokenizer(), nullptr, "test");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // "hello" -> one token; " world" -> "Ġwo" + "r" + "l" + "d".
  EXPECT_EQ(t->encode("hello world"), (std::vector<int32_t>{11, 13, 6, 2, 7}));
  EXPECT_EQ(t->encode("hello<|end|>hello"), (std::vector<int32_t>{11, 100, 11}));
  EXPECT_EQ(t->decode({11, 13, 6, 2, 7}), "hello world");
  EXPECT_EQ(t->decode({11, 100}), "hello<|end|>");
  EXPECT_EQ(t->decode({11, 100}, /*skip_special_tokens=*/true), "hello");
  EXPECT_TRUE(t->is_special(100));
  EXPECT_EQ(t->token_id("hello"), 11);
  EXPECT_EQ(t->vocab_size(), 101);
}

// The byte-level decoder maps each of GPT-2's 256 characters back to its byte
// (U+0100..U+0143 are the unprintable bytes, U+0143 the last of them) and
// passes any other character through; an added token's text is not mapped.
TEST(TokenizerTest, ByteLevelDecodeMapsEveryByteAndNothingElse) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<uint8_t>(b))] = b;
  vocab["\xc5\x84"] = 256;           // U+0144, just past the map
  vocab["\xe2\x82\xac"] = 257;       // U+20AC, three bytes
  vocab["a\xc4\xa0\xc5\x83"] = 258;  // "a" + U+0120 (space) + U+0143 (0xad)
  Json j{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}}},
         {"decoder", {{"type", "ByteLevel"}}},
         {"added_tokens", {{{"id", 300}, {"content", "\xc4\xa0<x>"}, {"special", false}}}}};
  auto t = Tokenizer::from_json(j, nullptr, "test");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::vector<int32_t> all(256);
  std::string bytes;
  for (int b = 0; b < 256; ++b) {
    all[b] = b;
    bytes += static_cast<char>(b);
  }
  EXPECT_EQ(t->decode(all), bytes);
  EXPECT_EQ(t->decode({256, 257}), "\xc5\x84\xe2\x82\xac");
  EXPECT_EQ(t->decode({258}), "a \xad");
  EXPECT_EQ(t->decode({300, 258}), "\xc4\xa0<x>a \xad");
}

// Text that is not UTF-8 (a byte-level tokenizer can encode any bytes):
// the pre-tokenizer's regex matches each well-formed run on its own and each
// stray byte is a piece of its own, so every byte comes back; the
// well-formed runs are split as they would be alone. PCRE2 is never handed
// an ill-formed subject (undefined there): overlong forms, surrogates and
// code points past U+10FFFF count as ill-formed, as PCRE2's check has it.
TEST(TokenizerTest, ByteLevelKeepsEveryByteOfTextThatIsNotUtf8) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<uint8_t>(b))] = b;
  Json merges = Json::array();
  // "hi" and "Ġhi" as tokens: one piece each when the regex splits there.
  vocab["hi"] = 256;
  vocab["\xc4\xa0hi"] = 257;
  merges.push_back("h i");
  merges.push_back("\xc4\xa0 hi");
  Json j{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
         {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
         {"decoder", {{"type", "ByteLevel"}}}};
  auto t = Tokenizer::from_json(j, nullptr, "test");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  for (const std::string& text :
       {std::string("hi \xff hi"), std::string("\xc0\x80hi hi\xed\xa0\x80"),
        std::string("\xf4\x90\x80\x80 hi\xe2\x82"), std::string("\x80"),
        std::string("hi \xe2\x82\xac hi \xf0\x9f\x98\x80")}) {
    const std::vector<int32_t> ids = t->encode(text);
    EXPECT_EQ(t->decode(ids), text) << ::testing::PrintToString(ids);
  }
  // The well-formed runs around a stray byte split as they would alone.
  const std::vector<int32_t> hi = t->encode("hi hi");
  ASSERT_EQ(hi, (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(t->encode("hi hi\xffhi hi"), (std::vector<int32_t>{256, 257, 0xff, 256, 257}));
}

TEST(TokenizerTest, MalformedFilesAreErrors) {
  Json j = byte_level_tokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(Tokenizer::from_json(j, nullptr, "t.json").status().message().find("not supported"),
            std::string::npos);
  j = byte_level_tokenizer();
  j["model"]["merges"][0] = 5;
  EXPECT_FALSE(Tokenizer::from_json(j, nullptr, "t.json").ok());
  j = byte_level_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}};
  auto bad = Tokenizer::from_json(j, nullptr, "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("regex does not compile"), std::string::npos);
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json").ok());
}

// Sequences nest as deep as the file says; the parsers recursed without a
// bound, and 20,000 levels were a stack overflow (issue 43).
TEST(TokenizerTest, DeeplyNestedSequencesAreAnErrorNotACrash) {
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder"}) {
    const std::string list = std::string(key) == "normalizer"      ? "normalizers"
                             : std::string(key) == "pre_tokenizer" ? "pretokenizers"
                                                                   : "decoders";
    Json inner = Json(nullptr);
    for (int i = 0; i < 20000; ++i) {
      Json seq{{"type", "Sequence"}, {list, Json::array()}};
      if (!inner.is_null()) seq[list].push_back(std::move(inner));
      inner = std::move(seq);
    }
    Json j = byte_level_tokenizer();
    j[key] = std::move(inner);
    auto t = Tokenizer::from_json(j, nullptr, "t.json");
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_NE(t.status().message().find("nested more than"), std::string::npos)
        << t.status().message();
    // A nesting of three, as real files have at most, still loads.
    Json ok = byte_level_tokenizer();
    ok[key] = {{"type", "Sequence"},
               {list, {{{"type", "Sequence"}, {list, {{{"type", "Sequence"}, {list, Json::array()}}}}}}}};
    EXPECT_TRUE(Tokenizer::from_json(ok, nullptr, "t.json").ok()) << key;
  }
}

// A client's prompt is tokenized against a deadline: one long word costs its
// length squared, and a server must be able to give up on it.
TEST(TokenizerTest, EncodeGivesUpAtItsDeadline) {
  auto t = Tokenizer::from_json(byte_level_tokenizer(), nullptr, "test");
  ASSERT_TRUE(t.ok());
  std::string word;
  for (int i = 0; word.size() < (1 << 20); ++i) word += "hellowrd"[i * 7 % 8];
  const auto past = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  auto late = t->encode(word, true, past);
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  auto in_time = t->encode("hello world", true, std::chrono::steady_clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(in_time.ok());
  EXPECT_EQ(*in_time, t->encode("hello world"));
}

// The word cache is bounded in bytes: distinct long words (a Metaspace
// tokenizer without split makes a whole prompt one word) are not kept. 150
// prompts of 128 KiB used to leave ~94 MiB behind.
TEST(TokenizerTest, TheWordCacheDoesNotKeepLongWords) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory resident (its quarantine): RSS says nothing";
#endif
  Json j = byte_level_tokenizer();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  auto t = Tokenizer::from_json(j, nullptr, "test");
  ASSERT_TRUE(t.ok());
  auto rss = [] {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
    }
    return 0ll;
  };
  std::string word(128 << 10, 'h');
  const long long before = rss();
  for (int i = 0; i < 150; ++i) {
    for (size_t k = 0; k < word.size(); k += 97) word[k] = "helowrd"[(i + k) % 7];
    (void)t->encode(word);
  }
  ::malloc_trim(0);
  const long long after = rss();
  EXPECT_LT(after - before, 16ll << 20) << "RSS grew from " << before << " to " << after;
}

// The post_processor is optional and loosely shaped in real files; what the
// fuzzer found (a TemplateProcessing without "single", mistyped fields) must be
// a clean error or be ignored, never an abort.
TEST(TokenizerTest, PostProcessorShapes) {
  Json j = byte_level_tokenizer();
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  EXPECT_TRUE(Tokenizer::from_json(j, nullptr, "t.json").ok());
  j["post_processor"] = {{"type", 5}};
  EXPECT_FALSE(Tokenizer::from_json(j, nullptr, "t.json").ok());
  j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", 3}}}}};
  auto bad = Tokenizer::from_json(j, nullptr, "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("single[0].SpecialToken"), std::string::npos)
      << bad.status().message();
  j["post_processor"]["single"] = {{{"SpecialToken", {{"id", 7}}}}};
  EXPECT_FALSE(Tokenizer::from_json(j, nullptr, "t.json").ok());
  j["post_processor"]["single"] = {{{"SpecialToken", {{"id", "<nope>"}}}}};
  EXPECT_FALSE(Tokenizer::from_json(j, nullptr, "t.json").ok());
  // A well-formed template adds its tokens around the text.
  j["post_processor"]["single"] = {{{"SpecialToken", {{"id", "<|end|>"}}}},
                                   {{"Sequence", {{"id", "A"}}}},
                                   {{"SpecialToken", {{"id", "<|end|>"}}}}};
  auto t = Tokenizer::from_json(j, nullptr, "t.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->encode("hello"), (std::vector<int32_t>{100, 11, 100}));
}

// make-model --preset small-mixtral finds the fetched Llama-2 tokenizer from
// any working directory, not only the repository's root (issue 47).
TEST(MakeModelTest, FindsTheLlama2TokenizerOutsideTheRepository) {
  const fs::path fetched = fs::path(MSINFER_SOURCE_DIR) / ".cache/tokenizers/llama2";
  if (!fs::exists(fetched / "tokenizer.json")) GTEST_SKIP() << "run scripts/fetch-tokenizers first";
  const fs::path before = fs::current_path();
  const fs::path elsewhere =
      fs::path(::testing::TempDir()) / ("msinfer-cwd-" + std::to_string(::getpid()));
  fs::create_directories(elsewhere);
  fs::current_path(elsewhere);
  const std::string dir = model::default_llama2_tokenizer_dir();
  fs::current_path(before);
  fs::remove_all(elsewhere);
  EXPECT_TRUE(fs::path(dir).is_absolute()) << dir;
  EXPECT_TRUE(fs::exists(fs::path(dir) / "tokenizer.json")) << dir;
  // The test binary lives in the build tree under the checkout whose .cache
  // has it: found through the executable.
  EXPECT_EQ(fs::canonical(fs::path(dir) / "tokenizer.json"),
            fs::canonical(fetched / "tokenizer.json"));
}

TEST(Utf8Test, CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xe4\xbd"), 1u);      // 你 cut after 2 of 3 bytes
  EXPECT_EQ(utf8_complete_prefix("\xe4\xbd\xa0"), 3u);   // 你
  EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98"), 0u);   // 😀 cut
  // A lead byte followed by a byte that cannot continue it never completes:
  // it is a unit of its own (a random model's byte-level tokens made these,
  // and the streamed text lost the '<' after it).
  EXPECT_EQ(utf8_complete_prefix("\xe4<"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\xe4\xbd<"), 4u);
  EXPECT_EQ(utf8_complete_prefix("\xe4\xbd\xa0\xf0\x9f"), 3u);  // 你, then 😀 cut
}

// Real tokenizers fetched by scripts/fetch-tokenizers.
fs::path cache_dir() { return fs::path(MSINFER_SOURCE_DIR) / ".cache" / "tokenizers"; }


class RealTokenizerTest : public ::testing::TestWithParam<std::string> {};

// Our encode and decode against @lenml/tokenizers (transformers.js's port of HF
// tokenizers) on a corpus of code, CJK, emoji, whitespace runs and special-token text.
TEST_P(RealTokenizerTest, MatchesTheJavaScriptImplementation) {
  const fs::path dir = cache_dir() / GetParam();
  const fs::path js = cache_dir() / "lenml-tokenizers" / "dist" / "main.js";
  if (!fs::exists(dir / "tokenizer.json") || !fs::exists(js)) {
    GTEST_SKIP() << "run scripts/fetch-tokenizers first (" << dir << ")";
  }
  const fs::path corpus = fs::path(MSINFER_SOURCE_DIR) / "tests/model/data/tokenizer_corpus.json";
  const fs::path script = fs::path(MSINFER_SOURCE_DIR) / "tests/model/js_tokenize.js";
  std::string out = msinfer::testing::run_capture("node '" + script.string() + "' '" + js.string() + "' '" +
                                dir.string() + "' < '" + corpus.string() + "' 2>/dev/null");
  ASSERT_FALSE(out.empty()) << "node failed";
  auto expected = parse_json(out, "js output");
  auto texts = read_json_file(corpus.string());
  ASSERT_TRUE(expected.ok() && texts.ok());
  auto t = Tokenizer::load(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(expected->size(), texts->size());
  for (size_t i = 0; i < texts->size(); ++i) {
    const std::string text = (*texts)[i].get<std::string>();
    std::vector<int32_t> ids = t->encode(text);
    EXPECT_EQ(Json(ids), (*expected)[i]["ids"]) << GetParam() << " text #" << i << ": " << text;
    EXPECT_EQ(t->decode(ids), (*expected)[i]["text"].get<std::string>()) << "text #" << i;
  }
}

TEST_P(RealTokenizerTest, StreamingDecodeNeverSplitsACharacter) {
  const fs::path dir = cache_dir() / GetParam();
  if (!fs::exists(dir / "tokenizer.json")) GTEST_SKIP() << "run scripts/fetch-tokenizers first";
  auto t = Tokenizer::load(dir.string());
  ASSERT_TRUE(t.ok());
  const std::string text = "Hi 你好世界 😀🎉👨‍👩‍👧 naïve";
  std::vector<int32_t> ids = t->encode(text, /*add_special_tokens=*/false);
  StreamingDecoder d(*t);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    EXPECT_EQ(utf8_complete_prefix(piece), piece.size()) << "a partial character was emitted";
    streamed += piece;
  }
  streamed += d.finish();
  EXPECT_EQ(streamed, t->decode(ids, true));
  EXPECT_NE(streamed.find("你好世界 😀🎉"), std::string::npos) << streamed;
  // The decoder decodes a window, not the whole text: over the corpus (code,
  // CJK, emoji, whitespace runs, special tokens), with and without special
  // tokens, the pieces still add up to the whole decode.
  auto texts = read_json_file(
      (fs::path(MSINFER_SOURCE_DIR) / "tests/model/data/tokenizer_corpus.json").string());
  ASSERT_TRUE(texts.ok());
  for (bool skip : {true, false}) {
    for (size_t i = 0; i < texts->size(); ++i) {
      const std::vector<int32_t> all = t->encode((*texts)[i].get<std::string>());
      StreamingDecoder s(*t, skip);
      std::string out;
      for (int32_t id : all) out += s.push(id);
      out += s.finish();
      EXPECT_EQ(out, t->decode(all, skip)) << GetParam() << " text #" << i << " skip " << skip;
    }
  }
  // Ids no text encodes to: byte tokens in any order (characters cut and
  // never completed), special tokens, whitespace, ids past the vocabulary.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(t->vocab_size()) + 5);
  for (int round = 0; round < 20; ++round) {
    std::vector<int32_t> ids_r(300);
    for (int32_t& id : ids_r) id = any(rng);
    for (bool skip : {true, false}) {
      StreamingDecoder s(*t, skip);
      std::string out;
      for (int32_t id : ids_r) out += s.push(id);
      out += s.finish();
      // finish() ends a cut character with U+FFFD; everything before it is
      // the decode.
      const std::string whole = t->decode(ids_r, skip);
      const size_t kept = utf8_complete_prefix(whole);
      EXPECT_EQ(out.substr(0, kept), whole.substr(0, kept))
          << GetParam() << " round " << round << " skip " << skip;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fetched, RealTokenizerTest,
                         ::testing::Values("qwen3", "deepseek_v3", "llama2", "gptoss"));

}  // namespace
}  // namespace msinfer::model
