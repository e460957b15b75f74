// KvCache's reference-counted blocks (issue 47, n samples of one prompt):
// fork() shares full blocks, copies a partly filled last one, and a block is
// free again exactly when its last table lets it go.
#include "msinfer/runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "msinfer/runtime/prefix_hash.h"
#include "msinfer/runtime/routing_policy.h"

namespace msinfer::runtime {
namespace {

// Two layers of two KV heads of 4 dims: 64 bytes a token, 256 a block of 4.
ModelConfig small_config() {
  ModelConfig c;
  c.layers = 2;
  c.kv_heads = 2;
  c.head_dim = 4;
  return c;
}

constexpr int64_t kBlock = 4;

KvCache make_kv(int64_t blocks, bool host_pools = true) {
  auto kv = KvCache::create(small_config(), blocks * kBlock * 64, kBlock, host_pools);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return std::move(kv).value();
}

// A value per (layer, K or V, block, element) that no other slot has.
float mark(int l, int kv, int32_t block, int64_t e) {
  return static_cast<float>(l * 1000 + kv * 500 + block * 40 + e);
}

// Fills every element of `block` in every layer's K and V pool with mark().
void fill_block(KvCache& kv, int32_t block) {
  const int64_t elems = kBlock * 2 * 4;  // block_size * kv_heads * head_dim
  for (int l = 0; l < 2; ++l) {
    auto layer = kv.layer(l);
    for (int which = 0; which < 2; ++which) {
      bf16* pool = which == 0 ? layer.k : layer.v;
      for (int64_t e = 0; e < elems; ++e)
        pool[block * elems + e] = float_to_bf16(mark(l, which, block, e));
    }
  }
}

bool block_holds(KvCache& kv, int32_t block, int32_t like) {
  const int64_t elems = kBlock * 2 * 4;
  for (int l = 0; l < 2; ++l) {
    auto layer = kv.layer(l);
    for (int which = 0; which < 2; ++which) {
      const bf16* pool = which == 0 ? layer.k : layer.v;
      for (int64_t e = 0; e < elems; ++e) {
        if (bf16_to_float(pool[block * elems + e]) !=
            bf16_to_float(float_to_bf16(mark(l, which, like, e)))) {
          return false;
        }
      }
    }
  }
  return true;
}

TEST(KvCacheTest, ForkSharesFullBlocksAndCopiesThePartialOne) {
  KvCache kv = make_kv(8);
  ASSERT_TRUE(kv.reserve(1, 10).ok());  // 2 full blocks + 2 of 4 slots of a third
  ASSERT_EQ(kv.blocks_held(1), 3);
  const int32_t* parent = kv.block_table(1);
  for (int i = 0; i < 3; ++i) fill_block(kv, parent[i]);
  EXPECT_EQ(kv.fork(1, 2, 10, /*copy_partial=*/true), 10);
  EXPECT_EQ(kv.fork(1, 3, 10, /*copy_partial=*/true), 10);
  // Three sequences of 10 tokens hold 2 shared + 3 own blocks, not 9.
  EXPECT_EQ(kv.total_blocks() - kv.free_blocks(), 5);
  parent = kv.block_table(1);
  std::set<int32_t> last;
  for (int64_t child : {2, 3}) {
    ASSERT_EQ(kv.blocks_held(child), 3);
    const int32_t* t = kv.block_table(child);
    EXPECT_EQ(t[0], parent[0]);
    EXPECT_EQ(t[1], parent[1]);
    EXPECT_NE(t[2], parent[2]);
    EXPECT_EQ(kv.block_refs(t[2]), 1);
    // The partial block's K and V, every layer, copied.
    EXPECT_TRUE(block_holds(kv, t[2], parent[2]));
    last.insert(t[2]);
  }
  EXPECT_EQ(last.size(), 2u);
  EXPECT_EQ(kv.block_refs(parent[0]), 3);
  EXPECT_EQ(kv.block_refs(parent[1]), 3);
  EXPECT_EQ(kv.block_refs(parent[2]), 1);
  // A child grows on its own blocks.
  ASSERT_TRUE(kv.reserve(2, 13).ok());
  EXPECT_EQ(kv.blocks_held(2), 4);
  EXPECT_EQ(kv.total_blocks() - kv.free_blocks(), 6);
}

TEST(KvCacheTest, SharedBlocksAreFreedWithTheirLastReference) {
  KvCache kv = make_kv(8);
  ASSERT_TRUE(kv.reserve(1, 10).ok());
  ASSERT_EQ(kv.fork(1, 2, 10, true), 10);
  const int32_t shared0 = kv.block_table(1)[0], shared1 = kv.block_table(1)[1];
  EXPECT_EQ(kv.free_blocks(), 4);
  // The parent goes first (as a preempted or finished sequence would): only
  // its own partial block is freed; the child's shared blocks stay.
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), 5);
  EXPECT_EQ(kv.block_refs(shared0), 1);
  EXPECT_EQ(kv.block_refs(shared1), 1);
  EXPECT_EQ(kv.block_table(2)[0], shared0);
  // Taking every free block cannot take a shared one.
  ASSERT_TRUE(kv.reserve(9, 5 * kBlock).ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_NE(kv.block_table(9)[i], shared0);
    EXPECT_NE(kv.block_table(9)[i], shared1);
  }
  EXPECT_EQ(kv.free_blocks(), 0);
  kv.release(9);
  kv.release(2);  // the last reference
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  EXPECT_EQ(kv.block_refs(shared0), 0);
  kv.release(2);  // a second release of a sequence without a table does nothing
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
}

