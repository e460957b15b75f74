// Paged KV cache of one attention worker: a fixed budget of bytes split into
// blocks of `block_size` token slots, shared by all layers' K and V pools
// (bf16, layout in kernels/cpu/attention.h). With latent attention
// (kv_lora_rank > 0) there is one pool only (PagedKvLayer::v is null): one row
// per token and layer of kv_lora_rank + qk_rope_head_dim (the normed latent,
// then the roped key), shared by all heads (kv_heads 1; kernels/cpu/mla_attention.h).
// Each sequence has a block table (keyed by an id the engine chooses); blocks
// are taken as its tokens need them (Engine: admission, then one block
// whenever a sequence crosses a block boundary).
// Blocks are reference counted: fork() gives a new sequence the full blocks
// of another's prompt by reference (n samples of one prompt: prefilled once),
// and release() frees a block only when its last reference goes. A shared
// block is always full and never written again (fork copies, or leaves out,
// a partly filled last block), so no block is ever copied on write.
// free_blocks() counts every block once, however many tables hold it.
//
// Prefix caching (enable_prefix_caching): a full block whose K/V were
// computed (cache_blocks) is registered under a hash chained over (the hash
// of the block before it, its token ids; the first block's parent is the
// salt). A new sequence starts from the longest chain of registered blocks
// that matches its tokens (match_prefix), by reference, like fork. A block no
// table holds any more stays registered and counts as free: it is evicted,
// least recently released first (a sequence's blocks tail first, so a chain
// loses its end before its start), only when a block is needed and no
// unregistered one is free. K/V at a position depend only on the tokens up
// to it, so a block is the same whoever computed it; the token ids are kept
// per block and compared on a match, so a hash collision is a miss, never
// wrong K/V.
// Not thread-safe: owned and used by one engine thread.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/core/mapped_file.h"
#include "msinfer/core/model_config.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/attention.h"

namespace msinfer::runtime {

class KvCache {
 public:
  // Token slots per block. One KV head's rows of a block are contiguous
  // (block_size * head_dim bf16) and blocks are scattered over the pool, so
  // decode attention reads runs of that length: at 16 (2 KiB at head_dim 64)
  // it read 10.8-12.6 GB/s on 2 Zen 5 cores, at 128 (16 KiB) 16.3-19.6 GB/s
  // (`msinfer bench kernels --kv-block-size`, docs/BENCHMARKS.md). The cost is
  // granularity: a request holds up to block_size - 1 unused slots.
  static constexpr int64_t kDefaultBlockSize = 128;

  // RESOURCE_EXHAUSTED if the budget holds less than one block.
  // Without host_pools the blocks and tables are managed here but the K/V
  // values live elsewhere (a GPU's memory); layer() then has null pools.
  static StatusOr<KvCache> create(const ModelConfig& config, int64_t budget_bytes,
                                  int64_t block_size = kDefaultBlockSize, bool host_pools = true);

  // Bytes of K and V for one token across all layers.
  static int64_t bytes_per_token(const ModelConfig& config);

  int64_t block_size() const { return block_size_; }
  int64_t total_blocks() const { return num_blocks_; }
  // Blocks no table holds: never used or released, plus the cached ones
  // that can be evicted.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  int64_t capacity_tokens() const { return num_blocks_ * block_size_; }

