#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "msinfer/planner/plan.h"

namespace msinfer::planner {

StatusOr<Objective> parse_objective(const std::string& s) {
  if (s == "cost") return Objective::kCost;
  if (s == "gpu") return Objective::kGpu;
  if (s == "power") return Objective::kPower;
  return invalid_argument("--objective: expected cost, gpu or power, got '" + s + "'");
}

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::kCost: return "cost";
    case Objective::kGpu: return "gpu";
    case Objective::kPower: return "power";
  }
  return "?";
}

StatusOr<Workload> workload_preset(const std::string& name) {
  if (name == "paper-trace") return Workload{"paper-trace", 571, 159};
  return not_found("--workload: unknown preset '" + name + "' (known: paper-trace)");
}

double Deployment::tokens_per_expert() const {
  return static_cast<double>(batch_per_micro_batch) * attention_nodes * model.top_k /
         model.experts;
}

double Deployment::cost() const {
  return attention_gpus() * shape.attention_gpu.price + expert_gpus() * shape.expert_gpu.price;
}

double Deployment::power_w() const {
  return attention_gpus() * shape.attention_gpu.tdp_w + expert_gpus() * shape.expert_gpu.tdp_w;
}

StageTimes Deployment::stage_times() const {
  StageTimes t;
  const double b_a = static_cast<double>(batch_per_micro_batch);
  const double b_e = tokens_per_expert();
  t.t_a = stage.t_attention(b_a);
  t.t_e = stage.t_expert(b_e);
  t.t_c = stage.t_comm(b_a, b_e, attention_nodes);
  return t;
}

double Prediction::objective(Objective o) const {
  switch (o) {
    case Objective::kCost: return per_cost;
    case Objective::kGpu: return per_gpu;
    case Objective::kPower: return per_watt;
  }
  return 0;
}

Prediction predict(const Deployment& d) {
  Prediction p;
  const StageTimes t = d.stage_times();
  const int L = d.model.moe_layers;
  p.t_attention = t.t_a;
  p.t_expert = t.t_e;
  p.t_comm = t.t_c;
  p.iteration = iteration_time(t, d.micro_batches, L);
  p.spec_iteration = spec_iteration_time(t, d.micro_batches, L);
  p.throughput = static_cast<double>(d.global_batch()) / p.iteration;
  p.per_gpu = p.throughput / d.gpus();
  p.per_cost = p.throughput / d.cost();
  p.per_watt = p.throughput / d.power_w();
  p.tokens_per_expert = d.tokens_per_expert();
  p.expert_gemm_utilization = expert_gemm_utilization(p.tokens_per_expert, d.shape.expert_gpu);
  p.full_overlap = full_overlap(t, d.micro_batches);
  p.min_micro_batches = min_micro_batches_for_overlap(t);
  p.attention_memory_bytes =
      attention_node_bytes(d.model, d.micro_batches, static_cast<double>(d.batch_per_micro_batch),
                           d.seq_len, d.shape.tp_attention);
  p.attention_memory_capacity = attention_node_capacity(d.shape.attention_gpu, d.shape.tp_attention);
  p.expert_memory_bytes = expert_node_bytes(d.model);
  p.expert_memory_capacity = expert_node_capacity(d.shape.expert_gpu, d.shape.tp_expert);
  return p;
}

StageModel search_stage_model(const SearchOptions& options, const ModelConfig& model,
                              const DeploymentShape& shape, const FitRange& fit) {
  StageModel s =
      build_stage_model(model, shape, options.seq_len, options.nic_util, options.profile, fit);
  s.k1 *= options.k1_scale;
  s.k3 *= options.k3_scale;
  return s;
}

std::vector<int> tp_candidates(const GpuSpec& gpu) {
  std::vector<int> out;
  for (int tp = 1; tp <= gpu.gpus_per_node; tp *= 2) out.push_back(tp);
  return out;
}

namespace {

bool feasible(const Deployment& d, double slo) {
  const Prediction p = predict(d);
  return p.iteration <= slo && p.attention_memory_bytes <= p.attention_memory_capacity;
}

}  // namespace

namespace {

StatusOr<Plan> best_batch_fixed_stage(const SearchOptions& options, Deployment d,
                                      int64_t* evaluations);

}  // namespace

