// msinfer simulate: play a plan forward event by event and report throughput,
// TBT percentiles, busy fractions and bubbles; draw a Gantt chart; sweep n_a or m.
#include <cstdint>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "msinfer/core/table.h"
#include "msinfer/planner/simulator.h"
#include "msinfer/runtime/balance.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

// Largest zipf exponent: beyond it all but the first experts get no tokens at
// all (1e4 used to print -nan for every figure).
constexpr double kMaxZipf = 16;

Status parse_imbalance(const std::string& s, double* zipf_s) {
  if (s.empty() || s == "none") {
    *zipf_s = 0;
    return ok_status();
  }
  if (s.rfind("zipf:", 0) != 0) {
    return invalid_argument("--imbalance: expected zipf:S (e.g. zipf:1.2), got '" + s + "'");
  }
  FlagSet one("simulate", "");
  one.add_double("imbalance", 0, 0, kMaxZipf, "");
  if (!one.parse({"--imbalance=" + s.substr(5)}).ok()) {
    return invalid_argument("--imbalance: zipf:S needs a number S in 0 .. 16, got '" + s + "'");
  }
  *zipf_s = one.get_double("imbalance");
  return ok_status();
}

// --placement FILE (msinfer balance's JSON): per expert worker, the fraction of
// all routed rows each replica it holds computes, an expert's rows split over
// its replicas by share (as runtime::predicted_worker_loads does). Expert
// loads from --routing FILE (measured: a generate / bench serve --json answer
// or a routing document), else the --imbalance Zipf shares.
StatusOr<std::vector<std::vector<double>>> placement_node_shares(const FlagSet& flags,
                                                                 const planner::Deployment& d,
                                                                 double zipf_s) {
  const int E = d.model.experts;
  std::vector<double> load = planner::zipf_expert_shares(E, d.model.top_k, zipf_s);
  if (const std::string& path = flags.get_string("routing"); !path.empty()) {
    MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
    MSI_ASSIGN_OR_RETURN(runtime::RoutingStats rs, runtime::RoutingStats::from_json(j, path));
    if (rs.experts != E) {
      return invalid_argument(path + ": routing of " + std::to_string(rs.experts) +
                              " experts; the model has " + std::to_string(E));
    }
    load = rs.expert_totals();
    double total = 0;
    for (double v : load) total += v;
    if (!(total > 0)) return invalid_argument(path + ": no routed rows");
    for (double& v : load) v /= total;
  }
  std::vector<std::vector<double>> nodes;
  const std::string& path = flags.get_string("placement");
  if (path.empty()) {
    for (int e = 0; e < E; ++e) nodes.push_back({load[e]});
    return nodes;
  }
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  MSI_ASSIGN_OR_RETURN(runtime::Placement p, runtime::Placement::from_json(j, E, path));
  nodes.resize(p.workers);
  for (int e = 0; e < E; ++e) {
    double total = 0;
    for (const auto& [w, share] : p.replicas[e]) total += share;
    for (const auto& [w, share] : p.replicas[e]) nodes[w].push_back(load[e] * share / total);
  }
  return nodes;
}

