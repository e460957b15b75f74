#include "msinfer/runtime/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace msinfer::runtime {

int64_t KvCache::bytes_per_token(const ModelConfig& c) {
  if (c.kv_lora_rank > 0) return 2 /*bf16*/ * (c.kv_lora_rank + c.qk_rope_head_dim) * c.layers;
  return 2 /*K,V*/ * 2 /*bf16*/ * c.kv_heads * c.head_dim * c.layers;
}

StatusOr<KvCache> KvCache::create(const ModelConfig& c, int64_t budget_bytes, int64_t block_size,
                                  bool host_pools) {
  if (block_size < 1) return invalid_argument("KV block size must be >= 1");
  KvCache kv;
  kv.block_size_ = block_size;
  kv.layers_ = c.layers;
  const bool mla = c.kv_lora_rank > 0;
  kv.kv_heads_ = mla ? 1 : c.kv_heads;
  kv.head_dim_ = mla ? c.kv_lora_rank + c.qk_rope_head_dim : c.head_dim;
  kv.slot_elems_ = kv.kv_heads_ * kv.head_dim_;
  kv.num_blocks_ = budget_bytes / (bytes_per_token(c) * block_size);
  if (kv.num_blocks_ < 1) {
    return resource_exhausted("KV cache budget of " + std::to_string(budget_bytes) +
                              " bytes holds no block of " + std::to_string(block_size) +
                              " tokens (" + std::to_string(bytes_per_token(c) * block_size) +
                              " bytes needed)");
  }
  const size_t n = static_cast<size_t>(c.layers * kv.num_blocks_ * block_size * kv.slot_elems_);
  if (host_pools) {
    MSI_ASSIGN_OR_RETURN(kv.k_, ZeroPages::allocate(n * sizeof(bf16)));
    if (!mla) {
      MSI_ASSIGN_OR_RETURN(kv.v_, ZeroPages::allocate(n * sizeof(bf16)));
    }
  }
  for (int64_t b = kv.num_blocks_ - 1; b >= 0; --b) kv.free_.push_back(static_cast<int32_t>(b));
  kv.refs_.assign(static_cast<size_t>(kv.num_blocks_), 0);
  return kv;
}

int32_t KvCache::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    MSI_CHECK(!lru_.empty()) << "KV cache: no free block";
    b = lru_.front();
    lru_.pop_front();
    const size_t i = static_cast<size_t>(b);
    cached_.erase(hash_[i]);
    registered_[i] = 0;
    lru_pos_[i] = lru_.end();
  }
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

Status KvCache::reserve(int64_t id, int64_t tokens) {
  const int64_t need = blocks_for(tokens);
  auto& table = tables_[id].blocks;
  const int64_t extra = need - static_cast<int64_t>(table.size());
  if (extra > free_blocks()) {
    if (table.empty()) tables_.erase(id);
    return resource_exhausted("KV cache: " + std::to_string(extra) + " blocks needed, " +
                              std::to_string(free_blocks()) + " free");
  }
  for (int64_t i = 0; i < extra; ++i) table.push_back(take_block());
  return ok_status();
}

void KvCache::release(int64_t id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  // Last block first: the end of a chain is evicted before its start.
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    const size_t i = static_cast<size_t>(*b);
    MSI_CHECK(refs_[i] > 0) << "KV block " << *b << " released twice";
    if (--refs_[i] > 0) continue;
    if (caching_ && registered_[i]) {
      lru_pos_[i] = lru_.insert(lru_.end(), *b);
    } else {
      free_.push_back(*b);
    }
  }
  tables_.erase(it);
}

void KvCache::enable_prefix_caching(uint64_t salt) {
  MSI_CHECK(tables_.empty()) << "prefix caching is turned on before any sequence";
  caching_ = true;
  salt_ = salt;
  const size_t n = static_cast<size_t>(num_blocks_);
  hash_.assign(n, 0);
  registered_.assign(n, 0);
  tokens_.assign(n * static_cast<size_t>(block_size_), 0);
  lru_pos_.assign(n, lru_.end());
}

uint64_t KvCache::chain_hash(uint64_t parent, const int32_t* t) const {
  // splitmix64 over the parent and each token: a chain differs if any
  // token before its end does.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent);
  for (int64_t i = 0; i < block_size_; ++i) h = mix(h ^ static_cast<uint32_t>(t[i]));
  return h;
}

bool KvCache::holds(int32_t b, const int32_t* t) const {
  const int32_t* have = tokens_.data() + static_cast<size_t>(b) * static_cast<size_t>(block_size_);
  return std::equal(have, have + block_size_, t);
}

template <typename Visit>
void KvCache::walk_cached_prefix(const int32_t* tokens, int64_t n, Visit visit) const {
  if (!caching_) return;
  uint64_t h = salt_;
  for (int64_t i = 0; i < (n - 1) / block_size_; ++i) {
    const int32_t* t = tokens + i * block_size_;
    h = chain_hash(h, t);
    auto it = cached_.find(h);
    if (it == cached_.end() || !holds(it->second, t)) return;
    visit(it->second, h);
  }
}

