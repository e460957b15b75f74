#include "msinfer/core/flags.h"

#include <gtest/gtest.h>

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
}

}  // namespace
}  // namespace msinfer