// The deployment to simulate and the TBT SLO it is checked against: --slo-ms
// when given, else the plan document's search.slo_ms, else --slo-ms's default.
StatusOr<planner::Deployment> deployment_from_flags(const FlagSet& flags, double* slo) {
  planner::Deployment d;
  *slo = flags.get_double("slo-ms") * 1e-3;
  if (!flags.get_string("plan").empty()) {
    for (const char* f : {"model", "gpu", "expert-gpu", "gpus", "profile", "workload", "input-len",
                          "output-len", "seq-len"}) {
      if (flags.was_set(f)) {
        return invalid_argument(std::string("--") + f + " conflicts with --plan (the plan fixes it)");
      }
    }
    const std::string& path = flags.get_string("plan");
    MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
    MSI_ASSIGN_OR_RETURN(d, planner::deployment_from_plan_document(j, path));
    if (!flags.was_set("slo-ms") && j.is_object() && j.contains("search") &&
        j["search"].is_object() && j["search"].contains("slo_ms") &&
        j["search"]["slo_ms"].is_number() && j["search"]["slo_ms"].get<double>() > 0) {
      *slo = j["search"]["slo_ms"].get<double>() * 1e-3;
    }
  } else {
    MSI_ASSIGN_OR_RETURN(SearchSetup setup, search_setup_from_flags(flags));
    MSI_ASSIGN_OR_RETURN(planner::SearchResult r, planner::search_plans(setup.options));
    d = r.plans.front().deployment;
  }
  // Ranges checked by the flag parser; 0 keeps the plan's value.
  if (flags.get_int("attention-nodes") > 0) {
    d.attention_nodes = static_cast<int>(flags.get_int("attention-nodes"));
  }
  if (flags.get_int("micro-batches") > 0) {
    d.micro_batches = static_cast<int>(flags.get_int("micro-batches"));
  }
  if (flags.get_int("batch-per-micro-batch") > 0) {
    d.batch_per_micro_batch = flags.get_int("batch-per-micro-batch");
  }
  return d;
}

void print_result(const planner::Deployment& d, const planner::SimResult& r,
                  const planner::Prediction& p, const planner::SimOptions& o) {
  std::printf("msinfer simulate: %s, %s, b_a = %lld (global batch %lld), %d iterations, "
              "jitter %.1f%%, zipf %.2f\n\n",
              d.model.name.c_str(), planner::shape_summary(d).c_str(),
              static_cast<long long>(d.batch_per_micro_batch),
              static_cast<long long>(d.global_batch()), o.iterations, o.jitter * 100, o.zipf_s);
  Table t({"metric", "closed form", "simulated"});
  t.add_row({"throughput (tokens/s)", fmt(p.throughput, 0), fmt(r.throughput, 0)});
  t.add_row({"per GPU (tokens/s)", fmt(p.per_gpu, 1), fmt(r.per_gpu, 1)});
  t.add_row({"per cost unit (tokens/s)", fmt(p.per_cost, 1), fmt(r.per_cost, 1)});
  t.add_row({"TBT mean (ms)", fmt(p.iteration * 1e3, 2), fmt(r.tbt_mean * 1e3, 2)});
  t.add_row({"TBT p50 (ms)", "", fmt(r.tbt_p50 * 1e3, 2)});
  t.add_row({"TBT p99 (ms)", "", fmt(r.tbt_p99 * 1e3, 2)});
  t.add_row({"T_a (ms)", fmt(p.t_attention * 1e3, 3), fmt(r.t_attention * 1e3, 3)});
  t.add_row({"T_e (ms)", fmt(p.t_expert * 1e3, 3), fmt(r.t_expert * 1e3, 3)});
  t.add_row({"T_c (ms)", fmt(p.t_comm * 1e3, 3), fmt(r.t_comm * 1e3, 3)});
  t.add_row({"attention busy", "", fmt_pct(r.attention_busy)});
  t.add_row({"expert busy (mean / max)", "",
             fmt_pct(r.expert_busy) + " / " + fmt_pct(r.expert_busy_max)});
  t.add_row({"attention NIC busy", "", fmt_pct(r.attention_nic_busy)});
  t.add_row({"attention bubble (ms/iter)", "", fmt(r.attention_bubble * 1e3, 2)});
  t.add_row({"expert bubble (ms/iter)", "", fmt(r.expert_bubble * 1e3, 2)});
  std::cout << t.to_string();
  std::printf("\nfull overlap (docs/PLANNER.md 3b, m >= %d and T_c < T_f): %s\n", p.min_micro_batches,
              p.full_overlap ? "yes" : "no");
}

