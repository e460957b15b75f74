// Strings as sequences of characters (src/jinja/internal/value.h): the
// walkers that index, slice, count and reverse without making every
// character (character_span, next_character, previous_character,
// character_count) against characters(), their definition, on random bytes
// that are mostly UTF-8 and partly not; and the template operations built on
// them against the same definition.
#include "../../src/jinja/internal/value.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "msinfer/jinja/template.h"

namespace msinfer::jinja {
namespace {

// Random text of up to 24 bytes: ASCII, 2-, 3- and 4-byte characters, and
// their pieces alone (a lead byte, a continuation byte, a byte never in UTF-8).
std::string random_text(std::mt19937& rng) {
  static const char* kPieces[] = {
      "a",    "b",        " ",        "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
      "\xc3", "\xe2\x82", "\xf0\x9f", "\x80",     "\xbf",         "\xff"};
  std::string s;
  const int n = static_cast<int>(rng() % 10);
  for (int i = 0; i < n; ++i) s += kPieces[rng() % (sizeof(kPieces) / sizeof(kPieces[0]))];
  return s;
}

TEST(Characters, WalkersAgreeWithCharacters) {
  std::mt19937 rng(43);
  for (int round = 0; round < 5000; ++round) {
    const std::string s = random_text(rng);
    const std::vector<std::string> chars = characters(s);
    const int64_t n = static_cast<int64_t>(chars.size());
    SCOPED_TRACE(::testing::PrintToString(s));
    ASSERT_EQ(character_count(s), chars.size());
    // Forward and backward, the same boundaries.
    std::vector<size_t> starts;
    for (size_t i = 0; i < s.size(); i = next_character(s, i)) starts.push_back(i);
    ASSERT_EQ(starts.size(), chars.size());
    std::vector<size_t> back;
    for (size_t e = s.size(); e > 0; e = previous_character(s, e))
      back.push_back(previous_character(s, e));
    ASSERT_EQ(std::vector<size_t>(back.rbegin(), back.rend()), starts);
    for (int64_t k = -n - 2; k <= n + 1; ++k) {
      const auto [at, len] = character_span(s, k);
      const int64_t i = k < 0 ? k + n : k;
      if (i < 0 || i >= n) {
        EXPECT_EQ(at, std::string::npos) << k;
      } else {
        ASSERT_NE(at, std::string::npos) << k;
        EXPECT_EQ(s.substr(at, len), chars[i]) << k;
      }
    }
  }
}

// Python's s[start:stop:step] over the characters.
std::string python_slice(const std::vector<std::string>& chars, std::optional<int64_t> start,
                         std::optional<int64_t> stop, int64_t step) {
  const int64_t n = static_cast<int64_t>(chars.size());
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    const int64_t i = *v < 0 ? *v + n : *v;
    return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), e = clamp(stop, step > 0 ? n : -1);
  std::string out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out += chars[i];
  return out;
}

TEST(Characters, IndexSliceAndFiltersAreThoseOfTheCharacters) {
  auto t = Template::parse(
      "{{ s[i] }}|{{ s[a:b] }}|{{ s[a:b:c] }}|{{ s[::c] }}|{{ s | length }}|{{ s | first }}|"
      "{{ s | last }}|{{ s | reverse }}|{% for x in s %}{{ x }}/{% endfor %}|"
      "{{ s | list | join('/') }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    const std::string s = random_text(rng);
    const std::vector<std::string> chars = characters(s);
    const int64_t n = static_cast<int64_t>(chars.size());
    auto pick = [&] { return static_cast<int64_t>(rng() % 13) - 6; };
    const int64_t i = pick(), a = pick(), b = pick();
    int64_t c = pick();
    if (c == 0) c = 1;
    std::string expect;
    const int64_t at = i < 0 ? i + n : i;
    if (at >= 0 && at < n) expect += chars[at];
    expect += "|" + python_slice(chars, a, b, 1) + "|" + python_slice(chars, a, b, c) + "|" +
              python_slice(chars, std::nullopt, std::nullopt, c) + "|" + std::to_string(n) + "|";
    if (n > 0) expect += chars.front();
    expect += "|";
    if (n > 0) expect += chars.back();
    expect += "|" + python_slice(chars, std::nullopt, std::nullopt, -1) + "|";
    for (const auto& x : chars) expect += x + "/";
    expect += "|";
    for (int64_t k = 0; k < n; ++k) expect += (k ? "/" : "") + chars[k];
    auto r = t->render({{"s", s}, {"i", i}, {"a", a}, {"b", b}, {"c", c}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(*r, expect) << ::testing::PrintToString(s) << " i=" << i << " a=" << a << " b=" << b
                          << " c=" << c;
  }
}

// A step so large that the next index is past int64 ends the slice (it
// overflowed, UBSan's report, and read before the list).
TEST(Characters, SliceStepsPastInt64EndTheSlice) {
  auto t = Template::parse(
      "{{ [1, 2, 3][1::9223372036854775807] }}|{{ 'abc'[1::9223372036854775807] }}|"
      "{{ [1, 2, 3][1::-9223372036854775807] }}|{{ 'abc'[2::-9223372036854775807] }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto r = t->render(Json::object());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "2|b|2|c");
}

}  // namespace
}  // namespace msinfer::jinja
