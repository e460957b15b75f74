#include "msinfer/core/status.h"

#include <gtest/gtest.h>

namespace msinfer {
namespace {

StatusOr<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value " + std::to_string(v) + " must be > 0");
  return v;
}

Status doubled(int v, int* out) {
  MSI_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = 2 * x;
  return ok_status();
}

Status chain(int v) {
  int out = 0;
  MSI_RETURN_IF_ERROR(doubled(v, &out));
  return out > 10 ? out_of_range("too big") : ok_status();
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(ok_status().ok());
  EXPECT_EQ(ok_status().to_string(), "OK");
  Status s = not_found("model.safetensors: tensor 'w1' is missing");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "NOT_FOUND: model.safetensors: tensor 'w1' is missing");
  EXPECT_EQ(s.with_context("loading").message(), "loading: model.safetensors: tensor 'w1' is missing");
  EXPECT_TRUE(ok_status().with_context("x").ok());
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  int out = 0;
  EXPECT_TRUE(doubled(3, &out).ok());
  EXPECT_EQ(out, 6);
  Status s = doubled(-1, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "value -1 must be > 0");
  EXPECT_TRUE(chain(2).ok());
  EXPECT_EQ(chain(6).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(chain(0).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, StatusOrHoldsValueOrError) {
  StatusOr<std::string> v = std::string("abc");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "abc");
  EXPECT_EQ(v->size(), 3u);
  StatusOr<std::string> e = internal_error("boom");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInternal);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> e = invalid_argument("bad");
  EXPECT_DEATH((void)e.value(), "value\\(\\) of an error");
}

}  // namespace
}  // namespace msinfer