void add_simulate_flags(FlagSet& flags) {
  flags.add_string("plan", "", "plan document written by `msinfer plan --out`");
  add_search_flags(flags);
  flags.add_int("attention-nodes", 0, 0, 4096, "override the plan's attention nodes n_a (0: keep)");
  flags.add_int("micro-batches", 0, 0, 64, "override the plan's micro-batches m (0: keep)");
  flags.add_int("batch-per-micro-batch", 0, 0, 1000000, "override the plan's b_a (0: keep)");
  flags.add_int("iterations", 8, 1, 100000, "decoding iterations to simulate");
  flags.add_double("jitter", 0, 0, 99, "percent: scale every duration by a seeded U[1-p, 1+p]");
  flags.add_string("imbalance", "none", "per-expert load skew: none | zipf:S (S in 0 .. 16)");
  flags.add_string("placement", "",
                   "expert placement with replicas (msinfer balance --out): expert nodes hold\n"
                   "its replicas, an expert's rows split over them by share");
  flags.add_string("routing", "",
                   "expert loads measured by a run (generate / bench serve --json, or its\n"
                   "\"routing\" document) instead of --imbalance");
  flags.add_int("seed", 1, 0, INT64_MAX, "random seed for --jitter");
  flags.add_string("gantt", "", "write an SVG timeline of the first iterations");
  flags.add_int("gantt-iterations", 1, 1, 64, "iterations drawn by --gantt");
  flags.add_int("gantt-layers", 6, 0, 4096, "layers of each iteration drawn by --gantt (0: all)");
  flags.add_string("sweep", "",
                   "attention-nodes=FROM..TO or micro-batches=FROM..TO (b_a held fixed)");
  flags.add_string("plot", "", "with --sweep: write an SVG chart of tokens/s per GPU and TBT");
  flags.add_bool("json", "print one JSON object instead of tables");
  flags.set_epilog(
      "examples:\n"
      "  msinfer plan --model mixtral-8x22b --gpu A100 --out plan.json\n"
      "  msinfer simulate --plan plan.json --gantt gantt.svg\n"
      "  msinfer simulate --plan plan.json --imbalance zipf:1.2 --jitter 5\n"
      "  msinfer simulate --plan plan.json --routing run.json --placement balanced.json\n"
      "  msinfer simulate --plan plan.json --sweep attention-nodes=1..16 --plot sweep.svg");
}

