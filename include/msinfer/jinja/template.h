// A Jinja interpreter for the subset that Hugging Face chat templates use,
// rendering the way the reference renderer @huggingface/jinja does where
// Python's Jinja and it differ (the tests compare the two byte for byte):
// the whole-template whitespace pre-pass (trim_blocks, lstrip_blocks, '-'
// markers), strip()/lstrip()/rstrip() trimming all whitespace whatever their
// argument, booleans printed as true/false, none printed as nothing.
//
// Supported: {{ }}, {% %}, {# #} with whitespace control (-), trim_blocks and
// lstrip_blocks (as transformers and @huggingface/jinja render chat
// templates); if/elif/else, for (loop.index, index0, first, last, length,
// revindex; else; filters on the iterable via `if`), set (names, namespace
// attributes, block set), macro and call of macros; expressions with
// literals, lists, dicts, attribute and item access, slices, calls,
// arithmetic, comparison, and/or/not, in / not in, ~, the ternary
// `a if c else b`, tests (is defined, none, string, number, mapping, ...),
// filters (length, tojson, trim, upper, lower, title, capitalize, default,
// join, first, last, list, reverse, string, int, float, abs, items, indent,
// replace, selectattr/rejectattr/map/select/reject with simple arguments,
// unique, sort), string methods (startswith, endswith, split, strip, lstrip,
// rstrip, upper, lower, replace, title, format is not), dict methods (get,
// items, keys, values), namespace(), range(), raise_exception(),
// strftime_now().
//
// Thread safety: a parsed Template is immutable; render() is const and may
// be called from many threads at once.
//
// Every render is bounded (RenderOptions): its work in steps, the size of
// its text and of every string and list it builds, and optionally a
// deadline. A template comes from a model directory, so these bound what an
// operator's template costs one request; they never change what a template
// renders within them.
//
// Depends on core only (Status, Json): the server's ChatTemplate is built on
// it, and nothing here knows of chats or of the server.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::jinja {

// What one render may spend; past a limit the render fails with an error
// naming it (RESOURCE_EXHAUSTED for the steps and the size,
// DEADLINE_EXCEEDED past the deadline), so a template can neither hang nor
// exhaust memory.
struct RenderOptions {
  // The defaults leave room for conversations far longer than any context:
  // the real templates (Qwen3's, DeepSeek-V3's) take about 65 steps per
  // message and one per 10 bytes of content, so a 128K-token conversation of
  // 5-token messages (25K of them) takes under 2M steps, and 4 MiB of
  // content 0.5M. 10M steps are at most about a second of work. The size
  // bound is eight times the default request body limit (4 MiB): a template
  // that writes each message's content a few times over still fits, and a
  // render holds only a few values that large.
  static constexpr int64_t kDefaultMaxSteps = 10'000'000;
  static constexpr size_t kDefaultMaxBytes = size_t{32} << 20;

  // strftime_now(format) formats this, in local time; unset: the time of the
  // render.
  std::optional<std::time_t> now;
  // Units of work: one per statement run, expression evaluated, loop
  // iteration and macro call, one per 64 bytes copied into a string, and one
  // per item a filter or loop copies or compares.
  int64_t max_steps = kDefaultMaxSteps;
  // Bytes of the rendered text, of any one string, and of any one list (its
  // items and the strings they hold) that the render builds: `~`, `+`, `*`,
  // join, replace, indent, tojson, range(), a macro's or a block set's text.
  size_t max_bytes = kDefaultMaxBytes;
  // A render still running at this time fails (looked at every few thousand
  // steps, so within a millisecond or so of it).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

class Template {
 public:
  Template();
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // INVALID_ARGUMENT naming the line for a syntax error.
  static StatusOr<Template> parse(const std::string& source);
  // Whether this came from parse() (a default-constructed Template renders
  // nothing: FAILED_PRECONDITION).
  bool parsed() const { return impl_ != nullptr; }
  // Renders with `context` (a JSON object) as the global variables, within
  // `options`' limits (the first two forms: the default limits).
  // INVALID_ARGUMENT for an error the template raises (raise_exception) or a
  // type error; RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED past a limit.
  // strftime_now(format) formats `now` in local time (the first form: the
  // time of the call).
  StatusOr<std::string> render(const Json& context) const;
  StatusOr<std::string> render(const Json& context, std::time_t now) const;
  StatusOr<std::string> render(const Json& context, const RenderOptions& options) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace msinfer::jinja
