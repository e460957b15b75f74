// msinfer plan: search the deployment with the best throughput per cost (or per
// GPU, per watt) under a TBT SLO, and compare it with co-located baselines.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "msinfer/core/table.h"
#include "msinfer/planner/cpu_plan.h"
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

const char* const kCpuOnlyFlags[] = {"cores",
                                     "memory-gb",
                                     "max-batch",
                                     "kv-cache-mb",
                                     "attention-workers",
                                     "expert-workers",
                                     "micro-batches",
                                     "tp-expert",
                                     "attention-threads",
                                     "expert-threads",
                                     "batch-per-micro-batch",
                                     "global-fit"};

std::vector<std::string> cpu_plan_cells(const planner::CpuPlan& p, size_t rank) {
  const auto& d = p.deployment;
  const auto& q = p.predicted;
  return {std::to_string(rank),
          std::to_string(d.attention_workers) + " x" + std::to_string(d.attention_threads) + "t",
          std::to_string(d.expert_workers) +
              (d.tp_expert > 1 ? " tp" + std::to_string(d.tp_expert) : std::string()) + " x" +
              std::to_string(d.expert_threads) + "t",
          std::to_string(d.micro_batches),
          std::to_string(d.batch_per_micro_batch),
          std::to_string(d.global_batch()),
          fmt(q.tbt * 1e3, 1),
          fmt(q.t_attention * 1e3, 3),
          fmt(q.t_expert * 1e3, 3),
          fmt(q.t_comm * 1e3, 3),
          fmt(q.t_head * 1e3, 2),
          fmt(q.cpu_bound * 1e3, 1),
          fmt(q.throughput, 1),
          q.binds};
}

