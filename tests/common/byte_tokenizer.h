// A tokenizer of the 256 bytes (byte-level BPE, no merges): token t is byte
// t, so a test's texts and token ids read alike.
#pragma once

#include <cstdint>
#include <utility>

#include "msinfer/core/json.h"
#include "msinfer/model/tokenizer.h"

namespace msinfer::testing {

inline const model::Tokenizer& byte_tokenizer() {
  static const model::Tokenizer t = [] {
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[model::byte_level_char(static_cast<uint8_t>(b))] = b;
    Json tj{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
            {"decoder", {{"type", "ByteLevel"}}}};
    return std::move(model::Tokenizer::from_json(tj, nullptr, "t")).value();
  }();
  return t;
}

}  // namespace msinfer::testing
