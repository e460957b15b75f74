#include "msinfer/runtime/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <numeric>

#include "msinfer/runtime/prefix_hash.h"

namespace msinfer::runtime {

int64_t KvCache::bytes_per_token(const ModelConfig& c) {
  if (c.kv_lora_rank > 0) return 2 /*bf16*/ * (c.kv_lora_rank + c.qk_rope_head_dim) * c.layers;
  return 2 /*K,V*/ * 2 /*bf16*/ * c.kv_heads * c.head_dim * c.layers;
}

int64_t KvCache::block_bytes() const {
  return kv_pools_ * 2 /*bf16*/ * group_layers_ * block_size_ * slot_elems_;
}

StatusOr<KvCache> KvCache::create(const ModelConfig& c, int64_t budget_bytes, int64_t block_size,
                                  bool host_pools, const PoolMemory& pool_memory) {
  if (block_size < 1) return invalid_argument("KV block size must be >= 1");
  KvCache kv;
  kv.block_size_ = block_size;
  const bool mla = c.kv_lora_rank > 0;
  kv.kv_heads_ = mla ? 1 : c.kv_heads;
  kv.head_dim_ = mla ? c.kv_lora_rank + c.qk_rope_head_dim : c.head_dim;
  kv.slot_elems_ = kv.kv_heads_ * kv.head_dim_;
  kv.kv_pools_ = mla ? 1 : 2;
  // Layer groups: the layers of each window (in the order windows first
  // appear), cut into runs of S = gcd of the kinds' counts.
  std::vector<int64_t> windows;
  std::vector<std::vector<int>> kinds;
  for (int l = 0; l < c.layers; ++l) {
    const int64_t w = mla ? 0 : c.attention_window(l);
    auto it = std::find(windows.begin(), windows.end(), w);
    if (it == windows.end()) {
      windows.push_back(w);
      kinds.emplace_back();
      it = windows.end() - 1;
    }
    kinds[static_cast<size_t>(it - windows.begin())].push_back(l);
  }
  int s = 0;
  for (const auto& k : kinds) s = std::gcd(s, static_cast<int>(k.size()));
  kv.group_layers_ = std::max(s, 1);
  kv.layer_group_.assign(static_cast<size_t>(c.layers), 0);
  kv.layer_index_.assign(static_cast<size_t>(c.layers), 0);
  for (size_t k = 0; k < kinds.size(); ++k) {
    for (size_t i = 0; i < kinds[k].size(); ++i) {
      if (i % static_cast<size_t>(kv.group_layers_) == 0) kv.group_window_.push_back(windows[k]);
      kv.layer_group_[static_cast<size_t>(kinds[k][i])] =
          static_cast<int>(kv.group_window_.size()) - 1;
      kv.layer_index_[static_cast<size_t>(kinds[k][i])] =
          static_cast<int>(i % static_cast<size_t>(kv.group_layers_));
    }
    if (windows[k] > 0) kv.sliding_ = true;
  }
  if (kv.group_window_.empty()) kv.group_window_.push_back(0);  // no layers (tests)
  const int64_t per_token_layer = bytes_per_token(c) / std::max(c.layers, 1);
  kv.num_blocks_ = budget_bytes / (per_token_layer * kv.group_layers_ * block_size);
  if (kv.num_blocks_ < 1) {
    return resource_exhausted(
        "KV cache budget of " + std::to_string(budget_bytes) + " bytes holds no block of " +
        std::to_string(block_size) + " tokens (" +
        std::to_string(per_token_layer * kv.group_layers_ * block_size) + " bytes needed)");
  }
  const size_t n =
      static_cast<size_t>(kv.group_layers_ * kv.num_blocks_ * block_size * kv.slot_elems_);
  if (host_pools) {
    const size_t bytes = static_cast<size_t>(kv.kv_pools_) * n * sizeof(bf16);
    if (pool_memory) kv.external_ = pool_memory(bytes);
    uint8_t* base = kv.external_.get();
    if (base == nullptr) {
      MSI_ASSIGN_OR_RETURN(kv.own_, ZeroPages::allocate(bytes));
      base = kv.own_.data();
    }
    kv.k_ = reinterpret_cast<bf16*>(base);
    if (!mla) kv.v_ = kv.k_ + n;
    kv.pool_bytes_ = static_cast<int64_t>(bytes);
  }
  for (int64_t b = kv.num_blocks_ - 1; b >= 0; --b) kv.free_.push_back(static_cast<int32_t>(b));
  kv.refs_.assign(static_cast<size_t>(kv.num_blocks_), 0);
  return kv;
}

int64_t KvCache::first_needed(int g, int64_t pos) const {
  const int64_t w = group_window(g);
  return w > 0 ? std::max<int64_t>(0, pos - w + 1) / block_size_ : 0;
}

int64_t KvCache::entries_needed(int g, int64_t tokens, int64_t hold_to) const {
  return blocks_for(group_window(g) > 0 ? tokens : std::max(tokens, hold_to));
}

int64_t KvCache::max_blocks(int64_t tokens, int64_t chunk) const {
  int64_t n = 0;
  for (int g = 0; g < groups(); ++g) {
    const int64_t w = group_window(g);
    n += w > 0 ? std::min(blocks_for(tokens), blocks_for(w - 1 + std::max<int64_t>(chunk, 1)) + 1)
               : blocks_for(tokens);
  }
  return n;
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
    unregister(b);
  }
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvCache::drop_ref(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  MSI_CHECK(refs_[i] > 0) << "KV block " << b << " released twice";
  if (--refs_[i] > 0) return;
  if (caching_ && registered_[i]) {
    lru_pos_[i] = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
  }
}

int64_t KvCache::blocks_to_take(int64_t id, int64_t tokens, int64_t from, int64_t hold_to) const {
  auto it = tables_.find(id);
  int64_t extra = 0;
  for (int g = 0; g < groups(); ++g) {
    const int64_t have =
        it == tables_.end()
            ? 0
            : static_cast<int64_t>(it->second.blocks[static_cast<size_t>(g)].size());
    extra += std::max<int64_t>(
        0, entries_needed(g, tokens, hold_to) - std::max(have, first_needed(g, from)));
  }
  return extra;
}

void KvCache::slide(int64_t id, int64_t next) {
  if (!sliding_) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  for (int g = 0; g < groups(); ++g) {
    if (group_window(g) == 0) continue;
    std::vector<int32_t>& t = it->second.blocks[static_cast<size_t>(g)];
    const size_t lo = std::min(static_cast<size_t>(first_needed(g, next)), t.size());
    // Earliest first: the LRU list evicts a sequence's oldest blocks first.
    for (size_t i = 0; i < lo; ++i) {
      if (t[i] == kFreed) continue;
      drop_ref(t[i]);
      t[i] = kFreed;
    }
  }
}

Status KvCache::reserve(int64_t id, int64_t tokens, int64_t from, int64_t hold_to) {
  slide(id, from);
  const int64_t extra = blocks_to_take(id, tokens, from, hold_to);
  auto [it, fresh] = tables_.try_emplace(id);
  Table& table = it->second;
  if (fresh) table.blocks.resize(static_cast<size_t>(groups()));
  if (extra > free_blocks()) {
    if (fresh) tables_.erase(it);
    return resource_exhausted("KV cache: " + std::to_string(extra) + " blocks needed, " +
                              std::to_string(free_blocks()) + " free");
  }
  for (int g = 0; g < groups(); ++g) {
    std::vector<int32_t>& t = table.blocks[static_cast<size_t>(g)];
    const size_t lo = static_cast<size_t>(first_needed(g, from));
    for (size_t i = lo; i < t.size(); ++i) {
      MSI_CHECK(t[i] != kFreed) << "sequence " << id << " needs block " << i << " of layer group "
                                << g << " again after releasing it";
    }
    while (t.size() < lo) t.push_back(kFreed);
    const size_t hi = static_cast<size_t>(entries_needed(g, tokens, hold_to));
    while (t.size() < hi) t.push_back(take_block());
  }
  return ok_status();
}

void KvCache::release(int64_t id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  for (const std::vector<int32_t>& blocks : it->second.blocks) {
    // Last block first: the end of a chain is evicted before its start.
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
      if (*b != kFreed) drop_ref(*b);
    }
  }
  tables_.erase(it);
}

