#include "msinfer/core/table.h"

#include <gtest/gtest.h>

namespace msinfer {
namespace {

TEST(TableTest, AlignsNumbersRightAndTextLeft) {
  Table t({"name", "value"});
  t.add_row({"a", "1.5"});
  t.add_row({"long name", "123.25"});
  EXPECT_EQ(t.to_string(),
            "name       value\n"
            "-----------------\n"
            "a             1.5\n"
            "long name  123.25\n");
}

TEST(TableTest, ShortRowsArePadded) {
  Table t({"a", "b", "c"});
  t.add_row({"x"});
  EXPECT_EQ(t.to_string(), "a  b  c\n-------\nx\n");
}

TEST(FormatTest, Numbers) {
  EXPECT_EQ(fmt(3.14159, 2), "3.14");
  EXPECT_EQ(fmt(2.0, 0), "2");
  EXPECT_EQ(fmt_pct(0.875), "87.5%");
  EXPECT_EQ(fmt_si(1234567), "1.23M");
  EXPECT_EQ(fmt_si(999), "999");
  EXPECT_EQ(fmt_si(45600), "45.6k");
}

}  // namespace
}  // namespace msinfer
