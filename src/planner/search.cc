#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
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

double Deployment::rows_per_expert_node() const {
  return static_cast<double>(batch_per_micro_batch) * attention_nodes * model.top_k /
         expert_nodes();
}

int64_t max_batch_per_micro_batch(int attention_nodes, int micro_batches) {
  const int64_t per =
      static_cast<int64_t>(std::max(attention_nodes, 1)) * std::max(micro_batches, 1);
  return std::min<int64_t>(int64_t{1} << 24, kMaxPlanGlobalBatch / per);
}

namespace {

// Expected max over n nodes of the rows one node gets, over the mean, when
// `tokens` tokens each pick K distinct experts of E uniformly and a node holds
// x of them: a node's count per token is hypergeometric (mean Kx/E, variance
// K (x/E)(1 - x/E)(E - K)/(E - 1)); over the tokens, normal; the expected max
// of n such is about mean + sigma sqrt(2 ln n).
double node_imbalance(double tokens, int E, int K, int x) {
  const int n = E / std::max(x, 1);
  if (n <= 1 || tokens <= 0 || E <= 1) return 1.0;
  const double p = static_cast<double>(x) / E;
  const double mean = tokens * K * p;
  const double var = tokens * K * p * (1 - p) * (E - K) / (E - 1.0);
  return 1.0 + std::sqrt(std::max(var, 0.0)) * std::sqrt(2.0 * std::log(n)) / mean;
}

}  // namespace

double Deployment::cost() const {
  return attention_gpus() * shape.attention_gpu.price + expert_gpus() * shape.expert_gpu.price;
}

double Deployment::power_w() const {
  return attention_gpus() * shape.attention_gpu.tdp_w + expert_gpus() * shape.expert_gpu.tdp_w;
}

StageTimes Deployment::stage_times() const {
  StageTimes t;
  const double b_a = static_cast<double>(batch_per_micro_batch);
  const double b_e = rows_per_expert_node();
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
  p.expert_memory_bytes = expert_node_bytes(d.model, d.experts_per_node());
  p.rows_per_expert_node = d.rows_per_expert_node();
  p.expert_node_imbalance =
      node_imbalance(static_cast<double>(d.batch_per_micro_batch) * d.attention_nodes,
                     d.model.experts, d.model.top_k, d.experts_per_node());
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

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
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
    const double b_e = cur.rows_per_expert_node();
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
  const bool fits_expert = expert_node_bytes(d.model, d.experts_per_node()) <=
                           expert_node_capacity(d.shape.expert_gpu, d.shape.tp_expert);
  if (!fits_expert || !ok_at(1)) {
    if (evaluations) *evaluations += evals;
    return not_found("no batch size meets the SLO and memory for this shape");
  }
  int64_t lo = 1, hi = 2;
  // The bound simulate --plan reads back (the global batch within 2^32).
  const int64_t kMaxBatch = max_batch_per_micro_batch(d.attention_nodes, d.micro_batches);
  while (hi < kMaxBatch && ok_at(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi >= kMaxBatch) {
    hi = kMaxBatch + 1;
    if (ok_at(kMaxBatch)) lo = kMaxBatch;
  }
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
      d.stage.k3 > 0 ? d.stage.k1 * d.expert_nodes() / (d.stage.k3 * d.model.top_k) : 0.0;
  return plan;
}

}  // namespace

namespace {

std::string context_violation(const ModelConfig& model, double max_context) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "the workload reaches a context of %.0f tokens; %s holds at most %lld "
                "(max_position_embeddings)",
                max_context, model.name.c_str(),
                static_cast<long long>(model.max_position_embeddings));
  return buf;
}

}  // namespace

std::string Feasibility::violated() const {
  std::string out;
  auto add = [&](bool holds, const char* name) {
    if (holds) return;
    if (!out.empty()) out += ",";
    out += name;
  };
  add(slo, "slo");
  add(attention_memory, "attention_memory");
  add(expert_memory, "expert_memory");
  add(context, "context");
  add(batch, "batch");
  return out;
}

Json Feasibility::to_json() const {
  Json reasons_json = Json::array();
  for (const auto& r : reasons) reasons_json.push_back(r);
  return Json{{"feasible", ok()},
              {"violated", violated()},
              {"reasons", reasons_json},
              {"slo", slo},
              {"attention_memory", attention_memory},
              {"expert_memory", expert_memory},
              {"context", context},
              {"batch", batch}};
}

Feasibility check_deployment(const Deployment& d, double slo) {
  Feasibility f;
  char buf[256];
  const int64_t max_b = max_batch_per_micro_batch(d.attention_nodes, d.micro_batches);
  if (d.batch_per_micro_batch > max_b) {
    f.batch = false;
    std::snprintf(buf, sizeof buf,
                  "b_a %lld exceeds %lld, the largest with %d attention nodes and m = %d "
                  "(global batch at most 2^32, b_a at most 2^24)",
                  static_cast<long long>(d.batch_per_micro_batch), static_cast<long long>(max_b),
                  d.attention_nodes, d.micro_batches);
    f.reasons.push_back(buf);
  }
  const Prediction p = predict(d);
  if (!(p.attention_memory_bytes <= p.attention_memory_capacity)) {
    f.attention_memory = false;
    f.reasons.push_back("an attention node needs " + gb(p.attention_memory_bytes) +
                        " (weights + KV of " + std::to_string(d.micro_batches) + " x " +
                        std::to_string(d.batch_per_micro_batch) + " requests at context " +
                        std::to_string(static_cast<long long>(std::llround(d.seq_len))) +
                        ") of its " + gb(p.attention_memory_capacity));
  }
  if (!(p.expert_memory_bytes <= p.expert_memory_capacity)) {
    f.expert_memory = false;
    f.reasons.push_back("an expert node needs " + gb(p.expert_memory_bytes) + " for its " +
                        std::to_string(d.experts_per_node()) + " expert(s) of its " +
                        gb(p.expert_memory_capacity));
  }
  if (slo > 0 && !(p.iteration <= slo)) {
    f.slo = false;
    std::snprintf(buf, sizeof buf, "TBT %.1f ms exceeds the %.1f ms SLO", p.iteration * 1e3,
                  slo * 1e3);
    f.reasons.push_back(buf);
  }
  const double ctx = d.max_context > 0 ? d.max_context : d.seq_len;
  if (ctx > static_cast<double>(d.model.max_position_embeddings)) {
    f.context = false;
    f.reasons.push_back(context_violation(d.model, ctx));
  }
  return f;
}

