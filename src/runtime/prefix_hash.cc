#include "msinfer/runtime/prefix_hash.h"

#include <cstddef>

namespace msinfer::runtime {

uint64_t prefix_block_hash(uint64_t parent, const int32_t* t, int64_t block_size) {
  // splitmix64 over the parent and each token: a chain differs if any
  // token before its end does.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent);
  for (int64_t i = 0; i < block_size; ++i) h = mix(h ^ static_cast<uint32_t>(t[i]));
  return h;
}

std::vector<uint64_t> prefix_chain_hashes(uint64_t salt, const int32_t* tokens, int64_t n,
                                          int64_t block_size) {
  std::vector<uint64_t> out;
  if (block_size <= 0 || n <= 0) return out;
  const int64_t blocks = (n - 1) / block_size;
  out.reserve(static_cast<size_t>(blocks));
  uint64_t h = salt;
  for (int64_t i = 0; i < blocks; ++i) {
    h = prefix_block_hash(h, tokens + i * block_size, block_size);
    out.push_back(h);
  }
  return out;
}

}  // namespace msinfer::runtime
