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

}  // namespace msinfer::kernels::cpu
