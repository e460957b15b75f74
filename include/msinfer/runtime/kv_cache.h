// Paged KV cache of one attention worker: a fixed budget of bytes split into
// blocks of `block_size` token slots (bf16, layout in kernels/cpu/attention.h).
// With latent attention (kv_lora_rank > 0) there is one pool only
// (PagedKvLayer::v is null): one row per token and layer of kv_lora_rank +
// qk_rope_head_dim (the normed latent, then the roped key), shared by all
// heads (kv_heads 1; kernels/cpu/mla_attention.h).
//
// Layer groups (sliding-window attention, gpt-oss). The layers are split into
// groups of one attention window each (0: full attention) and of one size S,
// the greatest common divisor of the kinds' layer counts (gpt-oss: its
// sliding layers and its full ones, S = layers / 2; 3 layers of which 2 slide:
// 3 groups of 1). A block is S layers' K/V for block_size positions; the pools
// are [S][blocks][block_size][slot], and layer l, the j-th of its group, uses
// pool j with its group's block table, so every group draws on the one set of
// free blocks (vLLM's hybrid KV cache manager does the same) and a block freed
// by a sliding group serves any group next. A model without sliding layers has
// one group of all layers: the layout and the block counts of a plain paged
// cache, unchanged.
//
// Each sequence has one block table per group (keyed by an id the engine
// chooses), one entry per block of positions: the entry for positions
// [i * block_size, (i + 1) * block_size) is table[i]. In a sliding group of
// window W the positions a token at p reads are p - W + 1 .. p, so a block
// wholly before the window of the next position to compute is never read
// again: it is released (slide(), reserve()) and its entry becomes -1 (kFreed);
// attention kernels read a table only at the positions of a token's window.
// Blocks are taken as a sequence's tokens need them (Engine: admission, then
// each step's reserve).
// Blocks are reference counted: fork() gives a new sequence the full blocks
// of another's prompt by reference (n samples of one prompt: prefilled once),
// and release() frees a block only when its last reference goes. A shared
// block is always full and never written again (fork copies, or leaves out,
// a partly filled last block), so no block is ever copied on write.
// free_blocks() counts every block once, however many tables hold it.
//
// Prefix caching (enable_prefix_caching): a full block whose K/V were
// computed (cache_blocks) is registered, in its group, under a hash chained
// over (the hash of the block before it, its token ids; the first block's
// parent is the salt). A new sequence starts from the longest prefix of k
// blocks that every group can serve (match_prefix): a full-attention group
// needs blocks 0..k-1 of the chain registered, a sliding group only those that
// the window of position k * block_size reaches (the others' entries are
// kFreed, as if it had computed them and slid on). A sliding group registers
// its blocks like any other, so those that slide out of the window stay cached
// (free, evictable) for later requests that share the prefix. A block no table
// holds any more stays registered and counts as free: it is evicted, least
// recently released first (a sequence's blocks tail first, so a chain loses
// its end before its start; a sliding group's blocks as they leave the window),
// only when a block is needed and no unregistered one is free. K/V at a
// position depend only on the tokens up to it, so a block is the same whoever
// computed it; the token ids are kept per block and compared on a match, so a
// hash collision is a miss, never wrong K/V.
// Not thread-safe: owned and used by one engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
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

  // A table entry whose block a sliding group released (outside the window).
  static constexpr int32_t kFreed = -1;

  // Memory for the K/V pools from elsewhere: at least `bytes` zeroed bytes,
  // valid while the returned pointer (or a copy) lives; null to let the cache
  // map its own. An attention worker that prefill workers write into gives
  // its transport's registered memory (docs/RUNTIME.md, "Prefill/decode
  // disaggregation").
  using PoolMemory = std::function<std::shared_ptr<uint8_t>(size_t bytes)>;

  // RESOURCE_EXHAUSTED if the budget holds less than one block.
  // Without host_pools the blocks and tables are managed here but the K/V
  // values live elsewhere (a GPU's memory); layer() then has null pools.
  static StatusOr<KvCache> create(const ModelConfig& config, int64_t budget_bytes,
                                  int64_t block_size = kDefaultBlockSize, bool host_pools = true,
                                  const PoolMemory& pool_memory = nullptr);

  // Bytes of K and V for one token across all layers.
  static int64_t bytes_per_token(const ModelConfig& config);

  int64_t block_size() const { return block_size_; }
  int64_t total_blocks() const { return num_blocks_; }
  // Bytes of one block: block_size positions of the layers of one group.
  int64_t block_bytes() const;
  // Layer groups (see above): how many, the group of layer l, a group's
  // window in tokens (0: full attention).
  int groups() const { return static_cast<int>(group_window_.size()); }
  int layer_group(int l) const { return layer_group_[static_cast<size_t>(l)]; }
  int64_t group_window(int g) const { return group_window_[static_cast<size_t>(g)]; }
  // Blocks no table holds: never used or released, plus the cached ones
  // that can be evicted.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Positions one sequence could hold in every group at once.
  int64_t capacity_tokens() const { return num_blocks_ / groups() * block_size_; }
  // The most blocks a sequence of `tokens` positions ever holds, all groups
  // together, when it computes at most `chunk` positions a step: a sliding
  // group holds the window before a chunk plus the chunk.
  int64_t max_blocks(int64_t tokens, int64_t chunk) const;

  // Reserves the blocks sequence `id` needs to compute positions [from,
  // tokens): in a full-attention group every block up to max(tokens,
  // hold_to) (so a prompt can hold all its blocks from admission); in a
  // sliding group those from the window of `from` up to `tokens`, after
  // releasing the ones before it (as slide(id, from)). RESOURCE_EXHAUSTED
  // (nothing taken; the releases stand) when they are not free now. A block
  // a sliding group released is never taken again for the same positions:
  // `from` never goes back for a sequence (a preempted one is released whole).
  Status reserve(int64_t id, int64_t tokens, int64_t from = 0, int64_t hold_to = 0);
  // Blocks reserve(id, tokens, from, hold_to) would take from free_blocks()
  // (counting none it would release).
  int64_t blocks_to_take(int64_t id, int64_t tokens, int64_t from, int64_t hold_to = 0) const;
  // Sequence `id` will compute position `next` and later ones only: each
  // sliding group releases the blocks wholly before next's window. No-op
  // without sliding groups.
  void slide(int64_t id, int64_t next);
  // Drops sequence `id`'s references; a block no other table holds is free again.
  void release(int64_t id);
  // Sequence `id`'s table in `group` (entries kFreed where released).
  const int32_t* block_table(int64_t id, int group = 0) const;
  // Blocks sequence `id`'s tables hold (all groups, or one), shared ones
  // included, released ones not (0 for none).
  int64_t blocks_held(int64_t id) const;
  int64_t blocks_held(int64_t id, int group) const;
  // Tables holding `block` (0: it is free).
  int32_t block_refs(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

  // Starts sequence `child` (which must hold no table) from the K/V of the
  // first `tokens` positions of sequence `parent`: every full block among
  // them is shared (its reference count raised, nothing copied; a sliding
  // group's released entries stay kFreed). A partly filled last block is
  // copied, in every group, into a free block of the child's own when
  // `copy_partial`, the pools are here (host_pools()) and a block per group
  // is free; otherwise the child's table stops at the last full block (or,
  // where a sliding group released a block the child's recomputation needs,
  // at an earlier one) and the child must compute the rest itself. Returns
  // the positions whose K/V the child's table holds: `tokens`, or fewer, a
  // multiple of block_size. Copying the last block rather than sharing it copy-on-write: each
  // of the n sequences writes its next token into that block in the very
  // next step, so copy-on-write would copy it as often, later, and need a
  // check on every write.
  int64_t fork(int64_t parent, int64_t child, int64_t tokens, bool copy_partial);
  // Prefill/decode handoff (docs/RUNTIME.md, "Prefill/decode
  // disaggregation"): the K/V of a sequence's first `tokens` positions move
  // to another cache of the same layout, block by block, and the sequence
  // goes on there from position `tokens` without recomputing them.
  //
  // What identifies the layout (block size, K/V slot, pools, layer groups
  // and their windows): two caches whose layouts differ cannot exchange
  // blocks. The model's weights are the caller's to match.
  uint64_t layout_id() const;
  // Bytes export_kv writes for `tokens` positions: in each group the table
  // entries computing position `tokens` on needs (all of a full-attention
  // group's, a sliding group's window), whole blocks, K then V per layer.
  int64_t transfer_bytes(int64_t tokens) const;
  // Blocks import_kv takes from free_blocks().
  int64_t transfer_blocks(int64_t tokens) const;
  // Writes sequence `id`'s K/V of positions [0, tokens) that transfer_bytes
  // counts into out[0..transfer_bytes(tokens)). Host pools only; the
  // sequence must hold those blocks.
  void export_kv(int64_t id, int64_t tokens, uint8_t* out) const;
  // Starts sequence `id` (which must hold no table) holding positions [0,
  // tokens) from `size` bytes export_kv wrote in a cache of this layout_id():
  // takes transfer_blocks(tokens) blocks and copies. RESOURCE_EXHAUSTED
  // (nothing taken) when they are not free; INVALID_ARGUMENT for a size that
  // is not transfer_bytes(tokens) or a cache without host pools.
  Status import_kv(int64_t id, int64_t tokens, const uint8_t* data, int64_t size);

  // The same handoff without the copies: the sender writes from its pool
  // memory straight into the receiver's (a transport's write-with-immediate).
  // The bytes export_kv would write, in its order, lie in the pool memory as
  // runs: a span is one run, contiguous in the pool.
  struct Span {
    int64_t offset = 0;  // in pool_data()
    int64_t bytes = 0;
  };
  // The table entries a transfer of sequence `id`'s first `tokens` positions
  // moves, per layer group (those export_kv walks), less the first `skip`
  // (blocks the receiver holds already: its prefix cache had them); the
  // sequence must hold them.
  std::vector<std::vector<int32_t>> transfer_table(int64_t id, int64_t tokens,
                                                   int64_t skip = 0) const;
  // Where those bytes lie in the pool memory of a cache of this layout_id()
  // with `pool_blocks` blocks whose sequence holds `table` (transfer_table
  // there, with the same `skip`), in export_kv's order, adjacent runs
  // merged. INVALID_ARGUMENT for a table of the wrong shape, a block outside
  // the pool (a table off the wire), or a skip that is not below
  // blocks_for(tokens) or, with sliding layer groups, not 0.
  StatusOr<std::vector<Span>> transfer_spans(const std::vector<std::vector<int32_t>>& table,
                                             int64_t tokens, int64_t pool_blocks,
                                             int64_t skip = 0) const;
  // One write of a transfer: `bytes` from offset `from` of the sender's
  // pool memory to offset `to` of the receiver's (or of a staging region).
  struct Copy {
    int64_t from = 0, to = 0, bytes = 0;
  };
  // The writes that move the bytes of the sender's spans to the receiver's
  // (both in export_kv's order), one per run contiguous at both ends; a
  // staging region is the one span {0, transfer_bytes}. Stops where the
  // shorter list ends.
  static std::vector<Copy> pair_spans(const std::vector<Span>& from, const std::vector<Span>& to);
  // Starts sequence `id` (which must hold no table) holding positions [0,
  // tokens), taking transfer_blocks(tokens) blocks: import_kv without the
  // copy. The K/V are written into its transfer_spans by someone else; then
  // cache_blocks() (they are there) or release() (they never came).
  // RESOURCE_EXHAUSTED (nothing taken) when the blocks are not free;
  // INVALID_ARGUMENT without host pools.
  Status place_kv(int64_t id, int64_t tokens);
  // The pool memory (K's pools, then V's) and its size; null without host
  // pools. What a transport registers so that peers write blocks into it
  // (writable through a const cache: the blocks' bytes are not the cache's
  // bookkeeping).
  uint8_t* pool_data() const { return reinterpret_cast<uint8_t*>(k_); }
  int64_t pool_bytes() const { return pool_bytes_; }
  // Whether the pool memory came from create's pool_memory.
  bool pool_memory_given() const { return external_ != nullptr; }

  // Turns prefix caching on (before any table exists); `salt` starts every
  // chain: whatever else changes the K/V of a token sequence (model, weights).
  void enable_prefix_caching(uint64_t salt);
  bool prefix_caching() const { return caching_; }
  // Full blocks at the start of tokens[0..n) that are cached, at most
  // (n - 1) / block_size of them (a sequence computes at least its last token
  // to get logits, and never writes into a shared block): the largest k such
  // that every full-attention group has blocks 0..k-1 of the chain and every
  // sliding group those of them that the window of position k * block_size
  // reaches. `evictable` (may be null) gets how many of the blocks a match
  // takes no table holds now (they count in free_blocks() until taken). 0
  // without prefix caching.
  int64_t cached_prefix_blocks(const int32_t* tokens, int64_t n, int64_t* evictable) const;
  // Blocks a new sequence with these tokens takes from free_blocks() when it
  // starts with match_prefix and reserves the way the engine admits it:
  // reserve(id, min(n, hit + chunk), hit, n), hit the matched positions;
  // `hit` (may be null) gets those.
  int64_t blocks_to_start(const int32_t* tokens, int64_t n, int64_t chunk, int64_t* hit) const;
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
  // Registered blocks (held or not, all groups) / those no table holds.
  int64_t cached_blocks() const;
  int64_t evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  // The hash of a full block of tokens whose preceding block hashed to
  // `parent` (the salt for a first block): prefix_block_hash (prefix_hash.h).
  uint64_t chain_hash(uint64_t parent, const int32_t* block_tokens) const;
  // The chain's salt (enable_prefix_caching); 0 without prefix caching.
  uint64_t prefix_salt() const { return salt_; }

  // Cache events, for a router that indexes what this cache holds
  // (docs/RUNTIME.md, "Cache-aware routing"). Once record_cache_events() is
  // called, every registration of a block (cache_blocks) and every
  // unregistration (eviction by take_block, flush_cache) is kept as a net
  // count per hash (+1 registered in one more layer group, -1 in one fewer)
  // until taken: a hash registered and evicted between two takes leaves
  // nothing, so what is pending is at most the blocks registered now plus
  // those the taker still counts (each at most the pool's blocks).
  void record_cache_events() { recording_ = true; }
  // Moves up to `max` pending events into `stored` / `removed` (a hash once
  // per group it changed in; removals first, so that the taker never counts
  // a block that is gone); returns the events still pending.
  int64_t take_cache_events(int64_t max, std::vector<uint64_t>* stored,
                            std::vector<uint64_t>* removed);

  // Whether the K/V pools are in this object (not a GPU's): fork() can copy.
  bool host_pools() const { return k_ != nullptr; }

  kernels::cpu::PagedKvLayer layer(int l);

 private:
  struct Table {
    // [group][i]: the block of positions [i * block_size, (i + 1) *
    // block_size), kFreed where a sliding group released it.
    std::vector<std::vector<int32_t>> blocks;
    // Chain hash of each of the first hashes.size() blocks (full, computed).
    std::vector<uint64_t> hashes;
  };
  // First table entry group g needs for a token at position `pos`.
  int64_t first_needed(int g, int64_t pos) const;
  // Entries group g's table reaches for reserve(.., tokens, .., hold_to).
  int64_t entries_needed(int g, int64_t tokens, int64_t hold_to) const;
  // Calls visit(offset in the pool memory of a cache with `pool_blocks`
  // blocks, bytes) for every block of one pool that a transfer of `entries`
  // (transfer_table: the blocks it moves, per group) moves, in export_kv's
  // order: per group, per layer of the group, K then V, the entries (so
  // that a fresh pool's consecutive blocks make one run).
  template <typename Visit>
  void walk_transfer(const std::vector<std::vector<int32_t>>& entries, int64_t pool_blocks,
                     Visit visit) const;
  // Sequence id's table, checked to hold the positions [0, tokens).
  const Table& transfer_source(int64_t id, int64_t tokens) const;
  // A block for a new use (refs 1): an unregistered free one, else the least
  // recently released cached one, unregistered. One must be free.
  int32_t take_block();
  // Drops one reference to b; at none it is free (registered: evictable).
  void drop_ref(int32_t b);
  // Whether registered block b holds exactly these block_size tokens.
  bool holds(int32_t b, const int32_t* block_tokens) const;
  // The longest cached prefix of tokens[0..n) (cached_prefix_blocks): its
  // length k in blocks; calls visit(group, i, block) for each block a match
  // takes, and gives the chain hashes of blocks 0..k-1 in `hashes` (may be
  // null). 0 without prefix caching.
  template <typename Visit>
  int64_t find_cached_prefix(const int32_t* tokens, int64_t n, std::vector<uint64_t>* hashes,
                             Visit visit) const;

  int64_t block_size_ = kDefaultBlockSize, num_blocks_ = 0, slot_elems_ = 0, kv_heads_ = 0,
          head_dim_ = 0;
  // Layers per group; pools per K and V (each [S][blocks][block_size][slot]).
  int group_layers_ = 0;
  int kv_pools_ = 2;                   // K and V; 1 for latent attention
  std::vector<int> layer_group_;       // per layer: its group
  std::vector<int> layer_index_;       // per layer: its index in its group (its pool)
  std::vector<int64_t> group_window_;  // per group: window (0: full attention)
  bool sliding_ = false;               // some group has a window
  // The pools, K's [S][blocks][block_size][slot] bf16 then V's, zero until
  // written, in one piece of memory: own_, or external_ from create's
  // pool_memory. v_ null for MLA, both null without host pools.
  ZeroPages own_;
  std::shared_ptr<uint8_t> external_;
  bf16* k_ = nullptr;
  bf16* v_ = nullptr;
  int64_t pool_bytes_ = 0;
  std::vector<int32_t> free_;  // refs 0, not registered
  std::vector<int32_t> refs_;  // per block: tables that hold it
  std::unordered_map<int64_t, Table> tables_;
  // Prefix caching: per group, hash -> registered block; per block its hash,
  // its group, whether registered, its tokens, and its place in lru_ (refs 0
  // and registered; front: evicted first).
  bool caching_ = false;
  uint64_t salt_ = 0;
  std::vector<std::unordered_map<uint64_t, int32_t>> cached_;
  std::vector<uint64_t> hash_;
  std::vector<int32_t> block_group_;
  std::vector<char> registered_;
  std::vector<int32_t> tokens_;  // [blocks][block_size]
  std::list<int32_t> lru_;
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  // record_cache_events(): hash -> registrations minus unregistrations not
  // taken yet (never 0).
  bool recording_ = false;
  std::unordered_map<uint64_t, int32_t> pending_events_;
  void note_cache_event(uint64_t h, int32_t delta);
  // Unregisters cached block b (refs 0, in lru_ or leaving it).
  void unregister(int32_t b);
};

}  // namespace msinfer::runtime
