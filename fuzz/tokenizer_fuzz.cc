// libFuzzer target for the tokenizer.json reader; an accepted tokenizer also
// encodes and decodes a fixed text, and the bytes after the input's first
// NUL, if any (the JSON is what comes before it): any bytes, UTF-8 or not,
// as a chat template's output can be. Run by fuzz/run.
#include <cstring>

#include "json_fuzz.h"
#include "msinfer/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_size = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  auto j = msinfer::fuzz::parse(data, json_size);
  if (!j) return 0;
  auto t = msinfer::model::Tokenizer::from_json(*j, nullptr, "tokenizer.json");
  if (t.ok()) {
    auto ids = t->encode("Hello world, 123 \xc3\xa9t\xc3\xa9!");
    (void)t->decode(ids, false);
    if (nul != nullptr) {
      const std::string_view text(reinterpret_cast<const char*>(nul + 1), size - json_size - 1);
      (void)t->decode(t->encode(text), false);
    }
  }
  return 0;
}