int64_t KvCache::cached_prefix_blocks(const int32_t* tokens, int64_t n, int64_t* evictable) const {
  int64_t found = 0, idle = 0;
  walk_cached_prefix(tokens, n, [&](int32_t b, uint64_t) {
    ++found;
    if (refs_[static_cast<size_t>(b)] == 0) ++idle;
  });
  if (evictable != nullptr) *evictable = idle;
  return found;
}

int64_t KvCache::match_prefix(int64_t id, const int32_t* tokens, int64_t n) {
  MSI_CHECK(tables_.find(id) == tables_.end()) << "sequence " << id << " holds KV blocks";
  Table table;
  // Taking a block changes its references and the LRU list, never what the
  // walk reads (the registered hashes and their blocks' tokens).
  walk_cached_prefix(tokens, n, [&](int32_t b, uint64_t h) {
    const size_t bi = static_cast<size_t>(b);
    if (refs_[bi]++ == 0) {
      lru_.erase(lru_pos_[bi]);
      lru_pos_[bi] = lru_.end();
    }
    table.blocks.push_back(b);
    table.hashes.push_back(h);
  });
  const int64_t covered = static_cast<int64_t>(table.blocks.size()) * block_size_;
  if (!table.blocks.empty()) tables_.emplace(id, std::move(table));
  return covered;
}

void KvCache::cache_blocks(int64_t id, const int32_t* tokens, int64_t computed) {
  if (!caching_) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const size_t full = std::min(static_cast<size_t>(computed / block_size_), t.blocks.size());
  while (t.hashes.size() < full) {
    const size_t i = t.hashes.size();
    const int32_t* bt = tokens + static_cast<int64_t>(i) * block_size_;
    const uint64_t h = chain_hash(i == 0 ? salt_ : t.hashes.back(), bt);
    t.hashes.push_back(h);
    const int32_t b = t.blocks[i];
    const size_t bi = static_cast<size_t>(b);
    if (registered_[bi] || !cached_.emplace(h, b).second) continue;
    registered_[bi] = 1;
    hash_[bi] = h;
    std::copy(bt, bt + block_size_,
              tokens_.begin() + static_cast<std::ptrdiff_t>(bi) * block_size_);
  }
}

void KvCache::flush_cache() {
  for (int32_t b : lru_) {
    const size_t i = static_cast<size_t>(b);
    cached_.erase(hash_[i]);
    registered_[i] = 0;
    lru_pos_[i] = lru_.end();
    free_.push_back(b);
  }
  lru_.clear();
}

int64_t KvCache::fork(int64_t parent, int64_t child, int64_t tokens, bool copy_partial) {
  auto it = tables_.find(parent);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for sequence " << parent;
  MSI_CHECK(tables_.find(child) == tables_.end()) << "sequence " << child << " holds KV blocks";
  const std::vector<int32_t>& from = it->second.blocks;
  MSI_CHECK(blocks_for(tokens) <= static_cast<int64_t>(from.size()))
      << "sequence " << parent << " holds " << from.size() << " blocks, not " << tokens
      << " positions";
  const int64_t full = tokens / block_size_;
  Table child_table;
  std::vector<int32_t>& table = child_table.blocks;
  table.assign(from.begin(), from.begin() + full);
  const std::vector<uint64_t>& hashes = it->second.hashes;
  child_table.hashes.assign(
      hashes.begin(),
      hashes.begin() + std::min<std::ptrdiff_t>(full, static_cast<std::ptrdiff_t>(hashes.size())));
  for (int32_t b : table) ++refs_[static_cast<size_t>(b)];
  int64_t covered = full * block_size_;
  if (covered < tokens && copy_partial && host_pools() && free_blocks() > 0) {
    const int32_t src = from[static_cast<size_t>(full)], dst = take_block();
    // Per layer a block is [kv_heads][block_size][head_dim], contiguous.
    const size_t block_elems = static_cast<size_t>(block_size_ * slot_elems_);
    for (int l = 0; l < layers_; ++l) {
      const size_t layer_off =
          static_cast<size_t>(l) * static_cast<size_t>(num_blocks_) * block_elems;
      for (ZeroPages* pool : {&k_, &v_}) {
        if (pool->empty()) continue;
        bf16* base = pool->as<bf16>() + layer_off;
        std::memcpy(base + static_cast<size_t>(dst) * block_elems,
                    base + static_cast<size_t>(src) * block_elems, block_elems * sizeof(bf16));
      }
    }
    table.push_back(dst);
    covered = tokens;
  }
  tables_.emplace(child, std::move(child_table));  // may rehash: `from` is not used after this
  return covered;
}

int64_t KvCache::blocks_held(int64_t id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
}

const int32_t* KvCache::block_table(int64_t id) const {
  auto it = tables_.find(id);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for request " << id;
  return it->second.blocks.data();
}

kernels::cpu::PagedKvLayer KvCache::layer(int l) {
  if (k_.empty()) return kernels::cpu::PagedKvLayer{nullptr, nullptr, block_size_, kv_heads_, head_dim_};
  const size_t off = static_cast<size_t>(l) * num_blocks_ * block_size_ * slot_elems_;
  return kernels::cpu::PagedKvLayer{k_.as<bf16>() + off, v_.empty() ? nullptr : v_.as<bf16>() + off,
                                    block_size_, kv_heads_, head_dim_};
}

}  // namespace msinfer::runtime
