// A render's limits (jinja::RenderOptions): steps, the size of the text and
// of every string and list the template builds, the deadline. Each limit is
// tried with small values, where the same template renders when the limit
// is raised, so the test fails if a limit does not hold or holds too soon.
#include "msinfer/jinja/template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace msinfer::jinja {
namespace {

StatusOr<std::string> render(const std::string& src, const RenderOptions& o,
                             const Json& ctx = Json::object()) {
  MSI_ASSIGN_OR_RETURN(Template t, Template::parse(src));
  return t.render(ctx, o);
}

RenderOptions limits(int64_t steps, size_t bytes) {
  RenderOptions o;
  o.max_steps = steps;
  o.max_bytes = bytes;
  return o;
}

// The status of a render that must fail with `code`, its message holding `says`.
void expect_fails(const StatusOr<std::string>& r, StatusCode code, const std::string& says) {
  ASSERT_FALSE(r.ok()) << "rendered " << r->size() << " bytes";
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
}

TEST(RenderLimits, LoopsPastTheStepLimitFail) {
  const std::string nested =
      "{% for a in range(100) %}{% for b in range(100) %}{% if b is odd %}x{% endif %}"
      "{% endfor %}{% endfor %}";
  expect_fails(render(nested, limits(20000, 1 << 20)), StatusCode::kResourceExhausted,
               "step limit (20000 steps");
  auto r = render(nested, limits(1000000, 1 << 20));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, std::string(5000, 'x'));
  EXPECT_TRUE(render(nested, limits(INT64_MAX, 1 << 20)).ok());  // no limit, no overflow
  // Macro calls are counted too (recursion is bounded at 64 deep; a macro
  // called from a loop is not).
  const std::string calls =
      "{% macro m(n) %}{{ n }}{% endmacro %}{% for i in range(1000) %}{{ m(i) }}{% endfor %}";
  expect_fails(render(calls, limits(5000, 1 << 20)), StatusCode::kResourceExhausted, "step limit");
  EXPECT_TRUE(render(calls, limits(100000, 1 << 20)).ok());
}

TEST(RenderLimits, TextPastTheSizeLimitFails) {
  // 1000 times 10 bytes (over lists of 10: a list of 1000 would pass the
  // limit itself).
  const std::string t =
      "{% for i in range(10) %}{% for j in range(10) %}{% for k in range(10) %}0123456789"
      "{% endfor %}{% endfor %}{% endfor %}";
  expect_fails(render(t, limits(1000000, 9999)), StatusCode::kResourceExhausted,
               "the rendered text passed the size limit (9999 bytes)");
  auto r = render(t, limits(1000000, 10000));  // exactly the limit: renders
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(), 10000u);
  // A macro's text and a block set's are bounded alike.
  expect_fails(
      render("{% macro m() %}" + t + "{% endmacro %}{% set x = m() %}", limits(1000000, 5000)),
      StatusCode::kResourceExhausted, "the rendered text passed the size limit");
  expect_fails(render("{% set x %}" + t + "{% endset %}", limits(1000000, 5000)),
               StatusCode::kResourceExhausted, "the rendered text passed the size limit");
}

TEST(RenderLimits, StringsAndListsGrownPastTheSizeLimitFail) {
  const RenderOptions small = limits(1000000, 1 << 20);
  // Doubled 30 times: 1 GiB if nothing stopped it; nothing is printed.
  expect_fails(render("{% set ns = namespace(s='x') %}{% for i in range(30) %}"
                      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                      small),
               StatusCode::kResourceExhausted, "a string the template built passed the size limit");
  expect_fails(render("{% set ns = namespace(s='x') %}{% for i in range(30) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}",
                      small),
               StatusCode::kResourceExhausted, "a string the template built");
  expect_fails(render("{% set ns = namespace(l=[1]) %}{% for i in range(30) %}"
                      "{% set ns.l = ns.l + ns.l %}{% endfor %}",
                      small),
               StatusCode::kResourceExhausted, "a list the template built passed the size limit");
  // Built in one operation: repetition (an error, no longer cut at 16 MiB),
  // join, replace, indent, range(), a string's characters, split.
  expect_fails(render("{{ 'ab' * 1000000000000 }}", small), StatusCode::kResourceExhausted,
               "a string");
  EXPECT_EQ(*render("{{ '' * 9223372036854775807 }}|{{ 'ab' * 3 }}|{{ 'ab' * -1 }}", small),
            "|ababab|");
  expect_fails(render("{{ range(1000) | join('x' * 10000) }}", small),
               StatusCode::kResourceExhausted, "a string");
  expect_fails(render("{{ ('x' * 1000).replace('x', 'y' * 2000) }}", small),
               StatusCode::kResourceExhausted, "a string");
  expect_fails(render("{{ 'a' | indent(100000000) }}", small), StatusCode::kResourceExhausted,
               "a string");
  expect_fails(render("{{ range(1000000000000) | length }}", small), StatusCode::kResourceExhausted,
               "a list");
  EXPECT_EQ(*render("{{ range(1000) | length }}", small), "1000");
  expect_fails(render("{% for c in 'x' * 100000 %}{% endfor %}", small),
               StatusCode::kResourceExhausted, "a list");
  expect_fails(render("{{ (',' * 100000).split(',') | length }}", small),
               StatusCode::kResourceExhausted, "a list");
  EXPECT_EQ(*render("{{ (',' * 1000).split(',') | length }}", small), "1001");
}