TEST(KvCacheTest, WithoutACopyTheChildStopsAtTheLastFullBlock) {
  KvCache kv = make_kv(8);
  ASSERT_TRUE(kv.reserve(1, 10).ok());
  // Not asked to copy (a GPU's pools, attention-tp peers).
  EXPECT_EQ(kv.fork(1, 2, 10, /*copy_partial=*/false), 8);
  EXPECT_EQ(kv.blocks_held(2), 2);
  EXPECT_EQ(kv.free_blocks(), 5);
  // At a block boundary nothing is partial: all shared.
  EXPECT_EQ(kv.fork(1, 3, 8, true), 8);
  EXPECT_EQ(kv.blocks_held(3), 2);
  EXPECT_EQ(kv.free_blocks(), 5);
  // No block free: no copy either.
  ASSERT_TRUE(kv.reserve(9, 5 * kBlock).ok());
  EXPECT_EQ(kv.fork(1, 4, 10, true), 8);
  // A prompt shorter than a block: the child starts with nothing.
  KvCache small = make_kv(4);
  ASSERT_TRUE(small.reserve(1, 3).ok());
  EXPECT_EQ(small.fork(1, 2, 3, false), 0);
  EXPECT_EQ(small.blocks_held(2), 0);
  ASSERT_TRUE(small.reserve(2, 4).ok());
  EXPECT_EQ(small.blocks_held(2), 1);
  // No pools here (they are on a GPU): nothing to copy from.
  KvCache device = make_kv(8, /*host_pools=*/false);
  ASSERT_FALSE(device.host_pools());
  ASSERT_TRUE(device.reserve(1, 10).ok());
  EXPECT_EQ(device.fork(1, 2, 10, true), 8);
}

// ---- prefix caching (issue 50) ----

KvCache make_caching_kv(int64_t blocks) {
  KvCache kv = make_kv(blocks);
  kv.enable_prefix_caching(/*salt=*/7);
  return kv;
}

std::vector<int32_t> seq_tokens(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
  return t;
}

// Runs sequence `id` as the engine does: match, reserve, "compute", register.
int64_t admit(KvCache& kv, int64_t id, const std::vector<int32_t>& t) {
  const int64_t n = static_cast<int64_t>(t.size());
  const int64_t hit = kv.match_prefix(id, t.data(), n);
  EXPECT_TRUE(kv.reserve(id, n).ok());
  kv.cache_blocks(id, t.data(), n);
  return hit;
}