void KvCache::enable_prefix_caching(uint64_t salt) {
  MSI_CHECK(tables_.empty()) << "prefix caching is turned on before any sequence";
  caching_ = true;
  salt_ = salt;
  const size_t n = static_cast<size_t>(num_blocks_);
  cached_.assign(static_cast<size_t>(groups()), {});
  hash_.assign(n, 0);
  block_group_.assign(n, 0);
  registered_.assign(n, 0);
  tokens_.assign(n * static_cast<size_t>(block_size_), 0);
  lru_pos_.assign(n, lru_.end());
}

int64_t KvCache::cached_blocks() const {
  int64_t n = 0;
  for (const auto& m : cached_) n += static_cast<int64_t>(m.size());
  return n;
}

uint64_t KvCache::chain_hash(uint64_t parent, const int32_t* t) const {
  return prefix_block_hash(parent, t, block_size_);
}

bool KvCache::holds(int32_t b, const int32_t* t) const {
  const int32_t* have = tokens_.data() + static_cast<size_t>(b) * static_cast<size_t>(block_size_);
  return std::equal(have, have + block_size_, t);
}

template <typename Visit>
int64_t KvCache::find_cached_prefix(const int32_t* tokens, int64_t n, std::vector<uint64_t>* hashes,
                                    Visit visit) const {
  if (!caching_) return 0;
  const int G = groups();
  // found[g][i]: group g's registered block for block i of the chain, or kFreed.
  std::vector<std::vector<int32_t>> found(static_cast<size_t>(G));
  std::vector<uint64_t> chain;
  uint64_t h = salt_;
  for (int64_t i = 0; i < (n - 1) / block_size_; ++i) {
    const int32_t* t = tokens + i * block_size_;
    h = chain_hash(h, t);
    bool full_missing = false;
    for (int g = 0; g < G; ++g) {
      const auto& map = cached_[static_cast<size_t>(g)];
      auto it = map.find(h);
      const int32_t b = it != map.end() && holds(it->second, t) ? it->second : kFreed;
      if (b == kFreed && group_window(g) == 0) full_missing = true;
      found[static_cast<size_t>(g)].push_back(b);
    }
    if (full_missing) break;  // no longer prefix can serve a full-attention group
    chain.push_back(h);
  }
  // The longest k whose needed blocks every sliding group has.
  int64_t k = static_cast<int64_t>(chain.size());
  for (; k > 0; --k) {
    bool ok = true;
    for (int g = 0; g < G && ok; ++g) {
      if (group_window(g) == 0) continue;
      for (int64_t i = first_needed(g, k * block_size_); i < k && ok; ++i) {
        ok = found[static_cast<size_t>(g)][static_cast<size_t>(i)] != kFreed;
      }
    }
    if (ok) break;
  }
  for (int g = 0; g < G; ++g) {
    for (int64_t i = first_needed(g, k * block_size_); i < k; ++i) {
      visit(g, i, found[static_cast<size_t>(g)][static_cast<size_t>(i)]);
    }
  }
  if (hashes != nullptr) hashes->assign(chain.begin(), chain.begin() + k);
  return k;
}

