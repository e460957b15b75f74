// msinfer plan: search the deployment with the best throughput per cost (or per
// GPU, per watt) under a TBT SLO, and compare it with co-located baselines.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "msinfer/core/table.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

using planner::Plan;

std::vector<std::string> plan_cells(const Plan& p, int rank) {
  const auto& d = p.deployment;
  const auto& q = p.predicted;
  return {std::to_string(rank),
          d.shape.attention_gpu.name + " x" + std::to_string(d.attention_nodes) + " tp" +
              std::to_string(d.shape.tp_attention),
          d.shape.expert_gpu.name + " x" + std::to_string(d.expert_nodes()) + " tp" +
              std::to_string(d.shape.tp_expert) +
              (d.experts_per_node() > 1 ? " " + std::to_string(d.experts_per_node()) + "e/node"
                                        : std::string()) +
              (d.shape.tp_expert == 1                                                  ? ""
               : d.shape.expert_reduction == planner::ExpertReduction::kPartialSums    ? " psum"
               : d.shape.expert_reduction == planner::ExpertReduction::kReduceToShard0 ? " r0"
                                                                                       : " ar"),
          std::to_string(d.micro_batches),
          std::to_string(d.global_batch()),
          fmt(q.tokens_per_expert, 0),
          fmt(q.iteration * 1e3, 1),
          fmt(q.t_attention * 1e3, 3),
          fmt(q.t_expert * 1e3, 3),
          fmt(q.t_comm * 1e3, 3),
          fmt(q.throughput, 0),
          fmt(q.per_gpu, 1),
          fmt(q.per_cost, 1),
          fmt(q.per_watt, 3),
          fmt_pct(q.expert_gemm_utilization),
          p.binding};
}

// The terms that decide between two plans, per layer and micro-batch at each plan's
// own batch: what the roofline charges for arithmetic, weight streaming, KV reads
// and collectives, the transfer, memory and the SLO.
std::vector<std::vector<std::string>> explain_rows(const planner::SearchOptions& o,
                                                   const std::vector<const Plan*>& plans) {
  std::vector<std::vector<std::string>> rows;
  auto row = [&](const std::string& name, auto f) {
    std::vector<std::string> r{name};
    for (const Plan* p : plans) r.push_back(f(*p));
    rows.push_back(r);
  };
  auto ms = [](double s) { return fmt(s * 1e3, 4); };
  row("GPUs (attention + experts)", [](const Plan& p) {
    const auto& d = p.deployment;
    return d.shape.attention_gpu.name + " tp" + std::to_string(d.shape.tp_attention) + " x" +
           std::to_string(d.attention_nodes) + " + " + d.shape.expert_gpu.name + " tp" +
           std::to_string(d.shape.tp_expert) + " x" + std::to_string(d.expert_nodes());
  });
  row("expert TP reduction", [](const Plan& p) {
    const auto& d = p.deployment;
    return std::string(
        d.shape.tp_expert == 1 ? "none" : planner::expert_reduction_name(d.shape.expert_reduction));
  });
  row("m, b_a, b_e", [](const Plan& p) {
    return std::to_string(p.deployment.micro_batches) + ", " +
           std::to_string(p.deployment.batch_per_micro_batch) + ", " +
           fmt(p.predicted.tokens_per_expert, 0);
  });
  auto b_a = [](const Plan& p) { return static_cast<double>(p.deployment.batch_per_micro_batch); };
  row("attn: per-token GEMM compute ms", [&](const Plan& p) {
    return ms(b_a(p) * p.deployment.stage.attention_curve.compute_per_token);
  });
  row("attn: weight streaming ms",
      [&](const Plan& p) { return ms(p.deployment.stage.attention_curve.weight); });
  row("attn: KV reads + collectives ms", [&](const Plan& p) {
    return ms(b_a(p) * p.deployment.stage.attention_curve.serial_per_token);
  });
  row("expert: per-token GEMM compute ms", [&](const Plan& p) {
    return ms(p.predicted.tokens_per_expert * p.deployment.stage.expert_curve.compute_per_token);
  });
  row("expert: weight streaming ms",
      [&](const Plan& p) { return ms(p.deployment.stage.expert_curve.weight); });
  row("expert: TP collective ms (overlapped)", [&](const Plan& p) {
    return ms(p.predicted.tokens_per_expert * p.deployment.stage.expert_curve.overlapped_per_token);
  });
  row("T_a / T_e / T_c ms (fitted k's)", [&](const Plan& p) {
    return fmt(p.predicted.t_attention * 1e3, 3) + " / " + fmt(p.predicted.t_expert * 1e3, 3) +
           " / " + fmt(p.predicted.t_comm * 1e3, 3);
  });
  row("KV + weights / capacity GB", [](const Plan& p) {
    return fmt(p.predicted.attention_memory_bytes / 1e9, 1) + " / " +
           fmt(p.predicted.attention_memory_capacity / 1e9, 1);
  });
  row("TBT ms / SLO ms", [&](const Plan& p) {
    return fmt(p.predicted.iteration * 1e3, 1) + " / " + fmt(o.slo * 1e3, 0);
  });
  row("binds", [](const Plan& p) { return p.binding; });
  row("cost units, watts", [](const Plan& p) {
    return fmt(p.deployment.cost(), 1) + ", " + fmt(p.deployment.power_w(), 0);
  });
  row(std::string("tok/s per ") + planner::objective_name(o.objective),
      [&](const Plan& p) { return fmt(p.predicted.objective(o.objective), 3); });
  return rows;
}