TEST(KvCacheTest, PrefixHitMissAndPartialBlocks) {
  KvCache kv = make_caching_kv(16);
  const std::vector<int32_t> a = seq_tokens(11, 100);  // 2 full blocks + 3
  EXPECT_EQ(admit(kv, 1, a), 0);                       // miss: nothing cached yet
  EXPECT_EQ(kv.cached_blocks(), 2);                    // the partial block is not cached
  // Same first 9 tokens, then others: the 2 full blocks are shared.
  std::vector<int32_t> b = a;
  b[9] = 5;
  b[10] = 6;
  b.push_back(7);
  EXPECT_EQ(admit(kv, 2, b), 8);
  EXPECT_EQ(kv.block_table(2)[0], kv.block_table(1)[0]);
  EXPECT_EQ(kv.block_table(2)[1], kv.block_table(1)[1]);
  EXPECT_NE(kv.block_table(2)[2], kv.block_table(1)[2]);
  EXPECT_EQ(kv.block_refs(kv.block_table(1)[0]), 2);
  // A token changed in the first block: nothing matches (the chain starts there).
  std::vector<int32_t> c = a;
  c[0] = 1;
  int64_t evictable = -1;
  EXPECT_EQ(kv.cached_prefix_blocks(c.data(), 11, &evictable), 0);
  // Changed in the second block: the first still matches.
  c = a;
  c[5] = 1;
  EXPECT_EQ(kv.cached_prefix_blocks(c.data(), 11, &evictable), 1);
  EXPECT_EQ(evictable, 0);  // held by sequences 1 and 2
  // Another salt (other weights): no match.
  KvCache other = make_kv(16);
  other.enable_prefix_caching(8);
  EXPECT_EQ(admit(other, 1, a), 0);
  EXPECT_EQ(other.cached_prefix_blocks(a.data(), 11, nullptr), 2);
  EXPECT_NE(other.chain_hash(7, a.data()), other.chain_hash(8, a.data()));
}

TEST(KvCacheTest, AWholePromptHitLeavesTheLastBlockToCompute) {
  KvCache kv = make_caching_kv(16);
  const std::vector<int32_t> a = seq_tokens(12, 100);  // exactly 3 blocks
  EXPECT_EQ(admit(kv, 1, a), 0);
  EXPECT_EQ(kv.cached_blocks(), 3);
  kv.release(1);
  // At most (12 - 1) / 4 = 2 blocks: the last token is computed, into a
  // block of its own (a shared block is never written).
  EXPECT_EQ(admit(kv, 2, a), 8);
  EXPECT_EQ(kv.blocks_held(2), 3);
  // One token more: all 3 full blocks match.
  std::vector<int32_t> b = a;
  b.push_back(1);
  EXPECT_EQ(kv.cached_prefix_blocks(b.data(), 13, nullptr), 3);
}

