// Elementwise and per-row kernels of the CUDA backend (kernels/cuda/cuda.h).
#include <cfloat>
#include <cmath>

#include "common.cuh"
#include "msinfer/kernels/cuda/cuda.h"

namespace msinfer::kernels::cuda {
namespace {

using detail::blocks_for;
using detail::nv;

__global__ void embed_kernel(const __nv_bfloat16* table, const int32_t* ids, int64_t hidden,
                             float* out) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[t * hidden + i] = __bfloat162float(row[i]);
  }
}

// One block per row; the sum of squares in double, as the CPU reference.
__global__ void rms_norm_kernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (unsigned i = 0; i < (blockDim.x + 31) / 32; ++i) t += part[i];
    part[0] = t;
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / sqrt(part[0] / dim + eps));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// One block per token; thread i of a head pair rotates (v[i], v[i + half]).
// inv_freq in double, the angle in fp32 (as HF and the CPU kernel compute it).
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t heads, int64_t head_dim,
                            double theta) {
  const int64_t t = blockIdx.x, half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    const double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / head_dim);
    const float angle = pos * static_cast<float>(inv_freq);
    float s, c;
    sincosf(angle, &s, &c);
    float* v = x + (t * heads + h) * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

__global__ void split_qkv_kernel(const float* qkv, int64_t qn, int64_t kn, float* q, float* k,
                                 float* v) {
  const int64_t t = blockIdx.x, w = qn + 2 * kn;
  const float* row = qkv + t * w;
  for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
    const float val = row[i];
    if (i < qn) {
      q[t * qn + i] = val;
    } else if (i < qn + kn) {
      k[t * kn + i - qn] = val;
    } else {
      v[t * kn + i - qn - kn] = val;
    }
  }
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void to_float_kernel(const __nv_bfloat16* x, int64_t n, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __bfloat162float(x[i]);
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void silu_mul_kernel(const __nv_bfloat16* gu, int64_t rows, int64_t f,
                                __nv_bfloat16* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * f) return;
  const int64_t r = i / f, j = i % f;
  const float g = __bfloat162float(gu[r * 2 * f + j]);
  const float u = __bfloat162float(gu[r * 2 * f + f + j]);
  out[i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}

// One block per row: (value, lowest index) maximum.
__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  const float* row = logits + blockIdx.x * vocab;
  float best = -FLT_MAX;
  int32_t idx = INT32_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v > best || (v == best && i < idx)) best = v, idx = static_cast<int32_t>(i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
  }
  __shared__ float sb[32];
  __shared__ int32_t si[32];
  if ((threadIdx.x & 31) == 0) sb[threadIdx.x >> 5] = best, si[threadIdx.x >> 5] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
      if (sb[w] > best || (sb[w] == best && si[w] < idx)) best = sb[w], idx = si[w];
    }
    out[blockIdx.x] = idx;
  }
}

}  // namespace

void embed(const bf16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float* out,
           cudaStream_t s) {
  if (tokens == 0) return;
  embed_kernel<<<static_cast<unsigned>(tokens), 128, 0, s>>>(nv(table), ids, hidden, out);
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
              cudaStream_t s) {
  if (rows == 0) return;
  const int threads = dim >= 1024 ? 256 : (dim >= 128 ? 128 : 32);
  rms_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(x, w, dim, eps, y);
}

void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          double theta, cudaStream_t s) {
  if (tokens == 0) return;
  rope_kernel<<<static_cast<unsigned>(tokens), 128, 0, s>>>(x, positions, heads, head_dim, theta);
}

void split_qkv(const float* qkv, int64_t tokens, int64_t qn, int64_t kn, float* q, float* k,
               float* v, cudaStream_t s) {
  if (tokens == 0) return;
  split_qkv_kernel<<<static_cast<unsigned>(tokens), 256, 0, s>>>(qkv, qn, kn, q, k, v);
}

void to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, n, nv(y));
}

void to_float(const bf16* x, int64_t n, float* y, cudaStream_t s) {
  if (n == 0) return;
  to_float_kernel<<<blocks_for(n, 256), 256, 0, s>>>(nv(x), n, y);
}

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(y, x, n);
}

void silu_mul(const bf16* gate_up, int64_t rows, int64_t f, bf16* out, cudaStream_t s) {
  if (rows * f == 0) return;
  silu_mul_kernel<<<blocks_for(rows * f, 256), 256, 0, s>>>(nv(gate_up), rows, f, nv(out));
}

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(logits, vocab, out);
}

}  // namespace msinfer::kernels::cuda