Json Verdict::to_json() const {
  return Json{{"recommended", recommended},
              {"colocated_wins", colocated_wins},
              {"disaggregated_over_best_colocated", ratio},
              {"best_colocated", best_colocated.empty() ? Json(nullptr) : Json(best_colocated)}};
}

Verdict verdict(const SearchResult& r, Objective objective) {
  Verdict v;
  v.recommended = "disaggregated";
  if (r.plans.empty()) return v;
  const double dis = r.plans.front().predicted.objective(objective);
  for (size_t i = 0; i < r.baselines.size(); ++i) {
    if (v.best_baseline < 0 ||
        r.baselines[i].objective(objective) > r.baselines[v.best_baseline].objective(objective)) {
      v.best_baseline = static_cast<int>(i);
    }
  }
  if (v.best_baseline < 0) return v;
  const Baseline& b = r.baselines[v.best_baseline];
  v.ratio = b.objective(objective) > 0 ? dis / b.objective(objective) : 0;
  v.colocated_wins = b.objective(objective) > dis;
  v.best_colocated = b.name;
  if (v.colocated_wins) v.recommended = b.name;
  return v;
}

StatusOr<SearchResult> search_plans(const SearchOptions& options) {
  MSI_RETURN_IF_ERROR(options.model.validate());
  if (options.gpu_pairs.empty()) return invalid_argument("no GPU given (--gpu or --gpus)");
  if (!(options.slo > 0)) return invalid_argument("--slo-ms must be > 0");
  if (!(options.seq_len > 0)) return invalid_argument("--seq-len must be > 0");
  if (options.max_micro_batches < 1) return invalid_argument("--max-micro-batches must be >= 1");
  if (options.max_gpus < 0) return invalid_argument("--max-gpus must be >= 0");
  const ModelConfig& model = options.model;
  const double max_context = options.max_context > 0 ? options.max_context : options.seq_len;
  if (max_context > static_cast<double>(model.max_position_embeddings)) {
    return invalid_argument(context_violation(model, max_context));
  }
  SearchResult result;
  const int E = model.experts;
  // Experts per expert node: every divisor of E (n_e = E / x nodes, E: one
  // expert per node as in the paper; fewer, larger nodes for fine-grained MoE).
  std::vector<int> experts_per_node;
  for (int x = 1; x <= E; ++x) {
    if (E % x == 0) experts_per_node.push_back(x);
  }
  for (const auto& [ga, ge] : options.gpu_pairs) {
    for (int tpe : tp_candidates(ge)) {
      for (int x : experts_per_node) {
        if (expert_node_bytes(model, x) > expert_node_capacity(ge, tpe)) continue;
        const int n_e = E / x;
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
            d.shape = DeploymentShape{ga, ge, tpa, tpe, red, x};
            d.seq_len = options.seq_len;
            d.max_context = max_context;
            d.stage = search_stage_model(options, model, d.shape);
            // n_a by balance (T_a = T_e with the constants ignored), and its neighbours.
            // (k1 b_a = k3 b_a n_a K / n_e: k3 is per row of an expert node.)
            const double n_bal =
                d.stage.k3 > 0 ? std::min(d.stage.k1 * n_e / (d.stage.k3 * model.top_k), 1e6) : 1e6;
            int n_cap = 1 << 20;
            if (options.max_gpus > 0) n_cap = (options.max_gpus - n_e * tpe) / tpa;
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
                if (options.max_gpus > 0 && n_a == n_cap && n_cap < lo) {
                  plan->binding += ",max_gpus";
                }
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
              // k1 b_a + k2 = k3 b_a n_a K / n_e + k4.
              const Deployment& found = result.plans[best_for_m].deployment;
              const StageModel& st = found.stage;  // refitted at the batch found
              const double b_a = static_cast<double>(found.batch_per_micro_batch);
              const double n_ref =
                  st.k3 > 0 ? (st.k1 * b_a + st.k2 - st.k4) * n_e / (st.k3 * b_a * model.top_k)
                            : 0.0;
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
  // The same expert GPUs grouped differently (8 nodes of tp 2 with one expert,
  // 4 of tp 4 with two, ...) often predict the same figures: keep the first,
  // the fewest experts per node among equals (searched first), so the
  // alternatives show different deployments.
  std::vector<Plan> distinct;
  std::set<std::string> seen_shapes;
  for (Plan& p : result.plans) {
    const Deployment& d = p.deployment;
    char key[512];
    std::snprintf(key, sizeof key, "%s|%s|%d|%d|%d|%lld|%d|%.9g",
                  d.shape.attention_gpu.name.c_str(), d.shape.expert_gpu.name.c_str(),
                  d.shape.tp_attention, d.attention_nodes, d.micro_batches,
                  static_cast<long long>(d.global_batch()), d.expert_gpus(),
                  p.predicted.objective(obj));
    if (seen_shapes.insert(key).second) distinct.push_back(std::move(p));
  }
  result.plans = std::move(distinct);
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
