#include "msinfer/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <numeric>

#include "test_util.h"

namespace msinfer::kernels::cpu {
namespace {

using testing::randn;
using testing::rel_err;

// Two requests with scattered blocks; a prefill chunk of one and a decode token of
// the other in one batch, odd head_dim, GQA group 3.
TEST(AttentionTest, PagedMatchesReferenceForPrefillAndDecode) {
  for (int64_t hd : {1, 5, 16, 33}) {
    const int64_t kvh = 2, heads = 6, bs = 4, blocks = 12;
    std::vector<bf16> kpool(blocks * bs * kvh * hd), vpool(kpool.size());
    PagedKvLayer kv{kpool.data(), vpool.data(), bs, kvh, hd};
    std::vector<int32_t> table_a = {7, 2, 9}, table_b = {0, 11, 4, 5};
    // Request a: positions 0..9 prefilled in this step; request b: 13 cached + 1 decode.
    std::vector<int32_t> pos;
    std::vector<const int32_t*> tables;
    for (int p = 0; p < 10; ++p) {
      pos.push_back(p);
      tables.push_back(table_a.data());
    }
    auto cache_k = randn(13 * kvh * hd, 77), cache_v = randn(13 * kvh * hd, 78);
    std::vector<int32_t> cpos(13);
    std::iota(cpos.begin(), cpos.end(), 0);
    std::vector<const int32_t*> ctab(13, table_b.data());
    write_kv(kv, cache_k.data(), cache_v.data(), 13, cpos.data(), ctab.data());
    pos.push_back(13);
    tables.push_back(table_b.data());
    const int64_t T = static_cast<int64_t>(pos.size());
    auto k = randn(T * kvh * hd, 1 + hd), v = randn(T * kvh * hd, 2 + hd);
    write_kv(kv, k.data(), v.data(), T, pos.data(), tables.data());
    auto q = randn(T * heads * hd, 3 + hd);
    std::vector<float> out(q.size()), ref(q.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    paged_attention(q.data(), T, heads, kv, pos.data(), tables.data(), scale, out.data());
    paged_attention_reference(q.data(), T, heads, kv, pos.data(), tables.data(), scale, ref.data());
    EXPECT_LT(rel_err(out, ref), 1e-5) << "head_dim " << hd;
    // Position 0 attends only to itself: the output is its own V row.
    for (int64_t i = 0; i < hd; ++i) {
      EXPECT_NEAR(out[i], bf16_to_float(float_to_bf16(v[i])), 1e-6);
    }
  }
}

}  // namespace
}  // namespace msinfer::kernels::cpu
