// The table of kernels one CPU level provides (private to the kernels module).
// Each level's translation unit (generic/, avx2/, avx512/, avx512bf16/) fills
// one table; isa.cc picks the active one. Public entry points (attention.h,
// ops.h, moe.h, gemm.h) call through the active table, except GEMMs, which run
// the table of the level their weights were packed for.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/core/status.h"
#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/kernels/cpu/isa.h"

namespace msinfer::kernels::cpu::internal {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A packed GEMM weight. Panel levels: data holds ceil(n / panel) panels of
// [k][panel] elements (bf16 or int8), zero-padded past row n; scale [n padded
// to panels] for int8. avx512bf16's panels, bf16 and int8, are
// [ceil(k / 2)][panel][2] (pairs of k, avx512bf16/kernels.cc). amx: onednn
// holds oneDNN's packed bf16 memory; its int8 is avx512bf16's. w8a8, every
// level: [ceil(k / 4)][panel][4] int8 (pack_w8a8_panels). mxfp4, every level:
// 17 * panel bytes per 32-k block of a panel (pack_mxfp4_panels; gemm.h has
// the layout; avx2 reorders each panel, internal/mxfp4_avx2.inc).
struct GemmWeights {
  IsaLevel level = IsaLevel::kGeneric;
  WeightFormat format = WeightFormat::kBf16;
  int64_t n = 0, k = 0;
  int64_t panel = 0, panels = 0;
  std::unique_ptr<uint8_t, FreeDeleter> data;  // 64-byte aligned
  size_t data_bytes = 0;
  std::vector<float> scale;
  // w8a8: each column's sum of its int8 weights [n padded to panels] (the
  // VNNI kernel multiplies x + 128 and takes 128 times this off).
  std::vector<int32_t> colsum;
  std::shared_ptr<void> onednn;
  size_t onednn_bytes = 0;

  size_t bytes() const {
    return data_bytes + scale.size() * sizeof(float) + colsum.size() * sizeof(int32_t) +
           onednn_bytes;
  }
  const bf16* bf16_panel(int64_t p) const {
    return reinterpret_cast<const bf16*>(data.get()) + p * k * panel;
  }
  const int8_t* int8_panel(int64_t p) const {
    return reinterpret_cast<const int8_t*>(data.get()) + p * k * panel;
  }
  // mxfp4: bytes of one 32-k block of a panel, and panel p's first block.
  int64_t mxfp4_block_bytes() const { return 17 * panel; }
  const uint8_t* mxfp4_panel(int64_t p) const {
    return data.get() + p * (k / kMxfp4Block) * mxfp4_block_bytes();
  }
};

// Gives `out` `bytes` of zeroed, 64-byte aligned weight memory (data, data_bytes).
Status alloc_weight_data(size_t bytes, GemmWeights* out);

// Packs W [n, k] into panels of `panel` columns (shared by every panel level).
Status pack_panels(const bf16* w, int64_t n, int64_t k, WeightFormat format, int64_t panel,
                   GemmWeights* out);

// w8a8 (every level): W [n, k] quantised per row (quantize_int8_rows) into
// panels of `panel` columns as [ceil(k / 4)][panel][4] int8, zero-padded past
// row n and past k; scale and colsum [n padded to panels].
Status pack_w8a8_panels(const bf16* w, int64_t n, int64_t k, int64_t panel, GemmWeights* out);

// mxfp4 (every level): W [n, k] from the checkpoint's blocks [n][k / 32][16]
// and scales [n][k / 32] into panels of `panel` columns, 17 * panel bytes per
// 32-k block (gemm.h); checks k % 32 and the scales.
Status pack_mxfp4_panels(const uint8_t* blocks, const uint8_t* scales, int64_t n, int64_t k,
                         int64_t panel, GemmWeights* out);

// w8a8's activations: each row of x [m, k] quantised (quantize_int8_activations)
// into q [m][ceil(k / 4)] words of four int8 (zero-padded past k), scale [m].
void quantize_w8a8_rows(const float* x, int64_t m, int64_t k, std::vector<int32_t>* q,
                        std::vector<float>* scale);

struct LevelKernels {
  IsaLevel level;
  Status (*pack)(const bf16* w, int64_t n, int64_t k, WeightFormat format, GemmWeights* out);
  // mxfp4 weights (format kMxfp4), from the checkpoint's layout (pack_mxfp4_panels).
  Status (*pack_mxfp4)(const uint8_t* blocks, const uint8_t* scales, int64_t n, int64_t k,
                       GemmWeights* out);
  // y[m, n] = round_bf16(x) · W^T; m >= 1; every format, mxfp4 included.
  void (*forward)(const GemmWeights& w, const float* x, int64_t m, float* y);
  void (*write_kv)(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
                   const int32_t* positions, const int32_t* const* block_tables);
  void (*paged_attention)(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                          const int32_t* positions, const int32_t* const* block_tables, float scale,
                          float* out);
  // DeepSeek's absorbed latent attention (mla_attention.h has the contract).
  void (*mla_attention)(const float* q_latent, const float* q_pe, int64_t tokens, int64_t heads,
                        int64_t kv_lora, int64_t rope, const PagedKvLayer& kv,
                        const int32_t* positions, const int32_t* const* block_tables, float scale,
                        float* out_latent);
  void (*mla_absorb_query)(const float* q_nope, int64_t tokens, int64_t heads, int64_t nope,
                           int64_t kv_lora, const bf16* w_uk, float* q_latent);
  void (*mla_value_up)(const float* latent, int64_t tokens, int64_t heads, int64_t kv_lora,
                       int64_t v, const bf16* w_uv, float* out);
  void (*rms_norm)(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y);
  void (*rope)(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
               double theta);
  void (*silu_mul)(const float* gate_up, int64_t rows, int64_t f, float* out);
  void (*add_inplace)(float* y, const float* x, int64_t n);
  void (*softmax_inplace)(float* x, int64_t n);
  // ops.h's exp_scaled: out[i] = exp((x[i] - shift) * scale), returns their sum.
  double (*exp_scaled)(const float* x, int64_t n, float shift, float scale, float* out);
  int64_t (*argmax)(const float* x, int64_t n);  // ops.h's argmax
  // out[t] += sum_k weight[t*K+k] * results[slot_row[t*K+k]] (moe_combine's loop).
  void (*combine)(const float* weight, const int32_t* slot_row, int64_t tokens, int64_t top_k,
                  int64_t hidden, const float* results, float* out);
  void (*to_bf16)(const float* in, bf16* out, int64_t n);
};

// Each level's table, defined in its own translation unit. Calling a level's
// functions on a CPU that lacks its instructions raises SIGILL: only isa.cc
// hands out tables, and only for supported levels.
namespace generic {
const LevelKernels& kernels();
}
namespace avx2 {
const LevelKernels& kernels();
}
namespace avx512 {
const LevelKernels& kernels();
}
namespace avx512bf16 {
const LevelKernels& kernels();
const LevelKernels& amx_kernels();  // bf16 GEMMs through oneDNN
}  // namespace avx512bf16

// The oneDNN bf16 GEMM of the amx level (onednn_gemm.cc): oneDNN picks its
// own instructions (DNNL_MAX_CPU_ISA caps them).
Status onednn_probe();
Status onednn_pack(const bf16* w, int64_t n, int64_t k, GemmWeights* out);
void onednn_forward(const GemmWeights& w, const float* x, int64_t m, float* y);

// The active level's table (isa.cc).
const LevelKernels& active_kernels();
// The table of `level`; the level must be supported.
const LevelKernels& kernels_for(IsaLevel level);

}  // namespace msinfer::kernels::cpu::internal
