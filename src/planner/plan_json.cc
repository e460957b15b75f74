// The plan document (docs/PLANNER.md, section 7) written by `msinfer plan` and read by
// `msinfer simulate --plan` (and later `msinfer serve --plan`).
#include <cmath>

#include "msinfer/planner/plan.h"

namespace msinfer::planner {
Json deployment_plan_json(const Deployment& d) {
  return Json{{"tp_attention", d.shape.tp_attention},
              {"tp_expert", d.shape.tp_expert},
              {"attention_nodes", d.attention_nodes},
              {"micro_batches", d.micro_batches},
              {"global_batch", d.global_batch()},
              {"attention_gpu", d.shape.attention_gpu.name},
              {"expert_gpu", d.shape.expert_gpu.name},
              {"expert_tp_reduction",
               d.shape.tp_expert > 1 ? expert_reduction_name(d.shape.expert_reduction) : "none"},
              {"expert_nodes", d.expert_nodes()},
              {"experts_per_node", d.experts_per_node()},
              // Where the work every token visits runs in what this plan
              // predicts: the stage model charges shared experts and dense
              // layers to the attention side. The runtime can also run the
              // shared experts on the expert workers (--shared-experts
              // expert); `--plan` runs them where this says unless that flag
              // is given (tools/msinfer/worker.cc).
              {"shared_experts_on", d.model.shared_expert_ffn > 0 ? "attention" : "none"},
              {"dense_layers_on", d.model.layers > d.model.moe_layers ? "attention" : "none"},
              {"batch_per_micro_batch", d.batch_per_micro_batch},
              {"attention_gpus", d.attention_gpus()},
              {"expert_gpus", d.expert_gpus()},
              {"gpus", d.gpus()}};
}

Json Prediction::to_json() const {
  return Json{{"throughput_tokens_per_s", throughput},
              {"throughput_per_gpu", per_gpu},
              {"throughput_per_cost", per_cost},
              {"throughput_per_watt", per_watt},
              {"tbt_ms", iteration * 1e3},
              {"t_attention_ms", t_attention * 1e3},
              {"t_expert_ms", t_expert * 1e3},
              {"t_comm_ms", t_comm * 1e3},
              {"tbt_spec_formula_ms", spec_iteration * 1e3},
              {"tokens_per_expert", tokens_per_expert},
              {"rows_per_expert_node", rows_per_expert_node},
              {"expert_node_imbalance_uniform_routing", expert_node_imbalance},
              {"expert_gemm_utilization", expert_gemm_utilization}};
}

Json Plan::to_json() const {
  const Prediction& p = predicted;
  const Deployment& d = deployment;
  auto binds = [&](const char* name) { return binding.find(name) != std::string::npos; };
  Json constraints{
      {"slo",
       {{"holds", p.iteration <= slo}, {"binds", binds("slo")},
        {"tbt_ms", p.iteration * 1e3}, {"limit_ms", slo * 1e3}}},
      {"attention_memory",
       {{"holds", p.attention_memory_bytes <= p.attention_memory_capacity},
        {"binds", binds("attention_memory")},
        {"used_gb", p.attention_memory_bytes / 1e9},
        {"capacity_gb", p.attention_memory_capacity / 1e9}}},
      {"expert_memory",
       {{"holds", p.expert_memory_bytes <= p.expert_memory_capacity},
        {"binds", false},
        {"used_gb", p.expert_memory_bytes / 1e9},
        {"capacity_gb", p.expert_memory_capacity / 1e9}}},
      {"overlap",
       {{"holds", p.full_overlap},
        {"binds", false},
        {"micro_batches", d.micro_batches},
        {"min_micro_batches", p.min_micro_batches},
        {"comm_below_compute", p.t_comm < std::max(p.t_attention, p.t_expert)}}},
      {"balance",
       {{"t_attention_over_t_expert", p.t_expert > 0 ? p.t_attention / p.t_expert : 0.0},
        {"balance_attention_nodes", balance_attention_nodes}}},
      {"context",
       {{"holds", (d.max_context > 0 ? d.max_context : d.seq_len) <=
                      static_cast<double>(d.model.max_position_embeddings)},
        {"binds", false},
        {"max_context", d.max_context > 0 ? d.max_context : d.seq_len},
        {"limit", d.model.max_position_embeddings}}},
      {"max_gpus",
       {{"holds", max_gpus == 0 || d.gpus() <= max_gpus},
        {"binds", binds("max_gpus")},
        {"limit", max_gpus},
        {"gpus", d.gpus()}}},
      {"binding", binding}};
  return Json{{"plan", deployment_plan_json(d)}, {"predicted", p.to_json()}, {"constraints", constraints}};
}

Json plan_document(const SearchOptions& options, const SearchResult& result,
                   size_t alternatives) {
  MSI_CHECK(!result.plans.empty()) << "plan_document needs at least one plan";
  const Plan& best = result.plans.front();
  const Objective obj = options.objective;
  Json doc = best.to_json();
  doc["model"] = best.deployment.model.to_json();
  doc["stage_model"] = best.deployment.stage.to_json();
  doc["hardware"] = {{"attention_gpu", best.deployment.shape.attention_gpu.to_json()},
                     {"expert_gpu", best.deployment.shape.expert_gpu.to_json()}};
  doc["search"] = {{"objective", objective_name(obj)},
                   {"slo_ms", options.slo * 1e3},
                   {"seq_len", options.seq_len},
                   {"max_context", options.max_context > 0 ? options.max_context : options.seq_len},
                   {"workload",
                    {{"name", options.workload.name},
                     {"input_len", options.workload.input_len},
                     {"output_len", options.workload.output_len}}},
                   {"max_micro_batches", options.max_micro_batches},
                   {"max_gpus", options.max_gpus},
                   {"gpu_pairs", options.gpu_pairs.size()},
                   {"feasible_plans", result.plans.size()},
                   {"batch_evaluations", result.evaluated},
                   {"stage_model_source", best.deployment.stage.source}};
  Json alts = Json::array();
  for (size_t i = 1; i < result.plans.size() && i <= alternatives; ++i) {
    Json a = result.plans[i].to_json();
    a["relative_to_best"] = result.plans[i].predicted.objective(obj) / best.predicted.objective(obj);
    alts.push_back(a);
  }
  doc["alternatives"] = alts;
  Json bases = Json::array();
  for (const Baseline& b : result.baselines) {
    Json j = b.to_json();
    j["plan_gain"] = best.predicted.objective(obj) / b.objective(obj);
    bases.push_back(j);
  }
  doc["baselines"] = bases;
  doc["verdict"] = verdict(result, obj).to_json();
  return doc;
}

StatusOr<Deployment> deployment_from_plan_document(const Json& j, const std::string& source) {
  JsonFields top(j, source);
  MSI_RETURN_IF_ERROR(top.expect_object());
  if (j.contains("devices") && j["devices"] == "cpu") {
    return invalid_argument(source +
                            ": a CPU plan (`plan --devices cpu`) of msinfer's own workers, not a "
                            "GPU deployment; `bench serve --offline --plan`, `generate --plan` "
                            "and `serve --plan` run it");
  }
  MSI_ASSIGN_OR_RETURN(JsonFields plan, top.object("plan"));
  MSI_ASSIGN_OR_RETURN(JsonFields model, top.object("model"));
  MSI_ASSIGN_OR_RETURN(JsonFields stage, top.object("stage_model"));
  MSI_ASSIGN_OR_RETURN(JsonFields hw, top.object("hardware"));
  MSI_ASSIGN_OR_RETURN(JsonFields ga, hw.object("attention_gpu"));
  MSI_ASSIGN_OR_RETURN(JsonFields ge, hw.object("expert_gpu"));
  Deployment d;
  MSI_ASSIGN_OR_RETURN(d.model, ModelConfig::from_json(model));
  MSI_ASSIGN_OR_RETURN(d.stage, StageModel::from_json(stage));
  MSI_ASSIGN_OR_RETURN(d.shape.attention_gpu, parse_gpu_spec(ga, Efficiency{}));
  MSI_ASSIGN_OR_RETURN(d.shape.expert_gpu, parse_gpu_spec(ge, Efficiency{}));
  // Valid ranges (docs/PLANNER.md, "Plan document"). The fields of `plan` that
  // follow from others must agree with them: an edited field is refused rather
  // than silently recomputed. `predicted`, `constraints`, `alternatives` and
  // `baselines` are output only: simulate recomputes them.
  MSI_ASSIGN_OR_RETURN(int64_t tpa, plan.integer_in("tp_attention", 1, kMaxGpusPerNode));
  MSI_ASSIGN_OR_RETURN(int64_t tpe, plan.integer_in("tp_expert", 1, kMaxGpusPerNode));
  MSI_ASSIGN_OR_RETURN(int64_t n_a, plan.integer_in("attention_nodes", 1, kMaxPlanAttentionNodes));
  MSI_ASSIGN_OR_RETURN(int64_t m, plan.integer_in("micro_batches", 1, kMaxPlanMicroBatches));
  MSI_ASSIGN_OR_RETURN(int64_t B, plan.integer_in("global_batch", 1, kMaxPlanGlobalBatch));
  if (B % (n_a * m) != 0) {
    return plan.field_error("global_batch", "must be a multiple of attention_nodes * micro_batches (" +
                                                std::to_string(n_a * m) + ")");
  }
  MSI_ASSIGN_OR_RETURN(std::string red, plan.string_or("expert_tp_reduction", "none"));
  if (red != "none") {
    auto r = parse_expert_reduction(red);
    if (!r.ok()) return plan.field_error("expert_tp_reduction", r.status().message());
    d.shape.expert_reduction = *r;
  }
  // Plans written before experts per node: one expert per node.
  int64_t x = 1;
  if (plan.has("experts_per_node")) {
    MSI_ASSIGN_OR_RETURN(x, plan.integer_in("experts_per_node", 1, d.model.experts));
    if (d.model.experts % x != 0) {
      return plan.field_error("experts_per_node", "must divide the model's " +
                                                      std::to_string(d.model.experts) + " experts");
    }
  }
  d.shape.experts_per_node = static_cast<int>(x);
  d.shape.tp_attention = static_cast<int>(tpa);
  d.shape.tp_expert = static_cast<int>(tpe);
  d.attention_nodes = static_cast<int>(n_a);
  d.micro_batches = static_cast<int>(m);
  d.batch_per_micro_batch = B / (n_a * m);
  auto agree = [&](const char* key, int64_t want) -> Status {
    if (!plan.has(key)) return ok_status();  // derived: optional
    MSI_ASSIGN_OR_RETURN(int64_t v, plan.integer(key));
    if (v != want) {
      return plan.field_error(
          key,
          "is " + std::to_string(v) + ", but the plan's other fields give " + std::to_string(want));
    }
    return ok_status();
  };
  MSI_RETURN_IF_ERROR(agree("batch_per_micro_batch", d.batch_per_micro_batch));
  MSI_RETURN_IF_ERROR(agree("expert_nodes", d.expert_nodes()));
  MSI_RETURN_IF_ERROR(agree("attention_gpus", d.attention_gpus()));
  MSI_RETURN_IF_ERROR(agree("expert_gpus", d.expert_gpus()));
  MSI_RETURN_IF_ERROR(agree("gpus", d.gpus()));
  for (auto [key, gpu] : {std::pair{"attention_gpu", &d.shape.attention_gpu},
                          std::pair{"expert_gpu", &d.shape.expert_gpu}}) {
    MSI_ASSIGN_OR_RETURN(std::string name, plan.string(key));
    if (name != gpu->name) {
      return plan.field_error(key, "is '" + name + "', but hardware." + std::string(key) +
                                       " describes '" + gpu->name + "'");
    }
  }
  // The stage model's transfer sizes follow from the model and the tp sizes
  // (build_stage_model); a model edited without them is refused.
  const double dispatch = 2.0 * static_cast<double>(d.model.hidden) * d.model.top_k / tpa;
  const double expert = 2.0 * static_cast<double>(d.model.hidden) / tpe;
  if (std::fabs(d.stage.dispatch_bytes_per_token - dispatch) > 1e-9 * dispatch ||
      std::fabs(d.stage.expert_bytes_per_token - expert) > 1e-9 * expert) {
    return stage.field_error("dispatch_bytes_per_token",
                             "and expert_bytes_per_token do not match model.hidden " +
                                 std::to_string(d.model.hidden) + ", top_k " +
                                 std::to_string(d.model.top_k) + " and the tp sizes (want " +
                                 Json(dispatch).dump() + " and " + Json(expert).dump() + ")");
  }
  d.seq_len = 2048;
  if (top.has("search")) {
    MSI_ASSIGN_OR_RETURN(JsonFields search, top.object("search"));
    if (search.has("seq_len")) {
      MSI_ASSIGN_OR_RETURN(d.seq_len, search.number_in("seq_len", 0, 1e7, true));
    }
    if (search.has("max_context")) {
      MSI_ASSIGN_OR_RETURN(d.max_context, search.number_in("max_context", 0, 2e7, true));
    }
  }
  return d;
}

}  // namespace msinfer::planner