int64_t KvCache::cached_prefix_blocks(const int32_t* tokens, int64_t n, int64_t* evictable) const {
  int64_t idle = 0;
  const int64_t k = find_cached_prefix(tokens, n, nullptr, [&](int, int64_t, int32_t b) {
    if (refs_[static_cast<size_t>(b)] == 0) ++idle;
  });
  if (evictable != nullptr) *evictable = idle;
  return k;
}

int64_t KvCache::blocks_to_start(const int32_t* tokens, int64_t n, int64_t chunk,
                                 int64_t* hit) const {
  int64_t evictable = 0;
  const int64_t k = cached_prefix_blocks(tokens, n, &evictable);
  const int64_t from = k * block_size_, to = std::min(n, from + std::max<int64_t>(chunk, 1));
  int64_t need = evictable;
  for (int g = 0; g < groups(); ++g) need += std::max<int64_t>(0, entries_needed(g, to, n) - k);
  if (hit != nullptr) *hit = from;
  return need;
}

int64_t KvCache::match_prefix(int64_t id, const int32_t* tokens, int64_t n) {
  MSI_CHECK(tables_.find(id) == tables_.end()) << "sequence " << id << " holds KV blocks";
  Table table;
  table.blocks.resize(static_cast<size_t>(groups()));
  std::vector<uint64_t> hashes;
  // Taking a block changes its references and the LRU list, never what the
  // walk reads (the registered hashes and their blocks' tokens).
  const int64_t k = find_cached_prefix(tokens, n, &hashes, [&](int g, int64_t i, int32_t b) {
    std::vector<int32_t>& t = table.blocks[static_cast<size_t>(g)];
    t.resize(static_cast<size_t>(std::max<int64_t>(static_cast<int64_t>(t.size()), i + 1)), kFreed);
    t[static_cast<size_t>(i)] = b;
    const size_t bi = static_cast<size_t>(b);
    if (refs_[bi]++ == 0) {
      lru_.erase(lru_pos_[bi]);
      lru_pos_[bi] = lru_.end();
    }
  });
  if (k == 0) return 0;
  for (auto& t : table.blocks) t.resize(static_cast<size_t>(k), kFreed);
  table.hashes = std::move(hashes);
  tables_.emplace(id, std::move(table));
  return k * block_size_;
}

