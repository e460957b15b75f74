#include "msinfer/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "msinfer/core/bf16.h"
#include "msinfer/core/json.h"

namespace msinfer::model {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("msinfer_st_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

struct Sample {
  std::vector<bf16> a;
  std::vector<float> b;
  std::vector<uint16_t> c;
};

Sample sample() {
  Sample s;
  for (int i = 0; i < 6; ++i) s.a.push_back(float_to_bf16(0.5f * i));
  s.b = {1.f, -2.f, 3.5f};
  s.c = {0x3c00, 0xc000};  // f16 1.0, -2.0
  return s;
}

Status write_sample(const fs::path& p, const Sample& s) {
  return write_safetensors(p.string(), {{"w.a", DType::kBF16, {2, 3}, s.a.data()},
                                        {"w.b", DType::kF32, {3}, s.b.data()},
                                        {"w.c", DType::kF16, {2}, s.c.data()}},
                           {{"format", "pt"}});
}

TEST(SafetensorsTest, WriteThenReadRoundTrips) {
  fs::path d = temp_dir("roundtrip");
  Sample s = sample();
  ASSERT_TRUE(write_sample(d / "model.safetensors", s).ok());
  auto c = Checkpoint::open(d.string());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const TensorView* a = c->find("w.a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kBF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(a->data, s.a.data(), 12), 0);
  const TensorView* b = c->find("w.b");
  EXPECT_EQ(std::memcmp(b->data, s.b.data(), 12), 0);
  EXPECT_EQ(c->find("w.c")->numel(), 2);
  EXPECT_EQ(c->find("missing"), nullptr);
  // Header is 8-byte aligned.
  std::string bytes = read_all(d / "model.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST(SafetensorsTest, ShardedWithIndex) {
  fs::path d = temp_dir("sharded");
  Sample s = sample();
  ASSERT_TRUE(write_safetensors((d / "model-00001-of-00002.safetensors").string(),
                                {{"w.a", DType::kBF16, {2, 3}, s.a.data()}}).ok());
  ASSERT_TRUE(write_safetensors((d / "model-00002-of-00002.safetensors").string(),
                                {{"w.b", DType::kF32, {3}, s.b.data()}}).ok());
  Json index{{"weight_map",
              {{"w.a", "model-00001-of-00002.safetensors"}, {"w.b", "model-00002-of-00002.safetensors"}}}};
  ASSERT_TRUE(write_json_file((d / "model.safetensors.index.json").string(), index).ok());
  auto c = Checkpoint::open(d.string());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->tensors().size(), 2u);
  // An index naming a tensor the shard lacks.
  index["weight_map"]["w.z"] = "model-00002-of-00002.safetensors";
  ASSERT_TRUE(write_json_file((d / "model.safetensors.index.json").string(), index).ok());
  auto bad = Checkpoint::open(d.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tensor 'w.z' listed in the index is missing"),
            std::string::npos);
  // A shard holding a tensor the index puts elsewhere.
  index["weight_map"].erase("w.z");
  index["weight_map"]["w.b"] = "model-00001-of-00002.safetensors";
  ASSERT_TRUE(write_json_file((d / "model.safetensors.index.json").string(), index).ok());
  EXPECT_FALSE(Checkpoint::open(d.string()).ok());
}

std::string header_file(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, CorruptFilesNameFileAndTensor) {
  struct Case {
    std::string file;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"abc", "too short"},
      {header_file("{", 0), "not valid JSON"},
      {header_file("[]", 0), "not a JSON object"},
      {header_file(R"({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})", 2),
       "tensor 't': data_offsets [0, 4] outside the 2 data bytes"},
      {header_file(R"({"t": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}})", 4),
       "tensor 't': 4 bytes for shape [3] of BF16"},
      {header_file(R"({"t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8),
       "tensor 't': dtype 'I64' is not supported"},
      {header_file(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       "shape entries must be non-negative"},
      {header_file(R"({"t": {"dtype": "F32", "shape": [1]}})", 4), "'data_offsets' must be"},
      {header_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                   8),
       "overlap"},
      // Issue 12 item 9: messages that say what is wrong.
      {header_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                   8),
       "tensor 'a' appears twice in the header"},
      {header_file(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [100, 50]}})", 200),
       "data_offsets [100, 50]: begin is after end"},
      {header_file("{\"t\xff\": 1}", 0), "\\xFF"},
  };
  for (const auto& c : cases) {
    auto r = parse_safetensors(reinterpret_cast<const uint8_t*>(c.file.data()), c.file.size(),
                               "x.safetensors");
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_NE(r.status().message().find("x.safetensors"), std::string::npos);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
  // A raw byte of the header is never copied into the message.
  const std::string ff = header_file("{\"t\xff\": 1}", 0);
  auto bad = parse_safetensors(reinterpret_cast<const uint8_t*>(ff.data()), ff.size(), "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find('\xff'), std::string::npos) << bad.status().message();
  // A directory where a safetensors file should be.
  fs::path d = temp_dir("dir_named_safetensors");
  fs::create_directories(d / "model.safetensors");
  auto c = Checkpoint::open(d.string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.safetensors: not a regular file"), std::string::npos)
      << c.status().message();
  // Header length pointing past the end.
  std::string big(8, '\0');
  big[0] = 100;
  auto r = parse_safetensors(reinterpret_cast<const uint8_t*>(big.data()), big.size(), "y");
  EXPECT_NE(r.status().message().find("exceeds the file"), std::string::npos);
}

// Every truncation and many random byte flips of a valid file: an error or a
// valid parse, never a crash (the libFuzzer target in fuzz/ goes further).
TEST(SafetensorsTest, TruncationsAndBitFlipsNeverCrash) {
  fs::path d = temp_dir("flip");
  ASSERT_TRUE(write_sample(d / "m.safetensors", sample()).ok());
  const std::string good = read_all(d / "m.safetensors");
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = parse_safetensors(reinterpret_cast<const uint8_t*>(good.data()), n, "t");
    EXPECT_FALSE(r.ok()) << "truncated to " << n;
  }
  std::mt19937 rng(1);
  int errors = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = good;
    for (int k = 0; k < 3; ++k) s[rng() % s.size()] ^= static_cast<char>(1 << (rng() % 8));
    auto r = parse_safetensors(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "t");
    errors += r.ok() ? 0 : 1;
  }
  EXPECT_GT(errors, 0);
  // A truncated file on disk is an error from Checkpoint::open too.
  write_all(d / "m.safetensors", good.substr(0, good.size() - 3));
  auto c = Checkpoint::open(d.string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("m.safetensors"), std::string::npos);
}

// Inputs the fuzzer once crashed on (fuzz/run): each must now be a clean error.
TEST(SafetensorsTest, FuzzRegressions) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(MSINFER_SOURCE_DIR) /
                                              "tests/model/data/fuzz_regressions")) {
    const std::string s = read_all(e.path());
    auto r = parse_safetensors(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "f");
    EXPECT_FALSE(r.ok()) << e.path();
    ++n;
  }
  EXPECT_GE(n, 1);
}

}  // namespace
}  // namespace msinfer::model