TEST(KvCacheTest, UnheldCachedBlocksCountAsFreeAndAreEvictedLeastRecentlyUsedFirst) {
  KvCache kv = make_caching_kv(8);
  const std::vector<int32_t> a = seq_tokens(12, 100), b = seq_tokens(12, 500);
  admit(kv, 1, a);  // 3 blocks
  admit(kv, 2, b);  // 3 blocks
  EXPECT_EQ(kv.free_blocks(), 2);
  kv.release(1);  // a's released first: evicted first
  kv.release(2);
  EXPECT_EQ(kv.free_blocks(), 8);
  EXPECT_EQ(kv.evictable_blocks(), 6);
  EXPECT_EQ(kv.cached_blocks(), 6);
  // 3 blocks: the 2 never used, then a's last block (a chain loses its end first).
  ASSERT_TRUE(kv.reserve(3, 12).ok());
  EXPECT_EQ(kv.cached_blocks(), 5);
  EXPECT_EQ(kv.cached_prefix_blocks(a.data(), 12, nullptr), 2);  // at most 2 anyway
  std::vector<int32_t> a13 = a;
  a13.push_back(0);
  EXPECT_EQ(kv.cached_prefix_blocks(a13.data(), 13, nullptr), 2);  // block 3 evicted
  EXPECT_EQ(kv.cached_prefix_blocks(b.data(), 12, nullptr), 2);
  std::vector<int32_t> b13 = b;
  b13.push_back(0);
  EXPECT_EQ(kv.cached_prefix_blocks(b13.data(), 13, nullptr), 3);  // b untouched
  // Two more: a's first two go (a before b), then b's from its end.
  ASSERT_TRUE(kv.reserve(4, 8).ok());
  EXPECT_EQ(kv.cached_prefix_blocks(a13.data(), 13, nullptr), 0);
  EXPECT_EQ(kv.cached_prefix_blocks(b13.data(), 13, nullptr), 3);
  ASSERT_TRUE(kv.reserve(5, 4).ok());
  EXPECT_EQ(kv.cached_prefix_blocks(b13.data(), 13, nullptr), 2);
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_EQ(kv.reserve(6, 12).code(), StatusCode::kResourceExhausted);
  // A match takes unheld cached blocks off the free count.
  int64_t evictable = 0;
  EXPECT_EQ(kv.cached_prefix_blocks(b13.data(), 13, &evictable), 2);
  EXPECT_EQ(evictable, 2);
  EXPECT_EQ(kv.match_prefix(6, b13.data(), 13), 8);
  EXPECT_EQ(kv.free_blocks(), 0);
  EXPECT_EQ(kv.evictable_blocks(), 0);
}

TEST(KvCacheTest, ReusingACachedBlockMakesItRecentlyUsed) {
  KvCache kv = make_caching_kv(4);
  const std::vector<int32_t> a = seq_tokens(5, 100), b = seq_tokens(5, 500);
  admit(kv, 1, a);  // 2 blocks, the first cached
  admit(kv, 2, b);
  kv.release(1);
  kv.release(2);
  // a's block used again (and released again): b's is now the oldest.
  EXPECT_EQ(admit(kv, 3, a), 4);
  kv.release(3);
  ASSERT_TRUE(kv.reserve(4, 12).ok());  // 3 blocks: the 2 uncached ones, then b's
  EXPECT_EQ(kv.cached_prefix_blocks(a.data(), 5, nullptr), 1);
  EXPECT_EQ(kv.cached_prefix_blocks(b.data(), 5, nullptr), 0);
}

TEST(KvCacheTest, ReferencesNeverLeakAndAFlushFreesEverything) {
  KvCache kv = make_caching_kv(16);
  const std::vector<int32_t> a = seq_tokens(10, 100);
  admit(kv, 1, a);
  admit(kv, 2, a);                         // shares 2 blocks
  EXPECT_EQ(kv.fork(2, 3, 10, true), 10);  // shares them again, copies the third
  std::vector<int32_t> longer = a;
  longer.insert(longer.end(), {1, 2, 3, 4, 5, 6});
  admit(kv, 4, longer);  // 4 blocks, the first 2 shared
  EXPECT_EQ(kv.block_refs(kv.block_table(1)[0]), 4);
  // The same block contents twice (sequence 4's third block and a later
  // one's): registered once; the other is freed as usual.
  admit(kv, 5, longer);
  for (int64_t id : {1, 2, 3, 4, 5}) kv.release(id);
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  for (int32_t b = 0; b < kv.total_blocks(); ++b) EXPECT_EQ(kv.block_refs(b), 0) << b;
  EXPECT_GT(kv.cached_blocks(), 0);
  kv.flush_cache();
  EXPECT_EQ(kv.cached_blocks(), 0);
  EXPECT_EQ(kv.evictable_blocks(), 0);
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  EXPECT_EQ(kv.cached_prefix_blocks(longer.data(), 16, nullptr), 0);
  // Every block can be taken once each.
  ASSERT_TRUE(kv.reserve(9, kv.capacity_tokens()).ok());
  std::set<int32_t> seen(kv.block_table(9), kv.block_table(9) + kv.total_blocks());
  EXPECT_EQ(static_cast<int64_t>(seen.size()), kv.total_blocks());
}

