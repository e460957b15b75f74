// The HTTP loop's text work per streamed token: model::StreamingDecoder::push
// (a decode of the window of ids) over a mixed text (ASCII, accents, CJK,
// emoji), per tokenizer.json given. Prints the best of 7 passes in
// microseconds per token. Built against a build tree's libraries:
//   g++ -std=c++20 -O2 -Iinclude bench/standalone/streaming_decode_bench.cc \
//     build/src/model/libmsinfer_model.a build/src/core/libmsinfer_core.a \
//     $(pkg-config --libs libpcre2-8 icu-uc) -o /tmp/streaming_decode_bench
//   /tmp/streaming_decode_bench .cache/tokenizers/*/tokenizer.json
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "msinfer/model/tokenizer.h"

using namespace msinfer;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON...\n", argv[0]);
    return 2;
  }
  for (int a = 1; a < argc; ++a) {
    auto t = model::Tokenizer::load(argv[a]);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().message().c_str());
      return 1;
    }
    std::string text;
    for (int i = 0; i < 40; ++i) {
      text +=
          "The quick brown fox jumps over the lazy dog; na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 "
          "\xe6\x9d\xb1\xe4\xba\xac is big, \xf0\x9f\x98\x80 emoji. ";
    }
    const std::vector<int32_t> ids = t->encode(text, false);
    std::string out;
    double best_us = 1e30;
    for (int pass = 0; pass < 7; ++pass) {
      out.clear();
      model::StreamingDecoder d(*t);
      const auto t0 = std::chrono::steady_clock::now();
      for (int32_t id : ids) out += d.push(id);
      out += d.finish();
      const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
      best_us = std::min(best_us, dt.count() / static_cast<double>(ids.size()));
    }
    std::printf("%s: %zu tokens, %.3f us per token%s\n", argv[a], ids.size(), best_us,
                out == text ? "" : " (the text did not come back whole)");
  }
}
