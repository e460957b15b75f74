// Co-located baselines predicted with the same performance model as the plans:
//  - tensor-parallel: one replica holds the whole model on tp GPUs; per MoE layer
//    it runs attention, then every expert one after another (all on the same GPUs);
//  - expert-parallel: ep ranks of tp GPUs, each with a full attention replica
//    (data parallel) and E/ep experts; tokens move by all-to-all before and after
//    the experts; no micro-batch ping-pong, so nothing overlaps.
#include <algorithm>
#include <cmath>

#include "msinfer/planner/plan.h"

namespace msinfer::planner {
namespace {

// All-to-all among ep ranks of tp GPUs: each GPU sends `bytes`, (ep-1)/ep of it to
// other ranks, as ep-1 messages of bytes/ep; NVLink/PCIe inside a node, else the NIC
// at the utilisation of one such message.
double all_to_all_time(const GpuSpec& gpu, int tp, int ep, double bytes,
                       const UtilCurve& nic_util) {
  if (ep <= 1 || bytes <= 0) return 0;
  const double moved = bytes * (ep - 1) / ep;
  if (ep * tp <= gpu.gpus_per_node) {
    return moved / (gpu.intra_node_bandwidth * gpu.efficiency.intra_node_link);
  }
  return nic_transfer_time(moved, ep - 1, gpu.nic_bandwidth, nic_util);
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

double hierarchical_allreduce_time(const GpuSpec& gpu, int tp, double bytes,
                                   const UtilCurve& nic_util) {
  if (tp <= 1 || bytes <= 0) return 0;
  const int g = std::min(tp, gpu.gpus_per_node);
  const int nodes = (tp + g - 1) / g;
  // Reduce-scatter and all-gather inside the node: 2(g-1)/g of the data per GPU.
  const double intra =
      2.0 * (g - 1) / g * bytes / (gpu.intra_node_bandwidth * gpu.efficiency.intra_node_link);
  if (nodes <= 1) return intra;
  // Across nodes each GPU all-reduces its 1/g shard over its own NIC, all NICs in
  // parallel: a ring of `nodes` moves 2(n-1)/n of the shard in messages of shard/n.
  const double shard = bytes / g;
  const double inter = nic_transfer_time(2.0 * (nodes - 1) / nodes * shard, 2.0 * (nodes - 1),
                                         gpu.nic_bandwidth, nic_util);
  return intra + inter;
}

std::vector<Baseline> colocated_baselines(const SearchOptions& options, const GpuSpec& gpu) {
  const ModelConfig& model = options.model;
  const int E = model.experts, K = model.top_k, L = model.moe_layers;
  const double h = static_cast<double>(model.hidden);
  const double layers_per_moe = static_cast<double>(model.layers) / model.moe_layers;
  const double allreduces_a = layers_per_moe * (1.0 + (model.shared_expert_ffn > 0 ? 1.0 : 0.0));
  std::vector<Baseline> out;
  Objective obj = options.objective;
  // The roofline curves of one tp group (the per-token collectives of the
  // disaggregated model are replaced below by whole-batch hierarchical ones).
  auto curves = [&](int tp) {
    StageModel s = build_stage_model(model, DeploymentShape{gpu, gpu, tp, tp}, options.seq_len,
                                     options.nic_util);
    RooflineCurve a = s.attention_curve, e = s.expert_curve;
    a.serial_per_token -= allreduces_a * allreduce_time(gpu, tp, 2 * h, options.nic_util);
    a.compute_per_token *= options.k1_scale;
    a.serial_per_token *= options.k1_scale;
    e.overlapped_per_token = e.serial_per_token = 0;
    e.compute_per_token *= options.k3_scale;
    return std::pair{a, e};
  };
  const char* bound = "ideal co-located bound under the same efficiency factors";

  // Tensor parallel only; tp may span nodes (hierarchical all-reduce).
  Baseline best_tp;
  for (int tp = 1; tp <= 64; tp *= 2) {
    if (options.max_gpus > 0 && tp > options.max_gpus) break;
    // Named references, not a structured binding: lambdas below capture them,
    // which clang < 16 (the fuzz build) refuses for bindings.
    const auto tp_curves = curves(tp);
    const auto& ca = tp_curves.first;
    const auto& ce = tp_curves.second;
    const double cap = tp * gpu.memory_bytes * gpu.efficiency.memory_usable;
    // Per layer: attention with its all-reduces of the whole batch, then the E experts
    // one after another (b K / E tokens each), then one all-reduce of the batch's MoE
    // output (each GPU sums its experts' partial rows first).
    auto time = [&](double b) {
      const double ar = hierarchical_allreduce_time(gpu, tp, 2 * h * b, options.nic_util);
      return L * (ca.at(b) + allreduces_a * ar + E * ce.at(b * K / E) + ar);
    };
    auto ok = [&](int64_t b) {
      double mem = 2.0 * model.total_params() + model.kv_bytes_per_token_per_layer() * b *
                                                    model.attended_tokens(options.seq_len) *
                                                    model.layers;
      return mem <= cap && time(static_cast<double>(b)) <= options.slo;
    };
    int64_t b = largest(ok);
    if (b == 0) continue;
    Baseline cand;
    cand.name = "tensor-parallel";
    cand.description = "co-located, tensor parallel over " + std::to_string(tp) + " " + gpu.name +
                       ", all experts on every GPU, hierarchical all-reduce, no micro-batching (" +
                       bound + ")";
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
    // Named references, not a structured binding: lambdas below capture them,
    // which clang < 16 (the fuzz build) refuses for bindings.
    const auto tp_curves = curves(tp);
    const auto& ca = tp_curves.first;
    const auto& ce = tp_curves.second;
    for (int ep = 2; ep <= E; ++ep) {
      if (E % ep != 0) continue;
      if (options.max_gpus > 0 && ep * tp > options.max_gpus) break;
      const int experts_per_rank = E / ep;
      const double cap = tp * gpu.memory_bytes * gpu.efficiency.memory_usable;
      auto time = [&](double b) {
        const double b_e = b * ep * K / E;
        const double a2a = all_to_all_time(gpu, tp, ep, b * K * 2.0 * h / tp, options.nic_util);
        const double ar_a = hierarchical_allreduce_time(gpu, tp, 2 * h * b, options.nic_util);
        const double ar_e = hierarchical_allreduce_time(gpu, tp, 2 * h * b * K, options.nic_util);
        return L *
               (ca.at(b) + allreduces_a * ar_a + 2 * a2a + experts_per_rank * ce.at(b_e) + ar_e);
      };
      auto ok = [&](int64_t b) {
        double mem = 2.0 * model.attention_side_params() +
                     experts_per_rank * expert_node_bytes(model) +
                     model.kv_bytes_per_token_per_layer() * b *
                         model.attended_tokens(options.seq_len) * model.layers;
        return mem <= cap && time(static_cast<double>(b)) <= options.slo;
      };
      int64_t b = largest(ok);
      if (b == 0) continue;
      Baseline cand;
      cand.name = "expert-parallel";
      cand.description = "co-located, " + std::to_string(ep) + " expert-parallel ranks of " +
                         std::to_string(tp) + " " + gpu.name +
                         " (attention data-parallel), all-to-all, no ping-pong (" + bound + ")";
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