// Cache-aware routing (issue 50): the events a router indexes follow the
// registrations and evictions, and the router's own chain (prefix_hash.h)
// names the blocks the cache registered.
TEST(KvCacheTest, CacheEventsFollowRegistrationsAndEvictions) {
  KvCache kv = make_caching_kv(8);
  kv.record_cache_events();
  PrefixIndex index;
  auto take = [&](int64_t max = 1000) {
    std::vector<uint64_t> stored, removed;
    kv.take_cache_events(max, &stored, &removed);
    index.apply(stored, removed);
    return std::make_pair(stored, removed);
  };
  const std::vector<int32_t> a = seq_tokens(12, 100), b = seq_tokens(12, 500);
  admit(kv, 1, a);  // registers 3 blocks
  auto [stored, removed] = take();
  EXPECT_EQ(stored.size(), 3u);
  EXPECT_TRUE(removed.empty());
  // The router's chain of a's first (12 - 1) / 4 = 2 blocks and one token
  // more (all 3) are the hashes the cache registered.
  std::vector<int32_t> a13 = a;
  a13.push_back(0);
  const auto chain = prefix_chain_hashes(kv.prefix_salt(), a13.data(), 13, kBlock);
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(std::set<uint64_t>(stored.begin(), stored.end()),
            std::set<uint64_t>(chain.begin(), chain.end()));
  EXPECT_EQ(index.match(chain), 3);
  EXPECT_EQ(index.match(prefix_chain_hashes(kv.prefix_salt() + 1, a13.data(), 13, kBlock)), 0);
  // A sharing sequence registers nothing new; nothing to take.
  admit(kv, 2, a);
  EXPECT_EQ(take().first.size(), 0u);
  admit(kv, 3, b);  // 3 more: 1 block left free
  kv.release(1);
  kv.release(2);
  kv.release(3);
  take();
  EXPECT_EQ(index.size(), 6);
  // Evictions: 5 blocks taken, the 2 unregistered free ones first, then
  // a's 3 (released first), end first.
  ASSERT_TRUE(kv.reserve(4, 20).ok());
  std::tie(stored, removed) = take();
  EXPECT_TRUE(stored.empty());
  EXPECT_EQ(removed.size(), 3u);
  EXPECT_EQ(index.match(chain), 0);
  const auto chain_b = prefix_chain_hashes(kv.prefix_salt(), b.data(), 12, kBlock);
  EXPECT_EQ(index.match(chain_b), 2);
  // Registered and evicted between two takes: nothing is left of it.
  kv.release(4);
  kv.flush_cache();  // b's 3 go
  const std::vector<int32_t> c = seq_tokens(8, 900);
  admit(kv, 5, c);
  kv.release(5);
  kv.flush_cache();
  std::tie(stored, removed) = take();
  EXPECT_TRUE(stored.empty());
  EXPECT_EQ(removed.size(), 3u);
  EXPECT_EQ(index.size(), 0);
  // At most `max` a take; the rest wait for the next.
  admit(kv, 6, a);
  std::vector<uint64_t> s1, r1;
  EXPECT_EQ(kv.take_cache_events(2, &s1, &r1), 1);
  EXPECT_EQ(s1.size(), 2u);
  EXPECT_EQ(kv.take_cache_events(2, &s1, &r1), 0);
  EXPECT_EQ(s1.size(), 3u);
}