  // Reserves blocks for `tokens` positions of sequence `id`; RESOURCE_EXHAUSTED
  // (nothing reserved) when they are not free now.
  Status reserve(int64_t id, int64_t tokens);
  // Drops sequence `id`'s references; a block no other table holds is free again.
  void release(int64_t id);
  const int32_t* block_table(int64_t id) const;
  // Blocks sequence `id`'s table holds, shared ones included (0 for none).
  int64_t blocks_held(int64_t id) const;
  // Tables holding `block` (0: it is free).
  int32_t block_refs(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

  // Starts sequence `child` (which must hold no table) from the K/V of the
  // first `tokens` positions of sequence `parent`: every full block among
  // them is shared (its reference count raised, nothing copied). A partly
  // filled last block is copied, in every layer, into a free block of the
  // child's own when `copy_partial`, the pools are here (host_pools()) and a
  // block is free; otherwise the child's table stops at the last full block
  // and the child must compute the rest itself. Returns the positions whose
  // K/V the child's table holds: `tokens`, or `tokens` rounded down to a
  // block. Copying the last block rather than sharing it copy-on-write: each
  // of the n sequences writes its next token into that block in the very
  // next step, so copy-on-write would copy it as often, later, and need a
  // check on every write.
  int64_t fork(int64_t parent, int64_t child, int64_t tokens, bool copy_partial);
  // Turns prefix caching on (before any table exists); `salt` starts every
  // chain: whatever else changes the K/V of a token sequence (model, weights).
  void enable_prefix_caching(uint64_t salt);
  bool prefix_caching() const { return caching_; }
  // Full blocks at the start of tokens[0..n) that are cached, at most
  // (n - 1) / block_size of them (a sequence computes at least its last token
  // to get logits, and never writes into a shared block); `evictable` (may be
  // null) gets how many of them no table holds now (they count in
  // free_blocks() until taken). 0 without prefix caching.
  int64_t cached_prefix_blocks(const int32_t* tokens, int64_t n, int64_t* evictable) const;
  // Starts sequence `id` (which must hold no table) with the blocks
  // cached_prefix_blocks() finds, by reference; returns the positions they
  // hold (a multiple of block_size, possibly 0).
  int64_t match_prefix(int64_t id, const int32_t* tokens, int64_t n);
  // Sequence `id` has the K/V of tokens[0..computed) in its blocks: registers
  // its full blocks among them not registered yet (a block whose hash another
  // block holds already stays unregistered and is freed as usual).
  void cache_blocks(int64_t id, const int32_t* tokens, int64_t computed);
  // Frees every cached block no table holds (tests; a deployment that
  // changes what the K/V mean).
  void flush_cache();
  // Registered blocks (held or not) / those no table holds.
  int64_t cached_blocks() const { return static_cast<int64_t>(cached_.size()); }
  int64_t evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  // The hash of a full block of tokens whose preceding block hashed to
  // `parent` (the salt for a first block).
  uint64_t chain_hash(uint64_t parent, const int32_t* block_tokens) const;

  // Whether the K/V pools are in this object (not a GPU's): fork() can copy.
  bool host_pools() const { return !k_.empty(); }

  kernels::cpu::PagedKvLayer layer(int l);

 private:
  struct Table {
    std::vector<int32_t> blocks;
    // Chain hash of each of the first hashes.size() blocks (full, computed).
    std::vector<uint64_t> hashes;
  };
  // A block for a new use (refs 1): an unregistered free one, else the least
  // recently released cached one, unregistered. One must be free.
  int32_t take_block();
  // Whether registered block b holds exactly these block_size tokens.
  bool holds(int32_t b, const int32_t* block_tokens) const;
  // Calls visit(block, chain hash) for each block of the longest registered
  // chain that starts tokens[0..n), in order, at most (n - 1) / block_size
  // of them; none without prefix caching.
  template <typename Visit>
  void walk_cached_prefix(const int32_t* tokens, int64_t n, Visit visit) const;

  int64_t block_size_ = kDefaultBlockSize, num_blocks_ = 0, slot_elems_ = 0, kv_heads_ = 0,
          head_dim_ = 0;
  int layers_ = 0;
  // [layers][blocks][block_size][slot] bf16, zero until written; v_ empty
  // for MLA and both empty without host pools.
  ZeroPages k_, v_;
  std::vector<int32_t> free_;  // refs 0, not registered
  std::vector<int32_t> refs_;  // per block: tables that hold it
  std::unordered_map<int64_t, Table> tables_;
  // Prefix caching: hash -> registered block; per block its hash, whether
  // registered, its tokens, and its place in lru_ (refs 0 and registered;
  // front: evicted first).
  bool caching_ = false;
  uint64_t salt_ = 0;
  std::unordered_map<uint64_t, int32_t> cached_;
  std::vector<uint64_t> hash_;
  std::vector<char> registered_;
  std::vector<int32_t> tokens_;  // [blocks][block_size]
  std::list<int32_t> lru_;
  std::vector<std::list<int32_t>::iterator> lru_pos_;
};

}  // namespace msinfer::runtime