void KvCache::cache_blocks(int64_t id, const int32_t* tokens, int64_t computed) {
  if (!caching_) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  size_t longest = 0;
  for (const auto& g : t.blocks) longest = std::max(longest, g.size());
  const size_t full = std::min(static_cast<size_t>(computed / block_size_), longest);
  while (t.hashes.size() < full) {
    const size_t i = t.hashes.size();
    const int32_t* bt = tokens + static_cast<int64_t>(i) * block_size_;
    const uint64_t h = chain_hash(i == 0 ? salt_ : t.hashes.back(), bt);
    t.hashes.push_back(h);
    for (size_t g = 0; g < t.blocks.size(); ++g) {
      if (i >= t.blocks[g].size() || t.blocks[g][i] == kFreed) continue;
      const int32_t b = t.blocks[g][i];
      const size_t bi = static_cast<size_t>(b);
      if (registered_[bi] || !cached_[g].emplace(h, b).second) continue;
      registered_[bi] = 1;
      hash_[bi] = h;
      note_cache_event(h, +1);
      block_group_[bi] = static_cast<int32_t>(g);
      std::copy(bt, bt + block_size_,
                tokens_.begin() + static_cast<std::ptrdiff_t>(bi) * block_size_);
    }
  }
}

void KvCache::unregister(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  cached_[static_cast<size_t>(block_group_[i])].erase(hash_[i]);
  registered_[i] = 0;
  lru_pos_[i] = lru_.end();
  note_cache_event(hash_[i], -1);
}

void KvCache::note_cache_event(uint64_t h, int32_t delta) {
  if (!recording_) return;
  auto [it, fresh] = pending_events_.try_emplace(h, 0);
  it->second += delta;
  if (it->second == 0) pending_events_.erase(it);
}

int64_t KvCache::take_cache_events(int64_t max, std::vector<uint64_t>* stored,
                                   std::vector<uint64_t>* removed) {
  int64_t left = max;
  // Removals first, then registrations; an entry is taken whole or in part.
  for (const bool removals : {true, false}) {
    for (auto it = pending_events_.begin(); it != pending_events_.end() && left > 0;) {
      if ((it->second < 0) != removals) {
        ++it;
        continue;
      }
      std::vector<uint64_t>* out = removals ? removed : stored;
      const int32_t step = removals ? 1 : -1;  // toward 0
      while (it->second != 0 && left > 0) {
        out->push_back(it->first);
        it->second += step;
        --left;
      }
      it = it->second == 0 ? pending_events_.erase(it) : std::next(it);
    }
  }
  int64_t pending = 0;
  for (const auto& [h, n] : pending_events_) pending += n < 0 ? -n : n;
  return pending;
}

