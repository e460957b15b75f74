#include "msinfer/core/json.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <thread>

namespace msinfer {
namespace {

TEST(JsonTest, ParseErrorNamesTheSource) {
  auto j = parse_json("{\"a\": 1,", "plan.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(j.status().message().find("plan.json: not valid JSON"), std::string::npos);
}

TEST(JsonTest, ReadMissingFileIsNotFound) {
  auto j = read_json_file("/nonexistent/dir/x.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kNotFound);
  EXPECT_NE(j.status().message().find("/nonexistent/dir/x.json"), std::string::npos);
}

TEST(JsonTest, WriteThenReadRoundTrips) {
  std::string path = ::testing::TempDir() + "/json_test_roundtrip.json";
  Json j{{"a", 1}, {"b", {1.5, 2.5}}};
  ASSERT_TRUE(write_json_file(path, j).ok());
  auto back = read_json_file(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, j);
  std::remove(path.c_str());
}

// A regular file is read in one piece of its size; what has no size (a
// pipe), nothing (an empty file) or is no file (a directory) still reads as
// before: the pipe to its end, the others as invalid JSON naming the path.
TEST(JsonTest, ReadsFilesPipesAndRefusesWhatIsNoJson) {
  const std::string dir = ::testing::TempDir();
  Json big = Json::object();
  for (int i = 0; i < 20000; ++i) big["token" + std::to_string(i)] = i;  // ~330 KB
  ASSERT_TRUE(write_json_file(dir + "/big.json", big).ok());
  auto back = read_json_file(dir + "/big.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, big);

  const std::string fifo = dir + "/pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo) << big.dump(); });
  auto piped = read_json_file(fifo);
  writer.join();
  ASSERT_TRUE(piped.ok()) << piped.status().to_string();
  EXPECT_EQ(*piped, big);

  std::ofstream(dir + "/empty.json").close();
  for (const std::string& bad : {dir + "/empty.json", dir}) {
    auto r = read_json_file(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad + ": not valid JSON"), std::string::npos)
        << r.status().message();
  }
}

TEST(JsonFieldsTest, TypedFieldsAndErrorsNameWhereAndKey) {
  Json j = Json::parse(R"({"n": 2.5, "i": 7, "f": 3.0, "s": "x", "b": true, "o": {"k": -1},
                           "bad": "nope", "nul": null})");
  JsonFields f(j, "catalog.json: gpus[1] (A100)");
  EXPECT_TRUE(f.expect_object().ok());
  EXPECT_DOUBLE_EQ(*f.number("n"), 2.5);
  EXPECT_EQ(*f.integer("i"), 7);
  EXPECT_EQ(*f.integer("f"), 3);  // an integral float is accepted
  EXPECT_EQ(*f.string("s"), "x");
  EXPECT_TRUE(*f.boolean("b"));
  EXPECT_DOUBLE_EQ(*f.number_or("missing", 4.0), 4.0);
  EXPECT_DOUBLE_EQ(*f.number_or("nul", 4.0), 4.0);
  EXPECT_FALSE(f.has("nul"));

  auto missing = f.number("memory_gb");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "catalog.json: gpus[1] (A100): field 'memory_gb' is missing");
  auto mistyped = f.number("bad");
  ASSERT_FALSE(mistyped.ok());
  EXPECT_NE(mistyped.status().message().find("field 'bad' must be a number"), std::string::npos);
  EXPECT_FALSE(f.number_or("bad", 1.0).ok());  // present but mistyped is still an error
  EXPECT_FALSE(f.integer("n").ok());
  EXPECT_FALSE(f.string("i").ok());

  auto o = f.object("o");
  ASSERT_TRUE(o.ok());
  auto neg = o->positive("k");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("catalog.json: gpus[1] (A100).o: field 'k' must be > 0"),
            std::string::npos);
  auto low = f.integer_at_least("i", 8);
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find("must be >= 8, got 7"), std::string::npos);
}

TEST(JsonFieldsTest, NonObjectIsReported) {
  Json j = Json::array();
  JsonFields f(j, "x.json");
  EXPECT_FALSE(f.expect_object().ok());
  EXPECT_FALSE(f.number("a").ok());
}

}  // namespace
}  // namespace msinfer
