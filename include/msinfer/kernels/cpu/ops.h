// Element-wise and row-wise kernels of the CPU backend. All over fp32
// activations; norm weights are fp32 (converted once at load). Plain loops:
// each is its own reference, checked against double-precision formulas in
// tests/kernels/ops_test.cc.
#pragma once

#include <cstdint>

namespace msinfer::kernels::cpu {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w. x and y may alias.
void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y);

// Rotary embedding, HF "rotate_half" convention: for each head, pairs (i, i + d/2)
// rotate by angle pos * theta^(-2i/d). x is [tokens, heads, head_dim], in place.
void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          double theta);

// out[r, j] = silu(gate_up[r, j]) * gate_up[r, F + j] for j < F; gate_up is [rows, 2F].
void silu_mul(const float* gate_up, int64_t rows, int64_t f, float* out);

// y += x (n elements).
void add_inplace(float* y, const float* x, int64_t n);

// In-place numerically stable softmax over n values.
void softmax_inplace(float* x, int64_t n);

// out[i] = exp((x[i] - shift) * scale) for i < n, in float; returns the sum
// of out[0, n) in double. The sampler's weights over a vocabulary (shift the
// largest logit, scale 1 / temperature). The SIMD levels use their vector
// exp (relative error ~2e-7 against the generic level's std::exp); arguments
// below -87 give ~0 (exp(-87) ~ 1.6e-38), -infinity gives 0 exactly.
double exp_scaled(const float* x, int64_t n, float shift, float scale, float* out);

// The index of the largest of x[n], the first on ties (as std::max_element);
// NaNs are never chosen (all NaN, or n == 0: 0). Greedy sampling over a
// vocabulary: the SIMD levels take the largest over vectors, then look for
// its first index a vector at a time.
int64_t argmax(const float* x, int64_t n);

}  // namespace msinfer::kernels::cpu
