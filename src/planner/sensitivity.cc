#include <set>

#include "msinfer/core/table.h"
#include "msinfer/planner/plan.h"

namespace msinfer::planner {

std::string shape_summary(const Deployment& d) {
  return d.shape.attention_gpu.name + " x" + std::to_string(d.attention_nodes) + " (tp " +
         std::to_string(d.shape.tp_attention) + ") + " + d.shape.expert_gpu.name + " x" +
         std::to_string(d.expert_nodes()) + " (tp " + std::to_string(d.shape.tp_expert) +
         (d.experts_per_node() > 1
              ? ", " + std::to_string(d.experts_per_node()) + " experts each"
              : std::string()) +
         (d.shape.tp_expert > 1
              ? std::string(", ") + expert_reduction_name(d.shape.expert_reduction)
              : std::string()) +
         "), m=" + std::to_string(d.micro_batches);
}

StatusOr<std::vector<SensitivityRow>> sensitivity(const SearchOptions& options,
                                                  const Plan& chosen) {
  struct Perturbation {
    std::string parameter;
    double factor;
  };
  std::vector<Perturbation> perturbations;
  std::set<std::string> names;
  for (const auto& [a, e] : options.gpu_pairs) {
    names.insert(a.name);
    names.insert(e.name);
  }
  for (const auto& n : names) {
    perturbations.push_back({"price:" + n, 0.8});
    perturbations.push_back({"price:" + n, 1.2});
  }
  for (const char* k : {"k1", "k3"}) {
    perturbations.push_back({k, 0.8});
    perturbations.push_back({k, 1.2});
  }
  const Objective obj = options.objective;
  const std::string original = shape_summary(chosen.deployment);
  std::vector<SensitivityRow> rows;
  for (const auto& p : perturbations) {
    SearchOptions o = options;
    auto scale_gpu = [&](GpuSpec& g) {
      if (p.parameter == "price:" + g.name) g.price *= p.factor;
    };
    for (auto& [a, e] : o.gpu_pairs) {
      scale_gpu(a);
      scale_gpu(e);
    }
    if (p.parameter == "k1") o.k1_scale *= p.factor;
    if (p.parameter == "k3") o.k3_scale *= p.factor;
    MSI_ASSIGN_OR_RETURN(SearchResult r, search_plans(o));
    SensitivityRow row;
    row.parameter = p.parameter;
    row.factor = p.factor;
    const Plan& best = r.plans.front();
    row.new_plan = shape_summary(best.deployment);
    row.plan_changed = row.new_plan != original;
    // The original shape under the perturbed model, batch re-searched.
    Deployment d = chosen.deployment;
    scale_gpu(d.shape.attention_gpu);
    scale_gpu(d.shape.expert_gpu);
    d.stage = search_stage_model(o, d.model, d.shape);
    auto again = best_batch(o, d);
    if (again.ok() && again->predicted.objective(obj) >= best.predicted.objective(obj)) {
      // The search explores n_a near balance only; the chosen shape may still be the best known.
      row.new_plan = original;
      row.plan_changed = false;
      row.original_loss = 0;
    } else if (again.ok()) {
      row.original_loss = 1.0 - again->predicted.objective(obj) / best.predicted.objective(obj);
    } else {
      row.original_feasible = false;
      row.original_loss = 1.0;
    }
    rows.push_back(row);
  }
  return rows;
}

Json sensitivity_to_json(const std::vector<SensitivityRow>& rows) {
  Json out = Json::array();
  for (const auto& r : rows) {
    out.push_back(Json{{"parameter", r.parameter},
                       {"factor", r.factor},
                       {"plan_changed", r.plan_changed},
                       {"new_plan", r.new_plan},
                       {"original_feasible", r.original_feasible},
                       {"original_loss", r.original_loss}});
  }
  return out;
}

}  // namespace msinfer::planner
