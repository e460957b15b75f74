// msinfer balance: a placement of experts (with replicas of the hot ones) over
// expert workers from routing statistics (docs/RUNTIME.md, "Routing statistics and balancing").
#include "msinfer/runtime/balance.h"

#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/table.h"

namespace msinfer::cli {
namespace {

// Predicted balancedness of `p` on the measured rows (+ `fixed_rows` per
// replica and step): over a step (sum over layers of the busiest worker / of
// the mean) and on loads summed over layers.
Json predict(const runtime::RoutingStats& st, const runtime::Placement& p, double fixed_rows) {
  const std::vector<double> per_layer = runtime::predicted_worker_loads(
      st.expert_tokens, st.layers, p, fixed_rows * static_cast<double>(st.steps));
  std::vector<double> total(p.workers, 0.0);
  for (int l = 0; l < st.layers; ++l) {
    for (int w = 0; w < p.workers; ++w)
      total[w] += per_layer[static_cast<size_t>(l) * p.workers + w];
  }
  auto ratio = [](const std::optional<double>& r) { return r ? Json(*r) : Json(nullptr); };
  return Json{{"worker_balance", ratio(runtime::balancedness(per_layer, st.layers, p.workers))},
              {"worker_balance_all_layers", ratio(runtime::balancedness(total, 1, p.workers))},
              {"worker_tokens", total},
              {"placement", p.to_json()}};
}

}  // namespace

std::string routing_summary(const Json& routing) {
  auto ratio = [&](const char* key) {
    return routing[key].is_number() ? fmt(routing[key].get<double>(), 2) : std::string("-");
  };
  std::string s = "routing over " + std::to_string(routing["steps"].get<int64_t>()) +
                  " steps: experts max/mean " + ratio("expert_balance");
  if (routing.contains("worker_balance")) s += ", expert workers max/mean " + ratio("worker_balance");
  return s;
}

int run_balance(int argc, char** argv) {
  FlagSet flags(
      "balance",
      "Computes a placement of experts over expert workers from routing statistics (the\n"
      "\"routing\" object of `msinfer generate --json` or `msinfer bench serve --json`):\n"
      "  1. every expert gets one replica; the spare slots (workers x slots - experts) go\n"
      "     one by one to the expert with the highest load per replica (at most one replica\n"
      "     per worker);\n"
      "  2. replicas, heaviest first, go to the least-loaded worker that has a free slot and\n"
      "     does not hold that expert yet (greedy longest-processing-time).\n"
      "A replicated expert's shares are equal (the runtime splits its rows by predicted\n"
      "worker load; docs/RUNTIME.md). One placement for all layers, from each expert's rows\n"
      "summed over layers: the runtime keeps an expert's weights of every layer on the\n"
      "workers that hold it (a placement is per expert), so a per-layer placement would need\n"
      "per-layer weight loading. Prints the predicted max/mean load of the expert workers\n"
      "before (round robin) and after, per step (sum over layers of the busiest worker's\n"
      "rows / of the mean: what sets the pace) and over all layers.");
  flags.add_string("stats", "",
                   "routing statistics JSON (generate --json / bench serve --json output)");
  flags.add_int("expert-workers", 1, 1, 4096, "expert workers N (required)");
  flags.add_int("slots-per-worker", 0, 0, 4096,
                "experts one worker may hold (memory limit; default ceil(E / N), the round\n"
                "robin's most: no replicas unless E is not a multiple of N)");
  flags.add_double("expert-fixed-rows", 0, 0, 1e6,
                   "what running one expert replica for one layer of one step costs whatever\n"
                   "its rows, in rows: k4 / k3 of `msinfer profile` (weight streaming; ~7 for\n"
                   "small-mixtral on a 2-vCPU VM). Loads become rows + this per replica, and\n"
                   "a spare slot is used only while it lowers the predicted max (default 0:\n"
                   "rows only, every spare slot used)");
  flags.add_string("out", "",
                   "write the placement JSON here (generate / bench serve / serve --placement)");
  flags.add_bool("json", "print one JSON object");
  flags.set_epilog(
      "example:\n"
      "  msinfer generate --model M --prompt-ids 1,2,3 --max-tokens 64 --json > stats.json\n"
      "  msinfer balance --stats stats.json --expert-workers 2 --slots-per-worker 5 --out p.json\n"
      "  msinfer generate --model M --prompt Hi --attention-workers 1 --expert-workers 2 "
      "--placement p.json");
  if (auto done = parse_command_line(flags, "balance", argc, argv, 2)) return *done;
  Status s;
  if (flags.get_string("stats").empty()) {
    return report_error("balance", invalid_argument("--stats is required"));
  }
  if (!flags.was_set("expert-workers")) {
    return report_error("balance", invalid_argument("--expert-workers is required"));
  }
  const std::string out_path = flags.get_string("out");
  if (!out_path.empty()) {
    s = check_output_path("--out", out_path);
    if (!s.ok()) return report_error("balance", s);
  }
  auto doc = read_json_file(flags.get_string("stats"));
  if (!doc.ok()) return report_error("balance", doc.status());
  auto st = runtime::RoutingStats::from_json(*doc, flags.get_string("stats"));
  if (!st.ok()) return report_error("balance", st.status());
  const int N = static_cast<int>(flags.get_int("expert-workers"));
  int K = static_cast<int>(flags.get_int("slots-per-worker"));
  if (flags.was_set("slots-per-worker") && K < 1) {
    return report_error("balance", invalid_argument("--slots-per-worker must be >= 1"));
  }
  if (!flags.was_set("slots-per-worker")) K = (st->experts + N - 1) / N;
  const double fixed_rows = flags.get_double("expert-fixed-rows");
  if (fixed_rows > 0 && st->steps < 1) {
    return report_error("balance", invalid_argument("--expert-fixed-rows needs the stats' steps (" +
                                                    flags.get_string("stats") + " has none)"));
  }
  auto placement = runtime::balance_placement(
      st->expert_totals(), N, K,
      fixed_rows * static_cast<double>(st->steps) *
          runtime::layers_with_rows(st->expert_tokens, st->layers, st->experts));
  if (!placement.ok()) {
    return report_error(
        "balance", placement.status().with_context("--expert-workers " + std::to_string(N) +
                                                   " --slots-per-worker " + std::to_string(K)));
  }
  Json out{{"stats", flags.get_string("stats")},
           {"layers", st->layers},
           {"experts", st->experts},
           {"expert_workers", N},
           {"slots_per_worker", K},
           {"steps", st->steps},
           {"expert_fixed_rows", fixed_rows},
           {"after", predict(*st, *placement, fixed_rows)}};
  if (N <= st->experts) {
    out["before"] = predict(*st, runtime::Placement::round_robin(st->experts, N), fixed_rows);
  } else {
    out["before"] = nullptr;  // round robin needs one expert per worker at least
  }
  if (!out_path.empty()) {
    s = write_text_file(out_path, placement->to_json().dump(2) + "\n");
    if (!s.ok()) return report_error("balance", s);
    out["out"] = out_path;
  }
  if (flags.get_bool("json")) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  auto ratio = [](const Json& j, const char* key) {
    return j.is_null() || j[key].is_null() ? std::string("-") : fmt(j[key].get<double>(), 3);
  };
  std::printf("%d experts, %d layers, %lld steps of routing; %d expert workers x %d slots",
              st->experts, st->layers, static_cast<long long>(st->steps), N, K);
  if (fixed_rows > 0) std::printf("; load = rows + %g per expert replica and step", fixed_rows);
  std::printf("\n\n");
  Table t({"placement", "max/mean per step", "max/mean all layers"});
  t.add_row({"round robin (before)", ratio(out["before"], "worker_balance"),
             ratio(out["before"], "worker_balance_all_layers")});
  t.add_row({"balanced (after)", ratio(out["after"], "worker_balance"),
             ratio(out["after"], "worker_balance_all_layers")});
  std::cout << t.to_string() << "\n" << placement->describe();
  if (!out_path.empty()) std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace msinfer::cli
