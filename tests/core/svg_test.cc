#include "msinfer/core/svg.h"

#include <gtest/gtest.h>

namespace msinfer {
namespace {

TEST(SvgTest, EscapesTextAndWritesElements) {
  Svg s(100, 50);
  s.rect(1, 2, 3, 4, "#fff", "a<b");
  s.text(5, 6, "x & y");
  s.line(0, 0, 10, 10, "#000", 1, "4 2");
  std::string out = s.to_string();
  EXPECT_NE(out.find("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100.00\""), std::string::npos);
  EXPECT_NE(out.find("<title>a&lt;b</title>"), std::string::npos);
  EXPECT_NE(out.find(">x &amp; y</text>"), std::string::npos);
  EXPECT_NE(out.find("stroke-dasharray=\"4 2\""), std::string::npos);
  EXPECT_EQ(out.substr(out.size() - 7), "</svg>\n");
}

TEST(SvgTest, WriteToBadPathFails) {
  Svg s(10, 10);
  EXPECT_FALSE(s.write_file("/nonexistent/dir/x.svg").ok());
}

}  // namespace
}  // namespace msinfer