TEST(KvCacheTest, WithoutRecordingNoEventIsKept) {
  KvCache kv = make_caching_kv(8);
  admit(kv, 1, seq_tokens(12, 100));
  std::vector<uint64_t> stored, removed;
  EXPECT_EQ(kv.take_cache_events(100, &stored, &removed), 0);
  EXPECT_TRUE(stored.empty());
}

TEST(KvCacheTest, WithoutPrefixCachingNothingIsCached) {
  KvCache kv = make_kv(8);
  const std::vector<int32_t> a = seq_tokens(12, 100);
  EXPECT_EQ(admit(kv, 1, a), 0);
  kv.release(1);
  EXPECT_EQ(admit(kv, 2, a), 0);
  EXPECT_EQ(kv.cached_blocks(), 0);
  kv.release(2);
  EXPECT_EQ(kv.evictable_blocks(), 0);
  EXPECT_EQ(kv.free_blocks(), 8);
}

// ---- sliding-window layer groups (gpt-oss) ----

// Four layers, sliding (window 6) and full in turn, two KV heads of 4 dims
// (32 bytes of K and V a token and layer): two groups of two layers, a block
// is 2 layers x 4 positions x 32 bytes.
ModelConfig sliding_config(int64_t window = 6) {
  ModelConfig c = small_config();
  c.layers = 4;
  c.sliding_window = window;
  c.sliding_layers = {true, false, true, false};
  return c;
}

KvCache make_sliding_kv(int64_t blocks, bool caching = false) {
  auto kv = KvCache::create(sliding_config(), blocks * 2 * kBlock * 32, kBlock);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (caching) kv->enable_prefix_caching(42);
  return std::move(kv).value();
}

TEST(KvCacheTest, LayersOfOneWindowFormAGroupAndGroupsShareThePool) {
  KvCache kv = make_sliding_kv(10);
  ASSERT_EQ(kv.groups(), 2);
  EXPECT_EQ(kv.group_window(0), 6);  // the kind of layer 0 first
  EXPECT_EQ(kv.group_window(1), 0);
  EXPECT_EQ(kv.layer_group(0), 0);
  EXPECT_EQ(kv.layer_group(1), 1);
  EXPECT_EQ(kv.layer_group(2), 0);
  EXPECT_EQ(kv.layer_group(3), 1);
  EXPECT_EQ(kv.total_blocks(), 10);
  EXPECT_EQ(kv.block_bytes(), 2 * kBlock * 32);
  // Layer j of each group uses pool j: the tables keep them apart.
  EXPECT_EQ(kv.layer(0).k, kv.layer(1).k);
  EXPECT_EQ(kv.layer(2).k, kv.layer(3).k);
  EXPECT_NE(kv.layer(0).k, kv.layer(2).k);
  // Without sliding layers: one group of all layers, blocks as before.
  ModelConfig full = sliding_config();
  full.sliding_layers.clear();
  auto plain = KvCache::create(full, 10 * 2 * kBlock * 32, kBlock);  // the same budget
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->groups(), 1);
  EXPECT_EQ(plain->total_blocks(), 5);
  EXPECT_EQ(plain->block_bytes(), 4 * kBlock * 32);
  // 3 layers, 2 sliding: groups of one layer each.
  ModelConfig odd = sliding_config();
  odd.layers = 3;
  odd.sliding_layers = {true, false, true};
  auto three = KvCache::create(odd, 9 * kBlock * 32, kBlock);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->groups(), 3);
  EXPECT_EQ(three->total_blocks(), 9);
  EXPECT_EQ(three->layer_group(2), 1);  // the second sliding group
  EXPECT_EQ(three->group_window(2), 0);
}

