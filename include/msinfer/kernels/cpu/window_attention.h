// GQA attention over the paged KV cache (attention.h's layout) with the two
// additions of gpt-oss: a sliding window (a query at position p attends to
// positions max(0, p - window + 1)..p; window 0: all of 0..p) and an optional
// learned sink logit per query head that joins the softmax's denominator and
// has no value row: out = sum_j exp(s_j - m) v_j / (exp(sink - m) + sum_j
// exp(s_j - m)), s_j = scale q.k_j, m the largest of the s_j and the sink.
// Plain C++ at every level (q.K in fp32, q not rounded); OpenMP over
// (token, KV head) pairs.
#pragma once

#include <cstdint>

#include "msinfer/kernels/cpu/attention.h"

namespace msinfer::kernels::cpu {

// q, out [tokens, heads, head_dim]; sinks [heads] (this rank's heads) or null;
// window >= 0. Query head h reads KV head h / (heads / kv_heads).
void paged_attention_window(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                            const int32_t* positions, const int32_t* const* block_tables,
                            float scale, int64_t window, const float* sinks, float* out);

// The plain reference: double precision, one (token, head) at a time.
void paged_attention_window_reference(const float* q, int64_t tokens, int64_t heads,
                                      const PagedKvLayer& kv, const int32_t* positions,
                                      const int32_t* const* block_tables, float scale,
                                      int64_t window, const float* sinks, float* out);

}  // namespace msinfer::kernels::cpu