void KvCache::flush_cache() {
  for (int32_t b : lru_) {
    unregister(b);
    free_.push_back(b);
  }
  lru_.clear();
}

int64_t KvCache::fork(int64_t parent, int64_t child, int64_t tokens, bool copy_partial) {
  auto it = tables_.find(parent);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for sequence " << parent;
  MSI_CHECK(tables_.find(child) == tables_.end()) << "sequence " << child << " holds KV blocks";
  const Table& from = it->second;
  int64_t full = tokens / block_size_;
  const bool copy = copy_partial && host_pools() && free_blocks() >= groups();
  if (full * block_size_ < tokens && !copy) {
    // The child computes from the last full block on: a sliding group needs
    // the blocks of that position's window, which the parent (further on)
    // may have released; start it where every group still has them.
    auto usable = [&](int64_t f) {
      for (int g = 0; g < groups(); ++g) {
        const auto& t = from.blocks[static_cast<size_t>(g)];
        for (int64_t i = first_needed(g, f * block_size_); i < f; ++i) {
          if (t[static_cast<size_t>(i)] == kFreed) return false;
        }
      }
      return true;
    };
    while (full > 0 && !usable(full)) --full;
  }
  Table child_table;
  child_table.blocks.resize(static_cast<size_t>(groups()));
  for (int g = 0; g < groups(); ++g) {
    const std::vector<int32_t>& src = from.blocks[static_cast<size_t>(g)];
    MSI_CHECK(blocks_for(tokens) <= static_cast<int64_t>(src.size()))
        << "sequence " << parent << " holds " << src.size() << " blocks of layer group " << g
        << ", not " << tokens << " positions";
    std::vector<int32_t>& table = child_table.blocks[static_cast<size_t>(g)];
    table.assign(src.begin(), src.begin() + full);
    for (int32_t b : table) {
      if (b != kFreed) ++refs_[static_cast<size_t>(b)];
    }
  }
  const std::vector<uint64_t>& hashes = from.hashes;
  child_table.hashes.assign(
      hashes.begin(),
      hashes.begin() + std::min<std::ptrdiff_t>(full, static_cast<std::ptrdiff_t>(hashes.size())));
  int64_t covered = full * block_size_;
  if (covered < tokens && copy) {
    // Per pool a block is [kv_heads][block_size][head_dim], contiguous; a
    // group's block is that in each of its group_layers_ pools.
    const size_t block_elems = static_cast<size_t>(block_size_ * slot_elems_);
    for (int g = 0; g < groups(); ++g) {
      const int32_t src = from.blocks[static_cast<size_t>(g)][static_cast<size_t>(full)];
      MSI_CHECK(src != kFreed) << "the last block of sequence " << parent << " was released";
      const int32_t dst = take_block();
      for (int j = 0; j < group_layers_; ++j) {
        const size_t pool_off =
            static_cast<size_t>(j) * static_cast<size_t>(num_blocks_) * block_elems;
        for (bf16* pool : {k_, v_}) {
          if (pool == nullptr) continue;
          bf16* base = pool + pool_off;
          std::memcpy(base + static_cast<size_t>(dst) * block_elems,
                      base + static_cast<size_t>(src) * block_elems, block_elems * sizeof(bf16));
        }
      }
      child_table.blocks[static_cast<size_t>(g)].push_back(dst);
    }
    covered = tokens;
  }
  tables_.emplace(child, std::move(child_table));  // may rehash: `from` is not used after this
  return covered;
}

int64_t KvCache::blocks_held(int64_t id) const {
  int64_t n = 0;
  for (int g = 0; g < groups(); ++g) n += blocks_held(id, g);
  return n;
}

int64_t KvCache::blocks_held(int64_t id, int group) const {
  auto it = tables_.find(id);
  if (it == tables_.end()) return 0;
  const auto& t = it->second.blocks[static_cast<size_t>(group)];
  return static_cast<int64_t>(t.size()) - std::count(t.begin(), t.end(), kFreed);
}