// Lists share their items and a namespace can hold itself: printing either
// must stay within the limits (a list nested 40 deep has 2^40 leaves; the
// namespace recursed until the stack overflowed). The namespace that holds
// itself is emptied when the render ends, so the cycle does not outlive it
// (LeakSanitizer, in the sanitizer build, finds it otherwise).
TEST(RenderLimits, SharedAndSelfHoldingValuesPrintWithinTheLimits) {
  const RenderOptions small = limits(1000000, 1 << 20);
  expect_fails(render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                      "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
                      small),
               StatusCode::kResourceExhausted, "limit");
  expect_fails(render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                      "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l | tojson }}",
                      small),
               StatusCode::kResourceExhausted, "limit");
  expect_fails(render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | tojson }}", small),
               StatusCode::kResourceExhausted, "nested more than");
  EXPECT_EQ(
      *render("{% set ns = namespace(l=[1]) %}{% for i in range(3) %}"
              "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}|{{ [[1, [2]], 'a'] | tojson }}",
              small),
      "1,1,1,1,1,1,1,1|[[1, [2]], \"a\"]");
}

// Values nested 200000 deep (a list in a list in ..., a chain of
// namespaces) are freed without recursing that deep: that overflowed the
// stack when the render's scopes went.
TEST(RenderLimits, DeeplyNestedValuesAreFreedWithoutRecursion) {
  auto lists = render(
      "{% set ns = namespace(l=[]) %}{% for i in range(200000) %}{% set ns.l = [ns.l] %}"
      "{% endfor %}done",
      RenderOptions());
  ASSERT_TRUE(lists.ok()) << lists.status().message();
  EXPECT_EQ(*lists, "done");
  auto chain = render(
      "{% set ns = namespace(tail=namespace()) %}{% set ns.head = ns.tail %}"
      "{% for i in range(200000) %}{% set t = namespace() %}{% set ns.tail.next = t %}"
      "{% set ns.tail = t %}{% endfor %}{{ ns.head.next.next is defined }}",
      RenderOptions());
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  EXPECT_EQ(*chain, "true");
}

TEST(RenderLimits, ARenderStillRunningAtItsDeadlineFails) {
  const std::string t =
      "{% for a in range(100) %}{% for b in range(100) %}{% endfor %}{% endfor %}";
  RenderOptions o;
  o.deadline = std::chrono::steady_clock::now();  // passed by the first look at the clock
  expect_fails(render(t, o), StatusCode::kDeadlineExceeded, "deadline");
  o.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  EXPECT_TRUE(render(t, o).ok());
}

// The defaults leave room for long conversations: 20000 messages through a
// template that does what chat templates do (loops, conditions, a
// namespace, string methods).
TEST(RenderLimits, TheDefaultsRenderLongConversations) {
  Json messages = Json::array();
  for (int i = 0; i < 20000; ++i) {
    messages.push_back(
        {{"role", i % 2 ? "assistant" : "user"}, {"content", "message " + std::to_string(i)}});
  }
  const std::string t =
      "{%- set ns = namespace(n=0) -%}{%- for m in messages -%}"
      "{%- if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% endif -%}"
      "<|im_start|>{{ m.role }}\n{{ m.content.strip() | trim }}<|im_end|>\n"
      "{%- endfor -%}{{ ns.n }}";
  auto r = render(t, RenderOptions(), {{"messages", messages}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->substr(r->size() - 5), "10000");
  // And the same far past them fails, naming the limit.
  expect_fails(render(t, limits(100000, RenderOptions::kDefaultMaxBytes), {{"messages", messages}}),
               StatusCode::kResourceExhausted, "step limit");
}

}  // namespace
}  // namespace msinfer::jinja