void print_explain(const planner::SearchOptions& o, const planner::SearchResult& r) {
  const Plan& best = r.plans.front();
  const Plan* runner = nullptr;
  for (const Plan& p : r.plans) {
    if (p.deployment.shape.attention_gpu.name != best.deployment.shape.attention_gpu.name ||
        p.deployment.shape.expert_gpu.name != best.deployment.shape.expert_gpu.name) {
      runner = &p;
      break;
    }
  }
  std::printf(
      "\nWhy this plan (per layer and micro-batch, at each plan's batch; GEMM time is "
      "max(compute, weights, overlapped collective) + serial + overhead):\n");
  std::vector<const Plan*> plans{&best};
  std::vector<std::string> header{"term", "chosen"};
  if (runner != nullptr) {
    plans.push_back(runner);
    header.push_back("runner-up GPU pair");
  } else {
    std::printf("(only one GPU pair was searched: no runner-up pair)\n");
  }
  Table t(header);
  for (auto& row : explain_rows(o, plans)) t.add_row(row);
  std::cout << t.to_string();
}

void print_human(const planner::SearchOptions& o, const planner::SearchResult& r, size_t top,
                 const std::vector<planner::SensitivityRow>* sens, double elapsed_ms) {
  const Plan& best = r.plans.front();
  const auto& d = best.deployment;
  std::printf("msinfer plan: %s (%d layers, %d experts, top-%d), SLO %.0f ms, objective %s\n",
              o.model.name.c_str(), o.model.layers, o.model.experts, o.model.top_k, o.slo * 1e3,
              planner::objective_name(o.objective));
  if (o.workload.name == "seq-len" || o.workload.name.empty()) {
    std::printf("workload: mean decode context %.1f tokens (--seq-len)\n", o.seq_len);
  } else {
    std::printf("workload: %s, input %.0f + output %.0f tokens, mean decode context %.1f\n",
                o.workload.name.c_str(), o.workload.input_len, o.workload.output_len, o.seq_len);
  }
  std::printf("stage model: %s; searched %zu GPU pair(s), %zu feasible plans, %lld batch "
              "evaluations in %.1f ms\n\n",
              d.stage.source.c_str(), o.gpu_pairs.size(), r.plans.size(),
              static_cast<long long>(r.evaluated), elapsed_ms);
  // The verdict first: a co-located bound that beats every disaggregated plan
  // under the same objective is the recommendation.
  const planner::Verdict v = planner::verdict(r, o.objective);
  const char* per = o.objective == planner::Objective::kCost  ? "per cost unit"
                    : o.objective == planner::Objective::kGpu ? "per GPU"
                                                              : "per watt";
  if (v.colocated_wins) {
    const planner::Baseline& b = r.baselines[v.best_baseline];
    std::printf("Best plan: co-located %s, not disaggregation: %.2fx the best disaggregated "
                "plan's tokens/s %s\n",
                b.name.c_str(), 1.0 / v.ratio, per);
    std::printf("  %s\n", b.description.c_str());
    std::printf("  %d GPUs, batch %lld, %.1f tokens/s per GPU, %.1f per cost unit, %.3f per W, "
                "TBT %.1f ms\n\n",
                b.gpus, static_cast<long long>(b.batch), b.per_gpu, b.per_cost, b.per_watt,
                b.iteration * 1e3);
    std::printf("Best disaggregated plan (%.2fx of the co-located one): %s, global batch %lld "
                "(b_a = %lld per micro-batch)\n",
                v.ratio, planner::shape_summary(d).c_str(),
                static_cast<long long>(d.global_batch()),
                static_cast<long long>(d.batch_per_micro_batch));
  } else {
    std::printf("Best plan: %s, global batch %lld (b_a = %lld per micro-batch)\n",
                planner::shape_summary(d).c_str(), static_cast<long long>(d.global_batch()),
                static_cast<long long>(d.batch_per_micro_batch));
    if (v.best_baseline >= 0) {
      std::printf("  disaggregated: %.2fx the best co-located bound (%s) in tokens/s %s\n",
                  v.ratio, r.baselines[v.best_baseline].name.c_str(), per);
    } else {
      std::printf("  disaggregated: no co-located deployment fits these GPUs under the SLO\n");
    }
  }
  std::printf("  %d GPUs, %.0f tokens/s, %.1f tokens/s per GPU, %.1f per cost unit, TBT %.1f ms\n",
              d.gpus(), best.predicted.throughput, best.predicted.per_gpu,
              best.predicted.per_cost, best.predicted.iteration * 1e3);
  std::printf("  k1 = %.4g ms/token, k2 = %.4g ms, k3 = %.4g ms/token, k4 = %.4g ms; "
              "overlap %s (m >= %d needed); binds: %s\n",
              d.stage.k1 * 1e3, d.stage.k2 * 1e3, d.stage.k3 * 1e3, d.stage.k4 * 1e3,
              best.predicted.full_overlap ? "full" : "partial", best.predicted.min_micro_batches,
              best.binding.c_str());

  if (o.model.shared_expert_ffn > 0 || o.model.layers > o.model.moe_layers) {
    std::string where;
    if (o.model.shared_expert_ffn > 0) {
      where = "shared experts (" + std::to_string(o.model.shared_expert_ffn) +
              " wide per MoE layer)";
    }
    if (o.model.layers > o.model.moe_layers) {
      where += (where.empty() ? "" : " and ") +
               std::to_string(o.model.layers - o.model.moe_layers) + " dense layers of " +
               std::to_string(o.model.layers);
    }
    std::printf(
        "  %s run on the attention nodes in this prediction\n"
        "  (the runtime's --shared-experts expert moves the shared experts to the expert\n"
        "  nodes; not modelled here)\n",
        where.c_str());
  }
  if (d.experts_per_node() > 1) {
    std::printf("  %d experts per expert node: %.0f rows per node per micro-batch; busiest node "
                "%.2fx the mean under uniform random routing (not charged: balanced load "
                "assumed)\n",
                d.experts_per_node(), best.predicted.rows_per_expert_node,
                best.predicted.expert_node_imbalance);
  }
  std::printf("\n");
  Table t({"#", "attention", "experts", "m", "B", "b_e", "TBT ms", "T_a ms", "T_e ms", "T_c ms",
           "tok/s", "tok/s/GPU", "tok/s/cost", "tok/s/W", "GEMM util", "binds"});
  for (size_t i = 0; i < r.plans.size() && i <= top; ++i) t.add_row(plan_cells(r.plans[i], i + 1));
  std::cout << t.to_string() << "\n";
  std::cout << "Baselines: ideal co-located bounds under the same efficiency factors (roofline "
               "GEMMs, whole-batch hierarchical all-reduce, no stragglers), not models of "
               "particular serving systems.\n";
  Table b({"baseline", "configuration", "GPUs", "batch", "TBT ms", "tok/s/GPU", "tok/s/cost",
           "tok/s/W", "plan gain"});
  for (const auto& x : r.baselines) {
    b.add_row({x.name, x.description, std::to_string(x.gpus), std::to_string(x.batch),
               fmt(x.iteration * 1e3, 1), fmt(x.per_gpu, 1), fmt(x.per_cost, 1),
               fmt(x.per_watt, 3),
               fmt(best.predicted.objective(o.objective) / x.objective(o.objective), 2) + "x"});
  }
  if (r.baselines.empty()) {
    std::cout << "No co-located baseline fits these GPUs under the SLO.\n";
  } else {
    std::cout << b.to_string();
  }
  if (sens) {
    std::cout << "\nSensitivity (each parameter moved alone; the chosen shape keeps its batch "
                 "re-searched):\n";
    Table s({"parameter", "factor", "plan changes", "best plan then", "chosen plan loses"});
    for (const auto& row : *sens) {
      s.add_row({row.parameter, fmt(row.factor, 2), row.plan_changed ? "yes" : "no", row.new_plan,
                 row.original_feasible ? fmt_pct(row.original_loss) : "infeasible"});
    }
    std::cout << s.to_string();
  }
}

}  // namespace

