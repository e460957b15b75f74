// Co-located baselines predicted with the same performance model as the plans:
//  - tensor-parallel: one replica holds the whole model on tp GPUs; per MoE layer
//    it runs attention, then every expert one after another (all on the same GPUs);
//  - expert-parallel: ep ranks of tp GPUs, each with a full attention replica
//    (data parallel) and E/ep experts; tokens move by all-to-all before and after
//    the experts; no micro-batch ping-pong, so nothing overlaps.
#include <cmath>

#include "msinfer/planner/plan.h"

namespace msinfer::planner {
namespace {

double all_to_all_time(const GpuSpec& gpu, int tp, int ep, double bytes,
                       const UtilCurve& nic_util) {
  if (ep <= 1 || bytes <= 0) return 0;
  const double moved = bytes * (ep - 1) / ep;
  if (ep * tp <= gpu.gpus_per_node) {
    return moved / (gpu.intra_node_bandwidth * gpu.efficiency.intra_node_link);
  }
  return moved / (gpu.nic_bandwidth * nic_util.at(moved));
}

// Largest batch in [1, 2^24] with ok(b), or 0.
template <typename Ok>
int64_t largest(Ok ok) {
  if (!ok(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= (int64_t{1} << 24) && ok(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (ok(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

void finish(Baseline& b, const GpuSpec& g) {
  b.throughput = static_cast<double>(b.batch) / b.iteration;
  b.per_gpu = b.throughput / b.gpus;
  b.per_cost = b.throughput / (b.gpus * g.price);
  b.per_watt = b.throughput / (b.gpus * g.tdp_w);
}

}  // namespace

double Baseline::objective(Objective o) const {
  switch (o) {
    case Objective::kCost: return per_cost;
    case Objective::kGpu: return per_gpu;
    case Objective::kPower: return per_watt;
  }
  return 0;
}

Json Baseline::to_json() const {
  return Json{{"name", name},
              {"description", description},
              {"gpu", gpu},
              {"tp", tp},
              {"ep", ep},
              {"gpus", gpus},
              {"batch", batch},
              {"tbt_ms", iteration * 1e3},
              {"throughput_tokens_per_s", throughput},
              {"throughput_per_gpu", per_gpu},
              {"throughput_per_cost", per_cost},
              {"throughput_per_watt", per_watt}};
}

std::vector<Baseline> colocated_baselines(const SearchOptions& options, const GpuSpec& gpu) {
  const ModelConfig& model = options.model;
  const int E = model.experts, K = model.top_k, L = model.moe_layers;
  const double h = static_cast<double>(model.hidden);
  std::vector<Baseline> out;
  Objective obj = options.objective;

  // Tensor parallel only; tp may span nodes (the all-reduce then crosses the NIC).
  Baseline best_tp;
  for (int tp = 1; tp <= 64; tp *= 2) {
    if (options.max_gpus > 0 && tp > options.max_gpus) break;
    DeploymentShape shape{gpu, gpu, tp, tp};
    const StageModel s = search_stage_model(options, model, shape);
    const double cap = tp * gpu.memory_bytes * gpu.efficiency.memory_usable;
    auto time = [&](double b) { return L * (s.t_attention(b) + s.k3 * b * K + E * s.k4); };
    auto ok = [&](int64_t b) {
      double mem = 2.0 * model.total_params() +
                   model.kv_bytes_per_token_per_layer() * b * options.seq_len * model.layers;
      return mem <= cap && time(static_cast<double>(b)) <= options.slo;
    };
    int64_t b = largest(ok);
    if (b == 0) continue;
    Baseline cand;
    cand.name = "tensor-parallel";
    cand.description = "co-located, tensor parallel over " + std::to_string(tp) + " " + gpu.name +
                       ", all experts on every GPU, no micro-batching";
    cand.gpu = gpu.name;
    cand.tp = tp;
    cand.gpus = tp;
    cand.batch = b;
    cand.iteration = time(static_cast<double>(b));
    finish(cand, gpu);
    if (best_tp.gpus == 0 || cand.objective(obj) > best_tp.objective(obj)) best_tp = cand;
  }
  if (best_tp.gpus > 0) out.push_back(best_tp);

  // Expert parallel with all-to-all: ep ranks (ep divides E), each a tp group.
  Baseline best_ep;
  for (int tp : tp_candidates(gpu)) {
    DeploymentShape shape{gpu, gpu, tp, tp};
    const StageModel s = search_stage_model(options, model, shape);
    for (int ep = 2; ep <= E; ++ep) {
      if (E % ep != 0) continue;
      if (options.max_gpus > 0 && ep * tp > options.max_gpus) break;
      const int experts_per_rank = E / ep;
      const double cap = tp * gpu.memory_bytes * gpu.efficiency.memory_usable;
      auto time = [&](double b) {
        const double b_e = b * ep * K / E;
        const double a2a = all_to_all_time(gpu, tp, ep, b * K * 2.0 * h / tp, s.nic_util);
        return L * (s.t_attention(b) + 2 * a2a + experts_per_rank * s.t_expert(b_e));
      };
      auto ok = [&](int64_t b) {
        double mem = 2.0 * model.attention_side_params() +
                     experts_per_rank * expert_node_bytes(model) +
                     model.kv_bytes_per_token_per_layer() * b * options.seq_len * model.layers;
        return mem <= cap && time(static_cast<double>(b)) <= options.slo;
      };
      int64_t b = largest(ok);
      if (b == 0) continue;
      Baseline cand;
      cand.name = "expert-parallel";
      cand.description = "co-located, " + std::to_string(ep) + " expert-parallel ranks of " +
                         std::to_string(tp) + " " + gpu.name +
                         " (attention data-parallel), all-to-all, no ping-pong";
      cand.gpu = gpu.name;
      cand.tp = tp;
      cand.ep = ep;
      cand.gpus = ep * tp;
      cand.batch = b * ep;
      cand.iteration = time(static_cast<double>(b));
      finish(cand, gpu);
      if (best_ep.gpus == 0 || cand.objective(obj) > best_ep.objective(obj)) best_ep = cand;
    }
  }
  if (best_ep.gpus > 0) out.push_back(best_ep);
  return out;
}

}  // namespace msinfer::planner
