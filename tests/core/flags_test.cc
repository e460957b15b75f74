#include "msinfer/core/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

namespace msinfer {
namespace {

FlagSet make() {
  FlagSet f("plan", "test command");
  f.add_string("model", "", "model name");
  f.add_int("max-gpus", 0, "cap", "MSINFER_TEST_MAX_GPUS");
  f.add_double("slo-ms", 150, "slo");
  f.add_bool("json", "json output");
  return f;
}

TEST(FlagsTest, DefaultsAndBothValueForms) {
  FlagSet f = make();
  ASSERT_TRUE(f.parse({"--model", "dbrx", "--slo-ms=80.5", "--json", "extra"}).ok());
  EXPECT_EQ(f.get_string("model"), "dbrx");
  EXPECT_DOUBLE_EQ(f.get_double("slo-ms"), 80.5);
  EXPECT_EQ(f.get_int("max-gpus"), 0);
  EXPECT_TRUE(f.get_bool("json"));
  EXPECT_TRUE(f.was_set("model"));
  EXPECT_FALSE(f.was_set("max-gpus"));
  ASSERT_EQ(f.positional().size(), 1u);
  EXPECT_EQ(f.positional()[0], "extra");
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  {
    FlagSet f = make();
    Status s = f.parse({"--modle", "x"});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("unknown flag --modle"), std::string::npos);
  }
  {
    FlagSet f = make();
    Status s = f.parse({"--slo-ms", "fast"});
    EXPECT_NE(s.message().find("--slo-ms: expected a number, got 'fast'"), std::string::npos);
  }
  {
    FlagSet f = make();
    Status s = f.parse({"--max-gpus", "1.5"});
    EXPECT_NE(s.message().find("--max-gpus: expected an integer"), std::string::npos);
  }
  {
    FlagSet f = make();
    Status s = f.parse({"--model"});
    EXPECT_NE(s.message().find("--model: missing value"), std::string::npos);
  }
  {
    FlagSet f = make();
    EXPECT_FALSE(f.parse({"--json=maybe"}).ok());
  }
}

TEST(FlagsTest, FlagOverridesEnvironmentOverridesDefault) {
  ::setenv("MSINFER_TEST_MAX_GPUS", "12", 1);
  {
    FlagSet f = make();
    ASSERT_TRUE(f.parse({}).ok());
    EXPECT_EQ(f.get_int("max-gpus"), 12);
  }
  {
    FlagSet f = make();
    ASSERT_TRUE(f.parse({"--max-gpus", "3"}).ok());
    EXPECT_EQ(f.get_int("max-gpus"), 3);
  }
  ::setenv("MSINFER_TEST_MAX_GPUS", "lots", 1);
  {
    FlagSet f = make();
    Status s = f.parse({});
    EXPECT_NE(s.message().find("MSINFER_TEST_MAX_GPUS"), std::string::npos);
  }
  ::unsetenv("MSINFER_TEST_MAX_GPUS");
}

TEST(FlagsTest, HelpListsFlagsWithDefaults) {
  FlagSet f = make();
  ASSERT_TRUE(f.parse({"--help"}).ok());
  EXPECT_TRUE(f.help_requested());
  std::string u = f.usage();
  EXPECT_NE(u.find("usage: msinfer plan"), std::string::npos);
  EXPECT_NE(u.find("--slo-ms"), std::string::npos);
  EXPECT_NE(u.find("(default 150)"), std::string::npos);
  EXPECT_NE(u.find("[env MSINFER_TEST_MAX_GPUS]"), std::string::npos);
  // A help of two lines keeps its second line in the description column.
  FlagSet two("cmd", "");
  two.add_string("mode", "", "first line\nsecond line");
  EXPECT_NE(two.usage().find("  --mode S                  first line\n" + std::string(28, ' ') +
                             "second line\n"),
            std::string::npos)
      << two.usage();
}

TEST(FlagsTest, IntegersAreReadAs64BitsAndRangeCheckedBeforeNarrowing) {
  // Issue 12 item 2: 4294967297 used to pass as 1 once cast to int.
  for (const char* v : {"4294967297", "4294967298", "2147483648", "-2147483649",
                        "9223372036854775808", "99999999999999999999"}) {
    FlagSet f = make();
    Status s = f.parse({"--max-gpus", v});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << v;
    EXPECT_NE(s.message().find("--max-gpus"), std::string::npos) << s.message();
  }
  FlagSet r("cmd", "");
  r.add_int("shards", 1, 1, 1024, "shards");
  Status s = r.parse({"--shards", "4294967298"});
  EXPECT_NE(s.message().find("out of range (valid: 1..1024)"), std::string::npos) << s.message();
  FlagSet ok("cmd", "");
  ok.add_int("seed", 0, 0, INT64_MAX, "seed");
  ASSERT_TRUE(ok.parse({"--seed", "9223372036854775807"}).ok());
  EXPECT_EQ(ok.get_int("seed"), INT64_MAX);
  EXPECT_NE(ok.usage().find("0..9223372036854775807"), std::string::npos);
}

TEST(FlagsTest, OnlyPlainDecimalNumbersAreAccepted) {
  for (const char* v : {"0x10", "1.5", "+3", " 3", "3 ", "", "1e3", "010x"}) {
    FlagSet f = make();
    EXPECT_FALSE(f.parse({"--max-gpus", v}).ok()) << "'" << v << "'";
  }
  for (const char* v : {"0x1p3", "inf", "-inf", "nan", "1e400", " 5", "5ms", ""}) {
    FlagSet f = make();
    EXPECT_FALSE(f.parse({"--slo-ms", v}).ok()) << "'" << v << "'";
  }
  FlagSet f = make();
  ASSERT_TRUE(f.parse({"--slo-ms", "1e2", "--max-gpus", "-0"}).ok());
  EXPECT_DOUBLE_EQ(f.get_double("slo-ms"), 100);
  FlagSet d("cmd", "");
  d.add_double("top-p", 1, 0, 1, "mass");
  Status s = d.parse({"--top-p", "2"});
  EXPECT_NE(s.message().find("--top-p: 2 is out of range"), std::string::npos) << s.message();
}

TEST(FlagsTest, RepeatedFlagsMustAgree) {
  {
    FlagSet f = make();
    Status s = f.parse({"--model", "dbrx", "--model=mixtral"});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--model given twice"), std::string::npos) << s.message();
  }
  {
    FlagSet f = make();
    EXPECT_FALSE(f.parse({"--json", "--json=false"}).ok());
  }
  {
    FlagSet f = make();
    ASSERT_TRUE(f.parse({"--model", "dbrx", "--model", "dbrx", "--json", "--json"}).ok());
    EXPECT_EQ(f.get_string("model"), "dbrx");
  }
  ::setenv("MSINFER_TEST_MAX_GPUS", "12", 1);
  {
    FlagSet f = make();  // the environment is a default, not a repeat
    ASSERT_TRUE(f.parse({"--max-gpus", "3"}).ok());
    EXPECT_EQ(f.get_int("max-gpus"), 3);
    EXPECT_EQ(f.origin("max-gpus"), "--max-gpus");
  }
  {
    FlagSet f = make();
    ASSERT_TRUE(f.parse({}).ok());
    EXPECT_EQ(f.origin("max-gpus"), "MSINFER_TEST_MAX_GPUS (environment)");
    EXPECT_EQ(f.origin("model"), "--model (default)");
  }
  ::unsetenv("MSINFER_TEST_MAX_GPUS");
}

}  // namespace
}  // namespace msinfer
