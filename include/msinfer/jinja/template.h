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
// Depends on core only (Status, Json): the server's ChatTemplate is built on
// it, and nothing here knows of chats or of the server.
#pragma once

#include <ctime>
#include <memory>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::jinja {

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
  // Renders with `context` (a JSON object) as the global variables.
  // INVALID_ARGUMENT for an error the template raises (raise_exception) or a
  // type error. strftime_now(format) formats `now` in local time (the first
  // form: the time of the call).
  StatusOr<std::string> render(const Json& context) const;
  StatusOr<std::string> render(const Json& context, std::time_t now) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace msinfer::jinja