// A sequence fed in chunks (as the engine does: reserve for the chunk, then
// slide past it) holds in the sliding group only the blocks of the window
// before a chunk and the chunk; the full group holds all; released entries
// are kFreed and their blocks free.
TEST(KvCacheTest, ASlidingGroupHoldsOnlyItsWindow) {
  for (int64_t chunk : {1, 3, 5, 9}) {
    KvCache kv = make_sliding_kv(40);
    int64_t pos = 0;
    while (pos < 60) {
      const int64_t to = pos + chunk;
      ASSERT_TRUE(kv.reserve(1, to, pos).ok()) << pos;
      EXPECT_EQ(kv.blocks_held(1, 1), kv.blocks_for(to));
      EXPECT_LE(kv.blocks_held(1, 0), kv.blocks_for(6 - 1 + chunk) + 1) << chunk << " " << pos;
      EXPECT_LE(kv.blocks_held(1), kv.max_blocks(to, chunk));
      // Every position a token of the chunk reads (its window) has a block.
      for (int64_t p = pos; p < to; ++p) {
        for (int64_t q = std::max<int64_t>(0, p - 5); q <= p; ++q) {
          EXPECT_NE(kv.block_table(1, 0)[q / kBlock], KvCache::kFreed) << p << " reads " << q;
        }
      }
      pos = to;
      kv.slide(1, pos);
      const int64_t first = std::max<int64_t>(0, pos - 5) / kBlock;
      for (int64_t i = 0; i < first; ++i) EXPECT_EQ(kv.block_table(1, 0)[i], KvCache::kFreed);
      EXPECT_EQ(kv.blocks_held(1, 0), kv.blocks_for(pos) - first);
      EXPECT_EQ(kv.total_blocks() - kv.free_blocks(), kv.blocks_held(1));
    }
    kv.release(1);
    EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  }
}

TEST(KvCacheTest, ReserveWithHoldToKeepsAPromptInTheFullGroupsOnly) {
  KvCache kv = make_sliding_kv(40);
  // Admission of a 40-token prompt, chunks of 8: the full group holds all 10
  // blocks, the sliding one the first chunk's 2.
  EXPECT_EQ(kv.blocks_to_take(1, 8, 0, 40), 12);
  ASSERT_TRUE(kv.reserve(1, 8, 0, 40).ok());
  EXPECT_EQ(kv.blocks_held(1, 1), 10);
  EXPECT_EQ(kv.blocks_held(1, 0), 2);
  kv.slide(1, 8);
  // The next chunk [8, 16): window from 3 (block 0) on; block 2 and 3 new.
  EXPECT_EQ(kv.blocks_to_take(1, 16, 8, 40), 2);
  ASSERT_TRUE(kv.reserve(1, 16, 8, 40).ok());
  EXPECT_EQ(kv.blocks_held(1, 0), 4);
  kv.slide(1, 16);  // window of 16 starts at 11: blocks 0 and 1 go
  EXPECT_EQ(kv.blocks_held(1, 0), 2);
  EXPECT_EQ(kv.free_blocks(), 40 - 12);
  // Too few free: nothing taken, the table as it was.
  EXPECT_EQ(kv.reserve(2, 200, 0).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.blocks_held(2), 0);
}

TEST(KvCacheTest, ForkSharesWhatTheSlidingGroupStillHolds) {
  KvCache kv = make_sliding_kv(40);
  ASSERT_TRUE(kv.reserve(1, 18, 0).ok());
  kv.slide(1, 18);  // sliding: blocks 0, 1, 2 freed (window of 18 from 13)
  ASSERT_EQ(kv.block_table(1, 0)[2], KvCache::kFreed);
  const int64_t free_before = kv.free_blocks();
  EXPECT_EQ(kv.fork(1, 2, 18, /*copy_partial=*/true), 18);
  EXPECT_EQ(kv.free_blocks(), free_before - 2);  // one copied block per group
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(kv.block_table(2, 1)[i], kv.block_table(1, 1)[i]);
    EXPECT_EQ(kv.block_table(2, 0)[i], kv.block_table(1, 0)[i]);
  }
  EXPECT_EQ(kv.block_refs(kv.block_table(1, 0)[3]), 2);
  EXPECT_NE(kv.block_table(2, 0)[4], kv.block_table(1, 0)[4]);
  ASSERT_TRUE(kv.reserve(2, 19, 18).ok());
  // Without a copy the child computes from position 16, whose window (11..)
  // needs block 2, released: it starts where every block it needs is held.
  const int64_t child = kv.fork(1, 3, 18, /*copy_partial=*/false);
  EXPECT_EQ(child % kBlock, 0);
  ASSERT_TRUE(kv.reserve(3, 18, child).ok());
  EXPECT_EQ(child, 0) << "block 2 is the only way to 16's window";
  kv.release(1);
  kv.release(2);
  kv.release(3);
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
}

