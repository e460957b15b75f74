// DeepSeek-V2/V3 expert selection (the gate's top-K) on the CPU: softmax or
// sigmoid scores, an optional selection-only bias (e_score_correction_bias),
// group-limited candidates, renormalisation and a routed scaling factor. Its
// output is what route_rows (moe.h) takes to build the send buffer.
// Plain C++: runs once per token over E scores, no level-specific code.
#pragma once

#include <cstdint>

namespace msinfer::kernels::cpu {

struct GroupedTopK {
  int64_t experts = 0, top_k = 0;
  int64_t n_group = 1, topk_group = 1;  // n_group divides experts; topk_group <= n_group
  bool sigmoid = false;                 // scores: sigmoid(logit), else softmax over the experts
  const float* bias = nullptr;          // [experts] added to the scores for selection only, or null
  // Groups are ranked by the sum of their two best selection scores (noaux_tc)
  // instead of their best one (group_limited_greedy). Needs experts / n_group >= 2.
  bool group_by_top2 = false;
  bool normalize = false;  // divide the K weights by their sum
  float scale = 1.0f;      // routed_scaling_factor, applied last
};

// For each of `tokens` rows of router logits [tokens, experts] (float32):
//   s = softmax(logits) or sigmoid(logits);  c = s + bias (s without a bias);
//   with n_group > 1, keep the topk_group groups (of experts / n_group
//   consecutive experts) with the highest group score of c, ties to the lower
//   group; the top_k experts of c among the kept, ties to the lower id, in
//   descending c; their weights s (unbiased), / sum when normalize, * scale.
// This is DeepSeek's reference Gate (inference/model.py) computed in float32
// (it renormalises exactly when the scores are sigmoid; HF's DeepseekV3 reads
// norm_topk_prob). Writes topk_expert / topk_weight [tokens * top_k].
void grouped_topk(const float* logits, int64_t tokens, const GroupedTopK& p, int32_t* topk_expert,
                  float* topk_weight);

}  // namespace msinfer::kernels::cpu
