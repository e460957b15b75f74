// KvCache's reference-counted blocks (issue 47, n samples of one prompt):
// fork() shares full blocks, copies a partly filled last one, and a block is
// free again exactly when its last table lets it go.
#include "msinfer/runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <set>

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

}  // namespace
}  // namespace msinfer::runtime
