// The chain hash of automatic prefix caching, in one place for both of its
// users: an attention worker's KvCache registers its full blocks under it,
// and the router computes a request's chain to find the replica that holds
// the longest prefix of it (docs/RUNTIME.md, "Cache-aware routing").
//
// Block i of a token sequence (tokens [i * block_size, (i + 1) *
// block_size)) hashes to prefix_block_hash(hash of block i - 1, its tokens);
// block 0's parent is the salt (KvCache::prefix_salt(): what else changes the
// K/V of a token sequence, the model, weights and device). Equal hashes of
// two chains mean, up to a collision, equal tokens from the start on.
#pragma once

#include <cstdint>
#include <vector>

namespace msinfer::runtime {

// splitmix64 over the parent and each of the block's `block_size` token ids.
uint64_t prefix_block_hash(uint64_t parent, const int32_t* block_tokens, int64_t block_size);

// The chain hashes of the full blocks of tokens[0..n) that a new sequence can
// take from a cache: (n - 1) / block_size of them (a sequence computes at
// least its last token; KvCache::cached_prefix_blocks).
std::vector<uint64_t> prefix_chain_hashes(uint64_t salt, const int32_t* tokens, int64_t n,
                                          int64_t block_size);

}  // namespace msinfer::runtime