// msinfer plan --devices cpu: the search of docs/PLANNER.md section 8.
int run_cpu_plan(const FlagSet& flags) {
  for (const char* f : {"gpu", "expert-gpu", "hetero", "gpus", "catalog", "max-gpus", "objective",
                        "sensitivity", "explain", "seq-len"}) {
    if (flags.was_set(f)) {
      return report_error(
          "plan",
          invalid_argument(std::string("--") + f + " is not for --devices cpu" +
                           (std::string(f) == "seq-len" ? " (give --input-len and --output-len: "
                                                          "the plan runs them)"
                                                        : "")));
    }
  }
  if (flags.get_string("profile").empty()) {
    return report_error("plan", invalid_argument("--devices cpu needs --profile (msinfer profile "
                                                 "--out, then bench m2n --profile-into)"));
  }
  if (flags.get_string("model").empty()) {
    return report_error("plan", invalid_argument("--model is required (a model directory or "
                                                 "config.json)"));
  }
  planner::CpuSearchOptions o;
  auto model = load_model_config(flags.get_string("model"));
  if (!model.ok()) return report_error("plan", model.status());
  o.model = *model;
  auto j = read_json_file(flags.get_string("profile"));
  if (!j.ok()) return report_error("plan", j.status().with_context("--profile"));
  auto prof = planner::parse_cpu_profile(*j, flags.get_string("profile"));
  if (!prof.ok()) return report_error("plan", prof.status().with_context("--profile"));
  o.profile = *prof;
  planner::SearchOptions w;
  Status s = apply_workload_flags(flags, &w);
  if (!s.ok()) return report_error("plan", s);
  o.workload = w.workload;
  if (w.max_context > o.model.max_position_embeddings && o.model.max_position_embeddings > 0) {
    return report_error(
        "plan", invalid_argument("the workload reaches a context of " + fmt(w.max_context, 0) +
                                 " tokens; the model "
                                 "holds at most " +
                                 std::to_string(o.model.max_position_embeddings)));
  }
  o.cores = flags.was_set("cores") ? static_cast<int>(flags.get_int("cores")) : o.profile.cores;
  if (o.cores < 1) {
    return report_error("plan", invalid_argument(flags.get_string("profile") +
                                                 " does not record the machine's cores: give "
                                                 "--cores"));
  }
  o.memory_bytes =
      flags.was_set("memory-gb") ? flags.get_double("memory-gb") * 1e9 : o.profile.memory_bytes;
  o.slo = flags.get_double("slo-ms") * 1e-3;
  o.max_micro_batches = std::min<int>(static_cast<int>(flags.get_int("max-micro-batches")), 16);
  o.max_batch = flags.get_int("max-batch");
  o.kv_cache_mb = flags.get_int("kv-cache-mb");
  o.local_fit = !flags.get_bool("global-fit");
  o.attention_workers = static_cast<int>(flags.get_int("attention-workers"));
  o.expert_workers = static_cast<int>(flags.get_int("expert-workers"));
  o.micro_batches = static_cast<int>(flags.get_int("micro-batches"));
  o.tp_expert = static_cast<int>(flags.get_int("tp-expert"));
  o.attention_threads = static_cast<int>(flags.get_int("attention-threads"));
  o.expert_threads = static_cast<int>(flags.get_int("expert-threads"));
  o.batch_per_micro_batch = flags.get_int("batch-per-micro-batch");
  auto plans = planner::search_cpu_plans(o);
  if (!plans.ok()) return report_error("plan", plans.status());
  const size_t top = static_cast<size_t>(flags.get_int("top"));
  Json doc = planner::cpu_plan_document(o, *plans, top);
  for (const char* k : {"plan", "predicted", "alternatives"}) {
    s = check_figures(doc[k], /*non_negative=*/true, "plan: " + std::string(k));
    if (!s.ok()) return report_error("plan", s);
  }
  if (!flags.get_string("out").empty()) {
    Status wr = write_json_file(flags.get_string("out"), doc);
    if (!wr.ok()) return report_error("plan", wr.with_context("--out"));
  }
  if (flags.get_bool("json")) {
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  const auto& best = plans->front();
  std::printf(
      "msinfer plan --devices cpu: %s (%d layers, %d experts, top-%d) on %d cores, "
      "input %.0f + output %.0f tokens, SLO %.0f ms\n",
      o.model.name.c_str(), o.model.layers, o.model.experts, o.model.top_k, o.cores,
      o.workload.input_len, o.workload.output_len, o.slo * 1e3);
  std::printf(
      "profile %s: %d thread(s), context %.0f, %s weights; %s k's; objective: decode "
      "tokens/s of the machine\n",
      o.profile.source.c_str(), o.profile.threads, o.profile.seq_len, o.profile.weights.c_str(),
      o.local_fit ? "local" : "global");
  if (o.profile.seq_len > 0 && std::fabs(o.profile.seq_len - o.workload.mean_decode_context()) >
                                   0.25 * o.workload.mean_decode_context()) {
    std::printf(
        "note: the profile measured attention at context %.0f, the workload's mean is "
        "%.1f: k1 reads the KV of the profile's context\n",
        o.profile.seq_len, o.workload.mean_decode_context());
  }
  if (!o.profile.has_head) {
    std::printf(
        "note: the profile has no head_ms terms (written before them): the LM head per "
        "step is not counted\n");
  }
  if (!o.profile.nic_bandwidth) {
    std::printf(
        "note: the profile has no transport figures (bench m2n --profile-into): T_c "
        "taken as 0\n");
  }
  const auto& d = best.deployment;
  std::printf(
      "\nBest plan: %d attention worker(s) x %d thread(s) + %d expert worker(s)%s x %d "
      "thread(s) (%d experts each), m = %d, b_a = %lld, global batch %lld\n",
      d.attention_workers, d.attention_threads, d.expert_workers,
      d.tp_expert > 1 ? (" of tp " + std::to_string(d.tp_expert)).c_str() : "", d.expert_threads,
      o.model.experts / d.expert_workers, d.micro_batches,
      static_cast<long long>(d.batch_per_micro_batch), static_cast<long long>(d.global_batch()));
  std::printf(
      "  %.1f decode tokens/s, TBT %.1f ms (layers %.1f + head %.2f; the cores' work "
      "alone %.1f ms)%s; binds: %s\n\n",
      best.predicted.throughput, best.predicted.tbt * 1e3, best.predicted.layers_time * 1e3,
      best.predicted.t_head * 1e3, best.predicted.cpu_bound * 1e3,
      best.predicted.shares_cores ? "; workers share cores" : "", best.predicted.binds.c_str());
  Table t({"#", "attention", "experts", "m", "b_a", "B", "TBT ms", "T_a ms", "T_e ms", "T_c ms",
           "head ms", "CPU ms", "tok/s", "binds"});
  for (size_t i = 0; i < plans->size() && i <= top; ++i) {
    t.add_row(cpu_plan_cells((*plans)[i], i + 1));
  }
  std::cout << t.to_string();
  if (!flags.get_string("out").empty()) {
    std::printf("\nplan written to %s\n", flags.get_string("out").c_str());
  }
  return 0;
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
  flags.add_string("devices", "gpu",
                   "gpu: GPU deployments from the catalogue (or --profile); cpu: msinfer's own\n"
                   "CPU workers on this machine from a --profile measured here (docs/PLANNER.md\n"
                   "section 8); its plan runs under `bench serve --offline --plan`");
  // --devices cpu only (docs/PLANNER.md section 8).
  flags.add_int("cores", 0, 0, 4096, "cpu: cores of the machine (0: the profile's)");
  flags.add_double("memory-gb", 0, 0, 1e6, "cpu: memory of the machine (0: the profile's)");
  flags.add_int("max-batch", 256, 1, 1 << 24, "cpu: largest global batch (requests in flight)");
  flags.add_int("kv-cache-mb", 256, 1, 1 << 20,
                "cpu: KV budget of one attention worker (the runtime's --kv-cache-mb)");
  flags.add_int("attention-workers", 0, 0, 128, "cpu: fix the attention workers (0: searched)");
  flags.add_int("expert-workers", 0, 0, 128, "cpu: fix the expert workers (0: searched)");
  flags.add_int("micro-batches", 0, 0, 16, "cpu: fix m (0: searched up to --max-micro-batches)");
  flags.add_int("tp-expert", 0, 0, 128, "cpu: fix the shards per expert worker (0: searched)");
  flags.add_int("attention-threads", 0, 0, 4096, "cpu: fix threads per attention worker");
  flags.add_int("expert-threads", 0, 0, 4096, "cpu: fix threads per expert worker process");
  flags.add_int("batch-per-micro-batch", 0, 0, 1 << 24, "cpu: fix b_a (0: largest that holds)");
  flags.add_bool("global-fit",
                 "cpu: use the profile's k1..k4 fitted over all its points instead of the line\n"
                 "through the measured points around the plan's batch");
  flags.set_epilog(
      "examples:\n"
      "  msinfer plan --model mixtral-8x22b --gpu A100\n"
      "  msinfer plan --model dbrx --gpu H20 --expert-gpu L40S --objective power\n"
      "  msinfer plan --model mixtral-8x22b --hetero --gpus L20,L40S,H20,A800,H800 --json\n"
      "  msinfer plan --model path/to/config.json --gpu H800 --max-gpus 64 --out plan.json");
  if (auto done = parse_command_line(flags, "plan", argc, argv, 2)) return *done;
  Status s;
  if (!flags.get_string("out").empty()) {
    s = check_output_path("--out", flags.get_string("out"));
    if (!s.ok()) return report_error("plan", s);
  }
  const std::string devices = flags.get_string("devices");
  if (devices == "cpu") return run_cpu_plan(flags);
  if (devices != "gpu") {
    return report_error("plan",
                        invalid_argument("--devices: expected gpu or cpu, got '" + devices + "'"));
  }
  for (const char* f : kCpuOnlyFlags) {
    if (flags.was_set(f)) {
      return report_error("plan", invalid_argument(std::string("--") + f +
                                                   " plans CPU workers: give --devices cpu"));
    }
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