const int32_t* KvCache::block_table(int64_t id, int group) const {
  auto it = tables_.find(id);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for request " << id;
  return it->second.blocks[static_cast<size_t>(group)].data();
}

uint64_t KvCache::layout_id() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the numbers that fix where a value lives
  auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i)
      h = (h ^ static_cast<uint64_t>((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  for (int64_t v :
       {block_size_, slot_elems_, kv_heads_, head_dim_, static_cast<int64_t>(group_layers_),
        static_cast<int64_t>(kv_pools_), static_cast<int64_t>(layer_group_.size())}) {
    mix(v);
  }
  for (int64_t w : group_window_) mix(w);
  mix(2);  // export_kv's order: 2 = group, layer, pool, entry
  for (size_t l = 0; l < layer_group_.size(); ++l) mix(layer_group_[l] * 65536 + layer_index_[l]);
  return h;
}

int64_t KvCache::transfer_blocks(int64_t tokens) const {
  int64_t n = 0;
  for (int g = 0; g < groups(); ++g) n += blocks_for(tokens) - first_needed(g, tokens);
  return n;
}

int64_t KvCache::transfer_bytes(int64_t tokens) const {
  return transfer_blocks(tokens) * group_layers_ * kv_pools_ * block_size_ * slot_elems_ *
         static_cast<int64_t>(sizeof(bf16));
}

// Every transfer walks the same order: group, layer of the group, K then V,
// table entry; a fresh pool hands out consecutive blocks, so one layer's
// entries are mostly one run.
template <typename Visit>
void KvCache::walk_transfer(const std::vector<std::vector<int32_t>>& entries, int64_t pool_blocks,
                            Visit visit) const {
  const int64_t block = block_size_ * slot_elems_ * static_cast<int64_t>(sizeof(bf16));
  for (int g = 0; g < groups(); ++g) {
    for (int j = 0; j < group_layers_; ++j) {
      for (int p = 0; p < kv_pools_; ++p) {
        const int64_t pool_at = (static_cast<int64_t>(p) * group_layers_ + j) * pool_blocks * block;
        for (const int32_t b : entries[static_cast<size_t>(g)]) {
          MSI_CHECK(b != kFreed) << "a block of layer group " << g << " was released";
          visit(pool_at + b * block, block);
        }
      }
    }
  }
}

const KvCache::Table& KvCache::transfer_source(int64_t id, int64_t tokens) const {
  auto it = tables_.find(id);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for sequence " << id;
  for (int g = 0; g < groups(); ++g) {
    MSI_CHECK(static_cast<int64_t>(it->second.blocks[static_cast<size_t>(g)].size()) >=
              blocks_for(tokens))
        << "sequence " << id << " holds fewer than " << tokens << " positions";
  }
  return it->second;
}

void KvCache::export_kv(int64_t id, int64_t tokens, uint8_t* out) const {
  MSI_CHECK(host_pools()) << "export_kv needs the K/V pools in this process";
  walk_transfer(transfer_table(id, tokens), num_blocks_, [&](int64_t at, int64_t bytes) {
    std::memcpy(out, pool_data() + at, static_cast<size_t>(bytes));
    out += bytes;
  });
}

Status KvCache::import_kv(int64_t id, int64_t tokens, const uint8_t* data, int64_t size) {
  if (!host_pools()) return invalid_argument("KV import needs the K/V pools in this process");
  if (tokens < 1 || size != transfer_bytes(tokens)) {
    return invalid_argument("KV transfer of " + std::to_string(size) + " bytes for " +
                            std::to_string(tokens) + " positions; this cache expects " +
                            std::to_string(tokens < 1 ? 0 : transfer_bytes(tokens)));
  }
  MSI_RETURN_IF_ERROR(place_kv(id, tokens));
  walk_transfer(transfer_table(id, tokens), num_blocks_, [&](int64_t at, int64_t bytes) {
    std::memcpy(pool_data() + at, data, static_cast<size_t>(bytes));
    data += bytes;
  });
  return ok_status();
}

std::vector<KvCache::Copy> KvCache::pair_spans(const std::vector<Span>& from,
                                               const std::vector<Span>& to) {
  std::vector<Copy> out;
  size_t i = 0, j = 0;
  int64_t di = 0, dj = 0;  // bytes of from[i] / to[j] already covered
  while (i < from.size() && j < to.size()) {
    const int64_t n = std::min(from[i].bytes - di, to[j].bytes - dj);
    out.push_back(Copy{from[i].offset + di, to[j].offset + dj, n});
    di += n;
    dj += n;
    if (di == from[i].bytes) ++i, di = 0;
    if (dj == to[j].bytes) ++j, dj = 0;
  }
  return out;
}

Status KvCache::place_kv(int64_t id, int64_t tokens) {
  MSI_CHECK(tables_.find(id) == tables_.end()) << "sequence " << id << " holds KV blocks";
  if (!host_pools()) return invalid_argument("KV transfers need the K/V pools in this process");
  if (tokens < 1) return invalid_argument("a KV transfer of no positions");
  // reserve with from = tokens takes exactly the entries a transfer moves:
  // all of a full-attention group's, a sliding group's window of `tokens`.
  return reserve(id, tokens, tokens);
}

std::vector<std::vector<int32_t>> KvCache::transfer_table(int64_t id, int64_t tokens,
                                                          int64_t skip) const {
  const Table& t = transfer_source(id, tokens);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(groups()));
  for (int g = 0; g < groups(); ++g) {
    const auto& blocks = t.blocks[static_cast<size_t>(g)];
    out[static_cast<size_t>(g)].assign(blocks.begin() + std::max(first_needed(g, tokens), skip),
                                       blocks.begin() + blocks_for(tokens));
  }
  return out;
}

StatusOr<std::vector<KvCache::Span>> KvCache::transfer_spans(
    const std::vector<std::vector<int32_t>>& table, int64_t tokens, int64_t pool_blocks,
    int64_t skip) const {
  if (tokens < 1 || pool_blocks < 1 || static_cast<int>(table.size()) != groups()) {
    return invalid_argument("a K/V block table of " + std::to_string(table.size()) +
                            " layer groups for " + std::to_string(tokens) +
                            " positions; this cache has " + std::to_string(groups()));
  }
  if (skip < 0 || skip >= blocks_for(tokens) || (skip > 0 && sliding_)) {
    return invalid_argument("a K/V transfer that skips " + std::to_string(skip) + " blocks of " +
                            std::to_string(blocks_for(tokens)) +
                            (sliding_ ? " (sliding layer groups skip none)" : ""));
  }
  for (int g = 0; g < groups(); ++g) {
    const auto& t = table[static_cast<size_t>(g)];
    const int64_t first = std::max(first_needed(g, tokens), skip);
    if (static_cast<int64_t>(t.size()) != blocks_for(tokens) - first) {
      return invalid_argument("layer group " + std::to_string(g) + " of a K/V block table has " +
                              std::to_string(t.size()) + " blocks, not " +
                              std::to_string(blocks_for(tokens) - first));
    }
    for (int32_t b : t) {
      if (b < 0 || b >= pool_blocks) {
        return invalid_argument("K/V block " + std::to_string(b) + " outside a pool of " +
                                std::to_string(pool_blocks));
      }
    }
  }
  std::vector<Span> spans;
  walk_transfer(table, pool_blocks, [&](int64_t at, int64_t bytes) {
    if (!spans.empty() && spans.back().offset + spans.back().bytes == at) {
      spans.back().bytes += bytes;
    } else {
      spans.push_back(Span{at, bytes});
    }
  });
  return spans;
}

kernels::cpu::PagedKvLayer KvCache::layer(int l) {
  if (k_ == nullptr)
    return kernels::cpu::PagedKvLayer{nullptr, nullptr, block_size_, kv_heads_, head_dim_};
  const size_t off = static_cast<size_t>(layer_index_[static_cast<size_t>(l)]) *
                     static_cast<size_t>(num_blocks_ * block_size_ * slot_elems_);
  return kernels::cpu::PagedKvLayer{k_ + off, v_ == nullptr ? nullptr : v_ + off, block_size_,
                                    kv_heads_, head_dim_};
}

}  // namespace msinfer::runtime