StatusOr<Plan> best_batch(const SearchOptions& options, Deployment d, int64_t* evaluations) {
  MSI_ASSIGN_OR_RETURN(Plan plan, best_batch_fixed_stage(options, d, evaluations));
  const bool fitted = options.profile == nullptr || !options.profile->k1 || !options.profile->k2 ||
                      !options.profile->k3 || !options.profile->k4;
  if (!fitted) return plan;
  for (int round = 0; round < 4; ++round) {
    const Deployment& cur = plan.deployment;
    const double b_a = static_cast<double>(cur.batch_per_micro_batch);
    const double b_e = cur.tokens_per_expert();
    FitRange fit{b_a / 2, b_a * 2, b_e / 2, b_e * 2};
    d.stage = search_stage_model(options, d.model, d.shape, fit);
    auto next = best_batch_fixed_stage(options, d, evaluations);
    if (!next.ok()) break;  // keep the last feasible fit
    const double moved =
        std::abs(static_cast<double>(next->deployment.batch_per_micro_batch) - b_a);
    plan = std::move(next).value();
    if (moved <= 0.01 * b_a) break;
  }
  return plan;
}

namespace {

StatusOr<Plan> best_batch_fixed_stage(const SearchOptions& options, Deployment d,
                                      int64_t* evaluations) {
  int64_t evals = 0;
  auto ok_at = [&](int64_t b) {
    ++evals;
    d.batch_per_micro_batch = b;
    return feasible(d, options.slo);
  };
  const bool fits_expert =
      expert_node_bytes(d.model) <= expert_node_capacity(d.shape.expert_gpu, d.shape.tp_expert);
  if (!fits_expert || !ok_at(1)) {
    if (evaluations) *evaluations += evals;
    return not_found("no batch size meets the SLO and memory for this shape");
  }
  int64_t lo = 1, hi = 2;
  constexpr int64_t kMaxBatch = int64_t{1} << 24;
  while (hi < kMaxBatch && ok_at(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi >= kMaxBatch && ok_at(kMaxBatch)) lo = hi = kMaxBatch;
  while (hi - lo > 1) {  // invariant: ok(lo), !ok(hi)
    int64_t mid = lo + (hi - lo) / 2;
    if (ok_at(mid)) lo = mid;
    else hi = mid;
  }
  if (evaluations) *evaluations += evals;
  Plan plan;
  plan.slo = options.slo;
  plan.max_gpus = options.max_gpus;
  d.batch_per_micro_batch = lo;
  plan.deployment = d;
  plan.predicted = predict(d);
  // Which constraint stops b_a + 1?
  Deployment next = d;
  next.batch_per_micro_batch = lo + 1;
  const Prediction pn = predict(next);
  std::string binding;
  if (pn.iteration > options.slo) binding = "slo";
  if (pn.attention_memory_bytes > pn.attention_memory_capacity) {
    binding += std::string(binding.empty() ? "" : ",") + "attention_memory";
  }
  plan.binding = binding.empty() ? "batch_limit" : binding;
  plan.balance_attention_nodes =
      d.stage.k3 > 0 ? d.stage.k1 * d.model.experts / (d.stage.k3 * d.model.top_k) : 0.0;
  return plan;
}

}  // namespace

StatusOr<SearchResult> search_plans(const SearchOptions& options) {
  MSI_RETURN_IF_ERROR(options.model.validate());
  if (options.gpu_pairs.empty()) return invalid_argument("no GPU given (--gpu or --gpus)");
  if (!(options.slo > 0)) return invalid_argument("--slo-ms must be > 0");
  if (!(options.seq_len > 0)) return invalid_argument("--seq-len must be > 0");
  if (options.max_micro_batches < 1) return invalid_argument("--max-micro-batches must be >= 1");
  if (options.max_gpus < 0) return invalid_argument("--max-gpus must be >= 0");
  SearchResult result;
  const ModelConfig& model = options.model;
  const int E = model.experts;
  for (const auto& [ga, ge] : options.gpu_pairs) {
    for (int tpe : tp_candidates(ge)) {
      if (expert_node_bytes(model) > expert_node_capacity(ge, tpe)) continue;
      for (int tpa : tp_candidates(ga)) {
        // Only splits the runtime can run (heads even, KV heads even or replicated).
        if (!model.check_attention_tp(tpa).ok()) continue;
        if (attention_node_bytes(model, 1, 1, options.seq_len, tpa) >
            attention_node_capacity(ga, tpa)) {
          continue;
        }
        for (ExpertReduction red : {ExpertReduction::kAllReduce, ExpertReduction::kPartialSums}) {
          if (tpe == 1 && red == ExpertReduction::kPartialSums) continue;  // nothing to reduce
          Deployment d;
          d.model = model;
          d.shape = DeploymentShape{ga, ge, tpa, tpe, red};
          d.seq_len = options.seq_len;
          d.stage = search_stage_model(options, model, d.shape);
          // n_a by balance (T_a = T_e with the constants ignored), and its neighbours.
          const double n_bal =
              d.stage.k3 > 0 ? std::min(d.stage.k1 * E / (d.stage.k3 * model.top_k), 1e6) : 1e6;
          int n_cap = 1 << 20;
          if (options.max_gpus > 0) n_cap = (options.max_gpus - E * tpe) / tpa;
          if (n_cap < 1) continue;
          std::set<int> n_values;
          const int lo = static_cast<int>(std::floor(n_bal));
          for (int n = lo - 1; n <= lo + 2; ++n) {
            if (n >= 1) n_values.insert(std::min(n, n_cap));
          }
          for (int m = 1; m <= options.max_micro_batches; ++m) {
            std::set<int> tried;
            int best_for_m = -1;  // index into result.plans (which grows)
            auto try_n = [&](int n_a) {
              if (n_a < 1 || n_a > n_cap || !tried.insert(n_a).second) return;
              Deployment cand = d;
              cand.attention_nodes = n_a;
              cand.micro_batches = m;
              auto plan = best_batch(options, cand, &result.evaluated);
              if (!plan.ok()) return;
              if (options.max_gpus > 0 && n_a == n_cap && n_cap < lo) plan->binding += ",max_gpus";
              result.plans.push_back(std::move(plan).value());
              const int idx = static_cast<int>(result.plans.size()) - 1;
              if (best_for_m < 0 ||
                  result.plans[idx].predicted.objective(options.objective) >
                      result.plans[best_for_m].predicted.objective(options.objective)) {
                best_for_m = idx;
              }
            };
            for (int n_a : n_values) try_n(n_a);
            if (best_for_m < 0) continue;
            // Balance again with the constants, at the batch just found:
            // k1 b_a + k2 = k3 b_a n_a K / E + k4.
            const Deployment& found = result.plans[best_for_m].deployment;
            const StageModel& st = found.stage;  // refitted at the batch found
            const double b_a = static_cast<double>(found.batch_per_micro_batch);
            const double n_ref =
                st.k3 > 0 ? (st.k1 * b_a + st.k2 - st.k4) * E / (st.k3 * b_a * model.top_k) : 0.0;
            if (n_ref >= 1 && n_ref < (1 << 20)) {
              const int f = static_cast<int>(std::floor(n_ref));
              try_n(f);
              try_n(f + 1);
            }
          }
        }
      }
    }
  }
  if (result.plans.empty()) {
    return resource_exhausted(
        "no deployment of " + model.name + " meets the " + std::to_string(options.slo * 1e3) +
        " ms SLO and the memory limits on the given GPUs" +
        (options.max_gpus > 0 ? " within " + std::to_string(options.max_gpus) + " GPUs" : ""));
  }
  const Objective obj = options.objective;
  std::stable_sort(result.plans.begin(), result.plans.end(), [obj](const Plan& a, const Plan& b) {
    return a.predicted.objective(obj) > b.predicted.objective(obj);
  });
  // Baselines: the best co-located deployment of each kind over the candidate GPU types.
  std::vector<std::string> seen;
  for (const auto& [ga, ge] : options.gpu_pairs) {
    for (const GpuSpec* g : {&ga, &ge}) {
      if (std::find(seen.begin(), seen.end(), g->name) != seen.end()) continue;
      seen.push_back(g->name);
      for (Baseline& b : colocated_baselines(options, *g)) {
        auto it = std::find_if(result.baselines.begin(), result.baselines.end(),
                               [&](const Baseline& x) { return x.name == b.name; });
        if (it == result.baselines.end()) result.baselines.push_back(b);
        else if (b.objective(obj) > it->objective(obj)) *it = b;
      }
    }
  }
  return result;
}

}  // namespace msinfer::planner
