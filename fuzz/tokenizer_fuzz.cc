// libFuzzer target for the tokenizer.json reader; an accepted tokenizer also
// encodes and decodes a fixed text. Run by fuzz/run.
#include "json_fuzz.h"
#include "msinfer/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = msinfer::fuzz::parse(data, size);
  if (!j) return 0;
  auto t = msinfer::model::Tokenizer::from_json(*j, nullptr, "tokenizer.json");
  if (t.ok()) {
    auto ids = t->encode("Hello world, 123 \xc3\xa9t\xc3\xa9!");
    (void)t->decode(ids, false);
  }
  return 0;
}