// --sweep: the deployment at each value of the swept parameter, b_a held
// fixed; every point marked as holding its constraints or not.
int run_sweep(const FlagSet& flags, const planner::Deployment& d, planner::SweepParameter param,
              int from, int to, const planner::SimOptions& o, double slo) {
  Status s;
  Progress progress("simulate");
  auto rows = planner::sweep(d, param, from, to, o, [&](int v) {
    progress.update("--sweep at " + std::to_string(v) + " of " + std::to_string(from) + ".." +
                    std::to_string(to));
  });
  if (!rows.ok()) return report_error("simulate", rows.status());
  if (!flags.get_string("plot").empty()) {
    s = planner::write_sweep_svg(param, *rows, flags.get_string("plot"));
    if (!s.ok()) return report_error("simulate", s.with_context("--plot"));
  }
  if (flags.get_bool("json")) {
    Json out{{"parameter", planner::sweep_parameter_name(param)},
             {"batch_per_micro_batch", d.batch_per_micro_batch},
             {"slo_ms", slo * 1e3},
             {"base_plan", planner::deployment_plan_json(d)}};
    Json list = Json::array();
    for (const auto& row : *rows) {
      Json j = row.sim.to_json();
      const planner::Feasibility f = planner::check_deployment(row.deployment, slo);
      j["feasible"] = f.ok();
      j["violated"] = f.violated();
      j["constraints"] = f.to_json();
      j["attention_nodes"] = row.deployment.attention_nodes;
      j["micro_batches"] = row.deployment.micro_batches;
      j["global_batch"] = row.deployment.global_batch();
      j["gpus"] = row.deployment.gpus();
      j["tbt_closed_form_ms"] = row.closed_form.iteration * 1e3;
      list.push_back(j);
    }
    out["sweep"] = list;
    s = check_figures(list, /*non_negative=*/true, "simulate --sweep");
    if (!s.ok()) return report_error("simulate", s);
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  for (const auto& row : *rows) {
    s = check_figures(row.sim.to_json(), true, "simulate --sweep");
    if (s.ok()) s = check_figures(row.closed_form.to_json(), true, "simulate --sweep");
    if (!s.ok()) return report_error("simulate", s);
  }
  std::printf("msinfer simulate --sweep %s: %s, b_a = %lld held fixed\n\n",
              flags.get_string("sweep").c_str(), planner::shape_summary(d).c_str(),
              static_cast<long long>(d.batch_per_micro_batch));
  Table t({planner::sweep_parameter_name(param), "GPUs", "B", "tok/s", "tok/s/GPU", "tok/s/cost",
           "TBT ms", "TBT p99 ms", "closed-form TBT", "attn busy", "expert busy", "holds"});
  int broken = 0;
  for (const auto& row : *rows) {
    const planner::Feasibility f = planner::check_deployment(row.deployment, slo);
    broken += f.ok() ? 0 : 1;
    t.add_row({std::to_string(row.value), std::to_string(row.deployment.gpus()),
               std::to_string(row.deployment.global_batch()), fmt(row.sim.throughput, 0),
               fmt(row.sim.per_gpu, 1), fmt(row.sim.per_cost, 1), fmt(row.sim.tbt_mean * 1e3, 2),
               fmt(row.sim.tbt_p99 * 1e3, 2), fmt(row.closed_form.iteration * 1e3, 2),
               fmt_pct(row.sim.attention_busy), fmt_pct(row.sim.expert_busy),
               f.ok() ? "yes" : "NO: " + f.violated()});
  }
  std::cout << t.to_string();
  if (broken > 0) {
    std::printf(
        "\n%d of %zu points break a constraint (SLO %.0f ms, memory, context length "
        "or batch bound): their figures are not achievable deployments\n",
        broken, rows->size(), slo * 1e3);
  }
  if (!flags.get_string("plot").empty()) {
    std::printf("\nchart written to %s\n", flags.get_string("plot").c_str());
  }
  return 0;
}

// One simulated run of the deployment, with the closed form beside it.
int run_single(const FlagSet& flags, const planner::Deployment& d, planner::SimOptions o,
               double slo) {
  Status s;
  Progress progress("simulate");
  o.progress = [&](double done) {
    progress.update(std::to_string(static_cast<int>(done * 100)) + "% of the jobs simulated");
  };
  auto r = planner::simulate(d, o);
  if (!r.ok()) return report_error("simulate", r.status());
  const planner::Prediction p = planner::predict(d);
  s = check_figures(r->to_json(), /*non_negative=*/true, "simulate");
  if (s.ok()) s = check_figures(p.to_json(), true, "simulate: closed form");
  if (s.ok()) s = check_figures(Json(r->expert_load_share), true, "simulate: expert load share");
  if (!s.ok()) return report_error("simulate", s);
  if (!flags.get_string("gantt").empty()) {
    s = planner::write_gantt_svg(d, *r, flags.get_string("gantt"));
    if (!s.ok()) return report_error("simulate", s.with_context("--gantt"));
  }
  if (flags.get_bool("json")) {
    Json shares = r->expert_load_share;
    Json out{{"plan", planner::deployment_plan_json(d)},
             {"predicted", r->to_json()},
             {"closed_form", p.to_json()},
             {"full_overlap", p.full_overlap},
             {"constraints", planner::check_deployment(d, slo).to_json()},
             {"expert_load_share", shares},
             {"options",
              {{"iterations", o.iterations},
               {"jitter_pct", o.jitter * 100},
               {"zipf_s", o.zipf_s},
               {"seed", o.seed}}}};
    std::cout << out.dump(2) << "\n";
  } else {
    print_result(d, *r, p, o);
    if (!flags.get_string("gantt").empty()) {
      std::printf("Gantt chart written to %s\n", flags.get_string("gantt").c_str());
    }
  }
  return 0;
}

}  // namespace

