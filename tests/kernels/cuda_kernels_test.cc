// The CUDA backend's kernels against the CPU backend's (or its plain
// references) on the same inputs. Every test that needs a GPU skips where
// there is none (no driver, or no device); the host-side parts always run.
#include <cublasLt.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/kernels/cpu/moe.h"
#include "msinfer/kernels/cpu/ops.h"
#include "msinfer/kernels/cuda/cuda.h"
#include "test_util.h"

namespace msinfer::kernels {
namespace {

using testing::rel_err;
using testing::randn;
using testing::randn_bf16;

#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    std::string why;                                                    \
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no GPU: " << why; \
    ASSERT_TRUE(cuda::open_device(0).ok());                             \
  } while (0)

template <typename T>
cuda::DeviceBuffer up(const std::vector<T>& v) {
  cuda::DeviceBuffer b;
  EXPECT_TRUE(b.upload(v.data(), v.size() * sizeof(T)).ok());
  return b;
}

template <typename T>
std::vector<T> down(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.as<void>(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

cuda::DeviceBuffer zeros(size_t bytes) {
  cuda::DeviceBuffer b;
  EXPECT_TRUE(b.reserve(bytes).ok());
  cudaMemset(b.as<void>(), 0, bytes);
  return b;
}

// cuBLAS and cuBLASLt are opened on their first call, not when the binary
// starts (cuda/cublas_lazy.cc); a host-side call works without a GPU.
TEST(CudaHostTest, CublasLoadsOnFirstUse) {
  const std::string lt = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  EXPECT_EQ(::dlopen(lt.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << lt << " loaded at start";
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  void* h = ::dlopen(lt.c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(h, nullptr) << lt << " not loaded after a call";
  if (h != nullptr) ::dlclose(h);
}

TEST(CudaHostTest, ParsesDeviceNames) {
  EXPECT_EQ(*cuda::parse_device("cuda"), 0);
  EXPECT_EQ(*cuda::parse_device("cuda:3"), 3);
  for (const char* bad : {"cuda:", "cuda:-1", "cuda:1x", "gpu", "cuda:99999999999"}) {
    auto r = cuda::parse_device(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CudaHostTest, NoDeviceIsAnErrorThatSaysWhy) {
  std::string why;
  const int n = cuda::device_count(&why);
  if (n > 0) {
    auto r = cuda::open_device(n);  // one past the last
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("does not exist"), std::string::npos);
    return;
  }
  EXPECT_FALSE(why.empty());
  auto r = cuda::open_device(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

TEST(CudaKernelsTest, EmbedRmsNormRopeMatchCpu) {
  REQUIRE_GPU();
  const int64_t T = 37, h = 96, V = 50, heads = 6, hd = 16;
  auto table = randn_bf16(V * h, 1);
  std::vector<int32_t> ids(T), pos(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 7) % V), pos[t] = static_cast<int32_t>(t * 113);
  auto d_table = up(table);
  auto d_ids = up(ids);
  auto d_pos = up(pos);
  auto d_x = zeros(T * h * 4);
  cuda::embed(d_table.as<bf16>(), d_ids.as<int32_t>(), T, h, d_x.as<float>(), nullptr);
  auto x = down<float>(d_x, T * h);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < h; ++i) ASSERT_EQ(x[t * h + i], bf16_to_float(table[ids[t] * h + i]));
  }
  auto w = randn(h, 2);
  auto d_w = up(w);
  std::vector<float> ref(T * h);
  cpu::rms_norm(x.data(), w.data(), T, h, 1e-5f, ref.data());
  cuda::rms_norm(d_x.as<float>(), d_w.as<float>(), T, h, 1e-5f, d_x.as<float>(), nullptr);
  EXPECT_LT(rel_err(down<float>(d_x, T * h), ref), 1e-6);

  // RoPE over [T, heads, hd] = the same floats viewed as heads.
  cpu::rope(ref.data(), pos.data(), T, heads, hd, 1e6);
  cuda::rope(d_x.as<float>(), d_pos.as<int32_t>(), T, heads, hd, 1e6, nullptr);
  EXPECT_LT(rel_err(down<float>(d_x, T * h), ref), 1e-5);
  EXPECT_TRUE(cuda::check("embed/rms_norm/rope").ok());
}

TEST(CudaKernelsTest, LinearMatchesTheReferenceOnBf16Inputs) {
  REQUIRE_GPU();
  auto blas = cuda::Blas::create(nullptr);
  ASSERT_TRUE(blas.ok()) << blas.status().to_string();
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 96, 64}, {5, 384, 256},
                         {64, 1000, 512}, {300, 256, 1024}}) {
    auto w = randn_bf16(n * k, 3, 0.05f);
    auto x = randn(m * k, 4);
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) xr[i] = round_to_bf16(x[i]);
    std::vector<float> ref(m * n);
    cpu::linear_reference(w.data(), n, k, xr.data(), m, ref.data());
    auto d_w = up(w);
    auto d_x = up(x);
    auto d_y = zeros(m * n * 4);
    ASSERT_TRUE((*blas)->linear(d_x.as<float>(), m, {d_w.as<bf16>(), n, k}, d_y.as<float>()).ok());
    EXPECT_LT(rel_err(down<float>(d_y, m * n), ref), 1e-4) << m << "x" << n << "x" << k;
  }
}

// A batch of decode tokens and a prefill chunk over shuffled blocks, contexts
// past several of the kernel's 256-position chunks.
TEST(CudaKernelsTest, PagedAttentionMatchesTheReference) {
  REQUIRE_GPU();
  for (int64_t hd : {16, 64, 128}) {
    const int64_t heads = 8, kvh = 2, bs = 16, blocks = 160, max_blocks = 64;
    const int64_t pool = blocks * kvh * bs * hd;
    std::vector<bf16> kpool(pool), vpool(pool);
    // Two requests with shuffled block tables.
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    std::vector<int32_t> ta(perm.begin(), perm.begin() + max_blocks),
        tb(perm.begin() + max_blocks, perm.begin() + 2 * max_blocks);
    // Request a: decode at position 700; request b: prefill chunk 0..40.
    std::vector<int32_t> pos = {700};
    for (int32_t p = 0; p <= 40; ++p) pos.push_back(p);
    const int64_t T = static_cast<int64_t>(pos.size());
    std::vector<const int32_t*> tables_cpu(T, tb.data());
    tables_cpu[0] = ta.data();
    std::vector<int32_t> tables_gpu(T * max_blocks);
    for (int64_t t = 0; t < T; ++t) std::copy(tables_cpu[t], tables_cpu[t] + max_blocks, tables_gpu.begin() + t * max_blocks);
    cpu::PagedKvLayer ckv{kpool.data(), vpool.data(), bs, kvh, hd};
    // Fill request a's context 0..700 and b's 0..40 through write_kv (CPU).
    std::vector<int32_t> fill_pos(701);
    std::iota(fill_pos.begin(), fill_pos.end(), 0);
    std::vector<const int32_t*> fill_tab(701, ta.data());
    auto k_all = randn(701 * kvh * hd, 11), v_all = randn(701 * kvh * hd, 12);
    cpu::write_kv(ckv, k_all.data(), v_all.data(), 701, fill_pos.data(), fill_tab.data());
    // Request b's K/V go in through the GPU write_kv, then both pools are compared.
    auto kb = randn(41 * kvh * hd, 13), vb = randn(41 * kvh * hd, 14);
    auto d_k = up(kpool);
    auto d_v = up(vpool);
    std::vector<const int32_t*> tb_rows(41, tb.data());
    cpu::write_kv(ckv, kb.data(), vb.data(), 41, fill_pos.data(), tb_rows.data());
    std::vector<int32_t> tb_flat(41 * max_blocks);
    for (int i = 0; i < 41; ++i) std::copy(tb.begin(), tb.end(), tb_flat.begin() + i * max_blocks);
    auto d_kb = up(kb);
    auto d_vb = up(vb);
    auto d_fill = up(std::vector<int32_t>(fill_pos.begin(), fill_pos.begin() + 41));
    auto d_tbf = up(tb_flat);
    cuda::PagedKvLayer gkv{d_k.as<bf16>(), d_v.as<bf16>(), bs, kvh, hd};
    cuda::write_kv(gkv, d_kb.as<float>(), d_vb.as<float>(), 41, d_fill.as<int32_t>(), d_tbf.as<int32_t>(), max_blocks, nullptr);
    auto gk = down<bf16>(d_k, pool);
    auto gv = down<bf16>(d_v, pool);
    for (int64_t i = 0; i < pool; ++i) {
      ASSERT_EQ(gk[i].bits, kpool[i].bits) << i;
      ASSERT_EQ(gv[i].bits, vpool[i].bits) << i;
    }

    auto q = randn(T * heads * hd, 15);
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    std::vector<float> ref(T * heads * hd);
    cpu::paged_attention_reference(q.data(), T, heads, ckv, pos.data(), tables_cpu.data(), scale, ref.data());
    auto d_q = up(q);
    auto d_pos = up(pos);
    auto d_tab = up(tables_gpu);
    const int64_t max_ctx = 701;
    auto d_ws = zeros(cuda::attention_workspace_floats(T, heads, hd, max_ctx) * 4);
    auto d_out = zeros(T * heads * hd * 4);
    cuda::paged_attention(d_q.as<float>(), T, heads, gkv, d_pos.as<int32_t>(), d_tab.as<int32_t>(),
                          max_blocks, max_ctx, scale, d_ws.as<float>(), d_out.as<float>(), nullptr);
    EXPECT_LT(rel_err(down<float>(d_out, T * heads * hd), ref), 2e-5) << "head_dim " << hd;
    EXPECT_TRUE(cuda::check("paged_attention").ok());
  }
}

TEST(CudaKernelsTest, GateGatherAndCombineMatchTheCpuKernels) {
  REQUIRE_GPU();
  const int64_t T = 45, E = 8, K = 2, h = 64;
  for (bool normalize : {false, true}) {
    auto logits = randn(T * E, 21);
    auto x = randn(T * h, 22);
    cpu::RoutedBatch r;
    cpu::fused_gate(logits.data(), T, E, K, normalize, nullptr, 0, x.data(), h, &r);
    auto d_l = up(logits);
    auto d_ids = zeros(T * K * 4);
    auto d_w = zeros(T * K * 4);
    cuda::gate_topk(d_l.as<float>(), T, E, K, normalize, d_ids.as<int32_t>(), d_w.as<float>(), nullptr);
    EXPECT_EQ(down<int32_t>(d_ids, T * K), r.topk_expert);
    auto w = down<float>(d_w, T * K);
    for (int64_t i = 0; i < T * K; ++i) EXPECT_NEAR(w[i], r.topk_weight[i], 1e-6);

    auto d_x = up(x);
    auto d_rt = up(r.row_token);
    auto d_send = zeros(T * K * h * 4);
    cuda::gather_rows(d_x.as<float>(), d_rt.as<int32_t>(), T * K, h, d_send.as<float>(), nullptr);
    EXPECT_EQ(down<float>(d_send, T * K * h), r.send);

    auto results = randn(T * K * h, 23);
    std::vector<float> ref = x;
    cpu::moe_combine(r, results.data(), ref.data());
    auto d_res = up(results);
    auto d_slot = up(r.slot_row);
    auto d_tw = up(r.topk_weight);
    cuda::moe_combine(d_res.as<float>(), d_slot.as<int32_t>(), d_tw.as<float>(), T, K, h, d_x.as<float>(), nullptr);
    EXPECT_LT(rel_err(down<float>(d_x, T * h), ref), 1e-6);
  }
}

// The grouped SwiGLU FFN against the plain fp32 reference. The GPU rounds the
// input, the gate/up output and the activation to bf16 (a grouped bf16 GEMM's
// inputs and outputs), so the tolerance is bf16's: 2^-7 relative to the output's scale.
TEST(CudaKernelsTest, GroupedExpertFfnMatchesTheReference) {
  REQUIRE_GPU();
  const int64_t h = 128, f = 256, E = 5;
  auto blas = cuda::Blas::create(nullptr);
  ASSERT_TRUE(blas.ok());
  std::vector<std::vector<bf16>> w1(E), w3(E), w2(E);
  std::vector<cuda::DeviceBuffer> d13(E), d2(E);
  std::vector<cuda::ExpertMatrices> mats(E);
  for (int64_t e = 0; e < E; ++e) {
    w1[e] = randn_bf16(f * h, 100 + e, 0.08f);
    w3[e] = randn_bf16(f * h, 200 + e, 0.08f);
    w2[e] = randn_bf16(h * f, 300 + e, 0.06f);
    std::vector<bf16> w13 = w1[e];
    w13.insert(w13.end(), w3[e].begin(), w3[e].end());
    d13[e] = up(w13);
    d2[e] = up(w2[e]);
    mats[e] = {{d13[e].as<bf16>(), 2 * f, h}, {d2[e].as<bf16>(), h, f}};
  }
  // Rows per expert, one empty.
  const std::vector<int64_t> counts = {3, 0, 17, 1, 40};
  std::vector<int64_t> offset = {0};
  for (int64_t c : counts) offset.push_back(offset.back() + c);
  const int64_t rows = offset.back();
  auto x = randn(rows * h, 31);
  std::vector<float> ref(rows * h);
  for (int64_t e = 0; e < E; ++e) {
    if (counts[e] == 0) continue;
    cpu::expert_ffn_reference(w1[e].data(), w3[e].data(), w2[e].data(), f, h, x.data() + offset[e] * h,
                              counts[e], ref.data() + offset[e] * h);
  }
  auto d_x = up(x);
  auto d_y = zeros(rows * h * 4);
  ASSERT_TRUE((*blas)->expert_ffn(mats, offset, d_x.as<float>(), d_y.as<float>()).ok());
  auto y = down<float>(d_y, rows * h);
  EXPECT_LT(rel_err(y, ref), 1.5e-2);
  std::printf("grouped GEMM: %s\n", (*blas)->grouped() ? "cublasGemmGroupedBatchedEx" : "per-expert fallback");
}

TEST(CudaKernelsTest, ArgmaxTakesTheLowerIdOnTies) {
  REQUIRE_GPU();
  const int64_t rows = 7, vocab = 32000;
  auto logits = randn(rows * vocab, 41);
  logits[3 * vocab + 100] = 50.f;
  logits[3 * vocab + 30000] = 50.f;  // a tie: 100 wins
  auto d_l = up(logits);
  auto d_o = zeros(rows * 4);
  cuda::argmax_rows(d_l.as<float>(), rows, vocab, d_o.as<int32_t>(), nullptr);
  auto got = down<int32_t>(d_o, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    EXPECT_EQ(got[r], std::max_element(row, row + vocab) - row) << r;
  }
  EXPECT_EQ(got[3], 100);
}

TEST(CudaKernelsTest, AnAllocationBeyondTheDeviceIsResourceExhausted) {
  REQUIRE_GPU();
  cuda::DeviceBuffer b;
  Status s = b.reserve(size_t{1} << 50);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(cuda::check("after a failed allocation").ok());  // not sticky
}

}  // namespace
}  // namespace msinfer::kernels