// Prefix caching with a sliding group: a hit of k blocks needs the full
// group's blocks 0..k-1 and only the sliding group's blocks that the window
// of position 4k reaches; those the sequence slid past stay cached.
TEST(KvCacheTest, APrefixHitNeedsOnlyTheWindowOfASlidingGroup) {
  KvCache kv = make_sliding_kv(40, /*caching=*/true);
  const std::vector<int32_t> a = seq_tokens(30, 100);
  const int64_t n = 30;
  for (int64_t pos = 0; pos < n; pos += 5) {
    const int64_t to = std::min(n, pos + 5);
    ASSERT_TRUE(kv.reserve(1, to, pos, n).ok());
    kv.cache_blocks(1, a.data(), to);
    kv.slide(1, to);
  }
  // 7 full blocks in each group (those the sliding group slid past too).
  EXPECT_EQ(kv.cached_blocks(), 14);
  EXPECT_EQ(kv.total_blocks() - kv.free_blocks(), kv.blocks_held(1));
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  std::vector<int32_t> b = a;
  b.push_back(7);  // 31 tokens: up to 7 blocks can hit
  int64_t evictable = 0, hit = 0;
  EXPECT_EQ(kv.cached_prefix_blocks(b.data(), 31, &evictable), 7);
  EXPECT_EQ(evictable, 7 + 2);  // the full group's 7, the window of 28 (23..): blocks 5, 6
  // Admission: those 9, plus block 7 of each group.
  EXPECT_EQ(kv.blocks_to_start(b.data(), 31, 8, &hit), 9 + 2);
  EXPECT_EQ(hit, 28);
  EXPECT_EQ(kv.match_prefix(2, b.data(), 31), 28);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(kv.block_table(2, 0)[i], KvCache::kFreed);
  EXPECT_NE(kv.block_table(2, 0)[5], KvCache::kFreed);
  EXPECT_EQ(kv.blocks_held(2), 9);
  ASSERT_TRUE(kv.reserve(2, 31, 28, 31).ok());
  EXPECT_EQ(kv.blocks_held(2), 11);
  kv.release(2);
  // The sliding group's block 6 evicted: a hit at 7 blocks is gone, one at
  // 6 needs blocks 4 and 5 (window of 24 from 19), which are still cached.
  std::vector<int32_t> c(b.begin(), b.begin() + 26);  // up to 6 blocks
  EXPECT_EQ(kv.cached_prefix_blocks(c.data(), 26, nullptr), 6);
  // Take every free block but the cached ones, then evict down the LRU list
  // until a block of the sliding group near the end goes.
  // (a table of n positions takes n / 4 blocks in each of the 2 groups)
  ASSERT_TRUE(kv.reserve(9, (kv.total_blocks() - kv.evictable_blocks()) / 2 * kBlock).ok());
  EXPECT_EQ(kv.free_blocks(), kv.evictable_blocks());
  int64_t taken = 0;
  while (kv.cached_prefix_blocks(b.data(), 31, nullptr) == 7) {
    kv.release(10);
    ASSERT_TRUE(kv.reserve(10, ++taken * kBlock).ok());
  }
  EXPECT_LT(kv.cached_prefix_blocks(b.data(), 31, nullptr), 7);
}

}  // namespace
}  // namespace msinfer::runtime
