#include "msinfer/runtime/kv_cache.h"

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

Status KvCache::reserve(int64_t id, int64_t tokens) {
  const int64_t need = blocks_for(tokens);
  auto& table = tables_[id];
  const int64_t extra = need - static_cast<int64_t>(table.size());
  if (extra > free_blocks()) {
    if (table.empty()) tables_.erase(id);
    return resource_exhausted("KV cache: " + std::to_string(extra) + " blocks needed, " +
                              std::to_string(free_blocks()) + " free");
  }
  for (int64_t i = 0; i < extra; ++i) {
    table.push_back(free_.back());
    refs_[static_cast<size_t>(free_.back())] = 1;
    free_.pop_back();
  }
  return ok_status();
}

void KvCache::release(int64_t id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) {
    MSI_CHECK(refs_[static_cast<size_t>(b)] > 0) << "KV block " << b << " released twice";
    if (--refs_[static_cast<size_t>(b)] == 0) free_.push_back(b);
  }
  tables_.erase(it);
}

int64_t KvCache::fork(int64_t parent, int64_t child, int64_t tokens, bool copy_partial) {
  auto it = tables_.find(parent);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for sequence " << parent;
  MSI_CHECK(tables_.find(child) == tables_.end()) << "sequence " << child << " holds KV blocks";
  const std::vector<int32_t>& from = it->second;
  MSI_CHECK(blocks_for(tokens) <= static_cast<int64_t>(from.size()))
      << "sequence " << parent << " holds " << from.size() << " blocks, not " << tokens
      << " positions";
  const int64_t full = tokens / block_size_;
  std::vector<int32_t> table(from.begin(), from.begin() + full);
  for (int32_t b : table) ++refs_[static_cast<size_t>(b)];
  int64_t covered = full * block_size_;
  if (covered < tokens && copy_partial && host_pools() && !free_.empty()) {
    const int32_t src = from[static_cast<size_t>(full)], dst = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(dst)] = 1;
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
  tables_.emplace(child, std::move(table));  // may rehash: `from` is not used after this
  return covered;
}

int64_t KvCache::blocks_held(int64_t id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

const int32_t* KvCache::block_table(int64_t id) const {
  auto it = tables_.find(id);
  MSI_CHECK(it != tables_.end()) << "no KV blocks for request " << id;
  return it->second.data();
}

kernels::cpu::PagedKvLayer KvCache::layer(int l) {
  if (k_.empty()) return kernels::cpu::PagedKvLayer{nullptr, nullptr, block_size_, kv_heads_, head_dim_};
  const size_t off = static_cast<size_t>(l) * num_blocks_ * block_size_ * slot_elems_;
  return kernels::cpu::PagedKvLayer{k_.as<bf16>() + off, v_.empty() ? nullptr : v_.as<bf16>() + off,
                                    block_size_, kv_heads_, head_dim_};
}

}  // namespace msinfer::runtime