int run_plan(int argc, char** argv) {
  FlagSet flags("plan",
                "Searches tp_attention, tp_expert, attention nodes n_a, micro-batches m and the\n"
                "global batch B for the deployment with the best throughput per cost under a\n"
                "time-between-tokens SLO (docs/PLANNER.md section 4), and predicts two co-located\n"
                "baselines with the same model.");
  add_search_flags(flags);
  flags.add_int("top", 5, 0, 1000, "alternatives shown after the best plan");
  flags.add_bool("sensitivity", "re-plan with each price and k1/k3 moved by +-20%");
  flags.add_bool("explain",
                 "show the terms (compute, weight streaming, collectives, T_c, KV memory, SLO) "
                 "that decide between the chosen plan and the best plan of another GPU pair");
  flags.add_bool("json", "print one JSON object (docs/PLANNER.md section 7) instead of tables");
  flags.add_string("out", "", "write the plan document to this file (for simulate / serve)");
  flags.set_epilog(
      "examples:\n"
      "  msinfer plan --model mixtral-8x22b --gpu A100\n"
      "  msinfer plan --model dbrx --gpu H20 --expert-gpu L40S --objective power\n"
      "  msinfer plan --model mixtral-8x22b --hetero --gpus L20,L40S,H20,A800,H800 --json\n"
      "  msinfer plan --model path/to/config.json --gpu H800 --max-gpus 64 --out plan.json");
  Status s = flags.parse(argc, argv, 2);
  if (!s.ok()) return report_error("plan", s);
  if (flags.help_requested()) {
    std::cout << flags.usage();
    return 0;
  }
  if (!flags.positional().empty()) {
    return report_error("plan", invalid_argument("unexpected argument '" +
                                                 flags.positional().front() + "'"));
  }
  if (!flags.get_string("out").empty()) {
    s = check_output_path("--out", flags.get_string("out"));
    if (!s.ok()) return report_error("plan", s);
  }
  auto setup = search_setup_from_flags(flags);
  if (!setup.ok()) return report_error("plan", setup.status());
  const planner::SearchOptions& o = setup->options;
  auto t0 = std::chrono::steady_clock::now();
  auto result = planner::search_plans(o);
  if (!result.ok()) return report_error("plan", result.status());
  std::vector<planner::SensitivityRow> sens;
  if (flags.get_bool("sensitivity")) {
    auto rows = planner::sensitivity(o, result->plans.front());
    if (!rows.ok()) return report_error("plan", rows.status());
    sens = std::move(rows).value();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const size_t top = static_cast<size_t>(flags.get_int("top"));
  Json doc = planner::plan_document(o, *result, top);
  if (flags.get_bool("sensitivity")) doc["sensitivity"] = planner::sensitivity_to_json(sens);
  doc["search"]["elapsed_ms"] = ms;
  for (const char* k : {"plan", "predicted", "alternatives", "baselines", "stage_model"}) {
    s = check_figures(doc[k], /*non_negative=*/true, "plan: " + std::string(k));
    if (!s.ok()) return report_error("plan", s);
  }
  if (!flags.get_string("out").empty()) {
    Status w = write_json_file(flags.get_string("out"), doc);
    if (!w.ok()) return report_error("plan", w.with_context("--out"));
  }
  if (flags.get_bool("json")) {
    std::cout << doc.dump(2) << "\n";
  } else {
    print_human(o, *result, top, flags.get_bool("sensitivity") ? &sens : nullptr, ms);
    if (flags.get_bool("explain")) print_explain(o, *result);
    if (!flags.get_string("out").empty()) {
      std::printf("\nplan written to %s\n", flags.get_string("out").c_str());
    }
  }
  return 0;
}

}  // namespace msinfer::cli
