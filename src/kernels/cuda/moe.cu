// MoE kernels of the CUDA backend: the gate's softmax + top-K, the scatter of
// token rows into the send buffer, and the gate-weighted combine.
#include <cfloat>

#include "common.cuh"
#include "msinfer/kernels/cuda/cuda.h"

namespace msinfer::kernels::cuda {
namespace {

using detail::blocks_for;

// One thread per token (E and K are small): softmax as the CPU kernel computes
// it (max-shifted, the denominator in double), K passes of arg-max with ties to
// the lower id.
__global__ void gate_topk_kernel(const float* logits, int64_t tokens, int64_t experts,
                                 int64_t top_k, bool normalize, int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + t * experts;
  float mx = l[0];
  for (int64_t e = 1; e < experts; ++e) mx = fmaxf(mx, l[e]);
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) sum += expf(l[e] - mx);
  int32_t* id = ids + t * top_k;
  float* w = weights + t * top_k;
  float s = 0.f;
  for (int64_t k = 0; k < top_k; ++k) {
    int32_t best = -1;
    float bv = -FLT_MAX;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= id[j] == e;
      if (!taken && (best < 0 || l[e] > bv)) best = static_cast<int32_t>(e), bv = l[e];
    }
    id[k] = best;
    w[k] = static_cast<float>(expf(bv - mx) / sum);
    s += w[k];
  }
  if (normalize) {
    for (int64_t k = 0; k < top_k; ++k) w[k] /= s;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* row_token, int64_t hidden,
                                   float* send) {
  const int64_t r = blockIdx.x;
  const float* src = x + static_cast<int64_t>(row_token[r]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) send[r * hidden + i] = src[i];
}

__global__ void combine_kernel(const float* results, const int32_t* slot_row,
                               const float* topk_weight, int64_t top_k, int64_t hidden, float* x) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float a = x[t * hidden + i];
    for (int64_t k = 0; k < top_k; ++k) {
      a += topk_weight[t * top_k + k] *
           results[static_cast<int64_t>(slot_row[t * top_k + k]) * hidden + i];
    }
    x[t * hidden + i] = a;
  }
}

}  // namespace

void gate_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
               bool normalize, int32_t* topk_expert, float* topk_weight, cudaStream_t s) {
  if (tokens == 0) return;
  gate_topk_kernel<<<blocks_for(tokens, 64), 64, 0, s>>>(logits, tokens, experts, top_k, normalize,
                                                         topk_expert, topk_weight);
}

void gather_rows(const float* x, const int32_t* row_token, int64_t rows, int64_t hidden,
                 float* send, cudaStream_t s) {
  if (rows == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(x, row_token, hidden, send);
}

void moe_combine(const float* results, const int32_t* slot_row, const float* topk_weight,
                 int64_t tokens, int64_t top_k, int64_t hidden, float* x, cudaStream_t s) {
  if (tokens == 0) return;
  combine_kernel<<<static_cast<unsigned>(tokens), 128, 0, s>>>(results, slot_row, topk_weight,
                                                               top_k, hidden, x);
}

}  // namespace msinfer::kernels::cuda