int run_simulate(int argc, char** argv) {
  FlagSet flags("simulate",
                "Discrete-event simulation of a disaggregated deployment: attention compute,\n"
                "M2N transfer, expert compute and N2M transfer as jobs queueing for each worker\n"
                "and each NIC direction. Takes --plan plan.json, or the flags of `msinfer plan`\n"
                "(and simulates the best plan they find).");
  add_simulate_flags(flags);
  if (auto done = parse_command_line(flags, "simulate", argc, argv, 2)) return *done;
  Status s;
  planner::SimOptions o;
  o.iterations = static_cast<int>(flags.get_int("iterations"));
  o.jitter = flags.get_double("jitter") / 100.0;
  o.seed = static_cast<uint64_t>(flags.get_int("seed"));
  o.gantt_iterations =
      flags.get_string("gantt").empty() ? 0 : static_cast<int>(flags.get_int("gantt-iterations"));
  if (flags.get_int("gantt-layers") > 0) {
    o.gantt_layers = static_cast<int>(flags.get_int("gantt-layers"));
  }
  s = parse_imbalance(flags.get_string("imbalance"), &o.zipf_s);
  if (!s.ok()) return report_error("simulate", s);
  if (!flags.get_string("plot").empty() && flags.get_string("sweep").empty()) {
    return report_error("simulate", invalid_argument("--plot needs --sweep"));
  }
  if (!flags.get_string("sweep").empty() && !flags.get_string("gantt").empty()) {
    return report_error("simulate",
                        invalid_argument("--gantt draws one run; it cannot go with --sweep"));
  }
  for (const char* f : {"gantt", "plot"}) {
    if (flags.get_string(f).empty()) continue;
    s = check_output_path(std::string("--") + f, flags.get_string(f));
    if (!s.ok()) return report_error("simulate", s);
  }
  planner::SweepParameter param = planner::SweepParameter::kAttentionNodes;
  int from = 0, to = 0;
  if (!flags.get_string("sweep").empty()) {
    s = planner::parse_sweep(flags.get_string("sweep"), &param, &from, &to);
    if (!s.ok()) return report_error("simulate", s);
  }
  double slo = 0;
  auto d = deployment_from_flags(flags, &slo);
  if (!d.ok()) return report_error("simulate", d.status());
  // One point the user asked for (a plan, maybe with overrides) must hold:
  // memory, SLO, context length and the batch bound. A sweep marks its points.
  if (flags.get_string("sweep").empty()) {
    const planner::Feasibility f = planner::check_deployment(*d, slo);
    if (!f.ok()) {
      std::string why;
      for (const auto& reason : f.reasons) why += (why.empty() ? "" : "; ") + reason;
      return report_error("simulate",
                          invalid_argument("the deployment does not hold (" + f.violated() +
                                           "): " + why + " [" + planner::shape_summary(*d) +
                                           ", b_a = " +
                                           std::to_string(d->batch_per_micro_batch) + "]"));
    }
  }
  if (!flags.get_string("placement").empty() || !flags.get_string("routing").empty()) {
    if (flags.was_set("imbalance") && !flags.get_string("routing").empty()) {
      return report_error("simulate", invalid_argument("--imbalance and --routing both give the "
                                                       "expert loads; give one"));
    }
    auto nodes = placement_node_shares(flags, *d, o.zipf_s);
    if (!nodes.ok()) return report_error("simulate", nodes.status());
    o.node_replica_shares = std::move(nodes).value();
  }

  if (!flags.get_string("sweep").empty()) return run_sweep(flags, *d, param, from, to, o, slo);
  return run_single(flags, *d, o, slo);
}

}  // namespace msinfer::cli
