// DeepSeek's and gpt-oss's rotary embedding on the CPU: YaRN-scaled inverse
// frequencies, the rotate_half rotation of gpt-oss, and the interleaved
// rotation DeepSeek's checkpoints are trained with (pairs (x[2i], x[2i+1]), a
// complex multiply in its reference inference/model.py; not HF's rotate_half
// pairs (i, i + d/2) of ops.h's rope). Plain C++.
#pragma once

#include <cstdint>
#include <vector>

namespace msinfer::kernels::cpu {

// The dim / 2 inverse frequencies base^(-2i/dim) in float32. With YaRN
// (factor > 1): dims below the correction range [low, high] (fast rotations,
// beta_fast) keep their frequency, dims above it (beta_slow) are divided by
// factor, a linear ramp in between; low = floor(d(beta_fast)), high =
// ceil(d(beta_slow)) clamped to [0, dim - 1], d(r) = dim ln(original / (2 pi
// r)) / (2 ln base): DeepSeek's precompute_freqs_cis (and HF's yarn_find_*).
// factor <= 1: plain RoPE. truncate false (gpt-oss, rope_scaling.truncate):
// low and high are used unrounded and unclamped, as OpenAI's reference
// (gpt_oss/torch/model.py) computes them.
std::vector<float> yarn_inv_freq(int64_t dim, double base, double factor,
                                 int64_t original_max_position, double beta_fast, double beta_slow,
                                 bool truncate = true);

// x is [tokens, heads, dim] (dim even), in place: for token t and each pair
// i, (x[2i], x[2i+1]) *= mscale * (cos a, sin a) as a complex number, with
// a = float(positions[t]) * inv_freq[i] in float32. mscale: YaRN's cos/sin
// factor (ModelConfig::yarn_rope_mscale(); 1 in DeepSeek's reference).
void rope_interleaved(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                      int64_t dim, const float* inv_freq, float mscale = 1.0f);

// The same rotation in HF's rotate_half layout (gpt-oss; GPT-NeoX): pairs
// (x[i], x[i + dim/2]) of each head rotate by a = float(positions[t]) *
// inv_freq[i], cos and sin times mscale (YaRN's concentration).
void rope_rotate_half(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                      int64_t dim, const float* inv_freq, float mscale = 1.0f);

}  // namespace msinfer::kernels::cpu
