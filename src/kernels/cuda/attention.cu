// Paged GQA attention on the GPU, split over the context (flash-decoding): one
// block per (token, query head, chunk of kChunk positions) computes a partial
// softmax (running max m, sum l, weighted V sum) with 4 warps taking every 4th
// position; a second kernel merges a row's chunks. The same kernels serve
// prefill (every prompt token is a query over its own prefix) and decode.
#include <cfloat>

#include "common.cuh"
#include "msinfer/kernels/cuda/cuda.h"

namespace msinfer::kernels::cuda {
namespace {

using detail::nv;
using detail::warp_sum;

constexpr int kChunk = 256;    // context positions per partial
constexpr int kWarps = 4;      // warps per partial block
constexpr int kMaxPerLane = 8;  // head_dim up to 256

__global__ void write_kv_kernel(__nv_bfloat16* kp, __nv_bfloat16* vp, int64_t block_size,
                                int64_t kv_heads, int64_t head_dim, const float* k, const float* v,
                                const int32_t* positions, const int32_t* tables,
                                int64_t max_blocks) {
  const int64_t t = blockIdx.x, pos = positions[t];
  const int64_t block = tables[t * max_blocks + pos / block_size];
  const int64_t n = kv_heads * head_dim;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t g = j / head_dim, d = j % head_dim;
    const int64_t off = ((block * kv_heads + g) * block_size + pos % block_size) * head_dim + d;
    kp[off] = __float2bfloat16_rn(k[t * n + j]);
    vp[off] = __float2bfloat16_rn(v[t * n + j]);
  }
}

// Workspace per (token, head, chunk): m, l, then head_dim accumulated values.
__global__ void attention_partial_kernel(const float* q, int64_t heads, const __nv_bfloat16* kp,
                                         const __nv_bfloat16* vp, int64_t block_size,
                                         int64_t kv_heads, int64_t head_dim,
                                         const int32_t* positions, const int32_t* tables,
                                         int64_t max_blocks, int64_t chunks, float scale,
                                         float* ws) {
  const int64_t row = blockIdx.x, t = row / heads, h = row % heads, c = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* part = ws + (row * chunks + c) * (head_dim + 2);
  const int64_t context = static_cast<int64_t>(positions[t]) + 1;
  const int64_t begin = c * kChunk, end = min(begin + kChunk, context);
  if (begin >= end) {
    if (threadIdx.x == 0) part[0] = -FLT_MAX, part[1] = 0.f;
    return;
  }
  const int64_t g = h / (heads / kv_heads);
  const int per_lane = static_cast<int>((head_dim + 31) / 32);
  float qr[kMaxPerLane], acc[kMaxPerLane];
  const float* qrow = q + row * head_dim;
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    qr[i] = (i < per_lane && d < head_dim) ? qrow[d] * scale : 0.f;
    acc[i] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  const int32_t* table = tables + t * max_blocks;
  for (int64_t p = begin + warp; p < end; p += kWarps) {
    const int64_t off =
        ((static_cast<int64_t>(table[p / block_size]) * kv_heads + g) * block_size +
         p % block_size) * head_dim;
    float dot = 0.f;
    for (int i = 0; i < per_lane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) dot += qr[i] * __bfloat162float(kp[off + d]);
    }
    const float s = warp_sum(dot);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), w = __expf(s - m_new);
    l = l * corr + w;
    for (int i = 0; i < per_lane; ++i) {
      const int64_t d = lane + 32 * i;
      const float vv = d < head_dim ? __bfloat162float(vp[off + d]) : 0.f;
      acc[i] = acc[i] * corr + w * vv;
    }
    m = m_new;
  }
  // Merge the warps' partials.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][32 * kMaxPerLane];
  if (lane == 0) sm[warp] = m, sl[warp] = l;
  for (int i = 0; i < per_lane; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mt = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) mt = fmaxf(mt, sm[w]);
  float lt = 0.f;
  for (int w = 0; w < kWarps; ++w) lt += sm[w] == -FLT_MAX ? 0.f : sl[w] * __expf(sm[w] - mt);
  if (threadIdx.x == 0) part[0] = mt, part[1] = lt;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (sm[w] != -FLT_MAX) a += sacc[w][d] * __expf(sm[w] - mt);
    }
    part[2 + d] = a;
  }
}

__global__ void attention_merge_kernel(const float* ws, int64_t chunks, int64_t head_dim,
                                       float* out) {
  const int64_t row = blockIdx.x;
  const float* base = ws + row * chunks * (head_dim + 2);
  float mt = -FLT_MAX;
  for (int64_t c = 0; c < chunks; ++c) mt = fmaxf(mt, base[c * (head_dim + 2)]);
  float lt = 0.f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* p = base + c * (head_dim + 2);
    if (p[1] > 0.f) lt += p[1] * __expf(p[0] - mt);
  }
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float a = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = base + c * (head_dim + 2);
      if (p[1] > 0.f) a += p[2 + d] * __expf(p[0] - mt);
    }
    out[row * head_dim + d] = a / lt;
  }
}

int64_t chunks_for(int64_t max_context) { return (max_context + kChunk - 1) / kChunk; }

}  // namespace

void write_kv(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
              const int32_t* positions, const int32_t* tables, int64_t max_blocks,
              cudaStream_t s) {
  if (tokens == 0) return;
  write_kv_kernel<<<static_cast<unsigned>(tokens), 128, 0, s>>>(
      nv(kv.k), nv(kv.v), kv.block_size, kv.kv_heads, kv.head_dim, k, v, positions, tables,
      max_blocks);
}

int64_t attention_workspace_floats(int64_t tokens, int64_t heads, int64_t head_dim,
                                   int64_t max_context) {
  return tokens * heads * chunks_for(max_context) * (head_dim + 2);
}

void paged_attention(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                     const int32_t* positions, const int32_t* tables, int64_t max_blocks,
                     int64_t max_context, float scale, float* workspace, float* out,
                     cudaStream_t s) {
  if (tokens == 0) return;
  const int64_t chunks = chunks_for(max_context);
  const dim3 grid(static_cast<unsigned>(tokens * heads), static_cast<unsigned>(chunks));
  attention_partial_kernel<<<grid, 32 * kWarps, 0, s>>>(
      q, heads, nv(kv.k), nv(kv.v), kv.block_size, kv.kv_heads, kv.head_dim, positions, tables,
      max_blocks, chunks, scale, workspace);
  attention_merge_kernel<<<static_cast<unsigned>(tokens * heads), 64, 0, s>>>(
      workspace, chunks, kv.head_dim, out);
}

}  // namespace msinfer::kernels::cuda
