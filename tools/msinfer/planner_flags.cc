#include "planner_flags.h"

#include <cstdio>
#include <sstream>

namespace msinfer::cli {

void add_search_flags(FlagSet& flags) {
  flags.add_string("model", "",
                   "model: built-in name (mixtral-8x22b, dbrx, scaled-moe), an HF config.json, "
                   "or a model directory");
  flags.add_string("gpu", "", "GPU type for attention and experts (see data/catalog.json)");
  flags.add_string("expert-gpu", "", "GPU type for the expert nodes (default: --gpu)");
  flags.add_bool("hetero", "enumerate every (attention GPU, expert GPU) pair from --gpus");
  flags.add_string("gpus", "", "comma-separated GPU types for --hetero (default: all catalogued)");
  flags.add_string("catalog", "", "hardware catalogue JSON replacing the built-in one",
                   "MSINFER_CATALOG");
  flags.add_double("slo-ms", 150, 0, 3.6e6, "time-between-tokens SLO in milliseconds (> 0)");
  flags.add_string("workload", "paper-trace",
                   "named workload preset giving --input-len/--output-len (paper-trace: 571/159, "
                   "the MegaScale-Infer trace's medians)");
  flags.add_double("input-len", 0, 0, 1e7, "prompt length in tokens (default: from --workload)");
  flags.add_double("output-len", 0, 0, 1e7,
                   "generated tokens per request (default: from --workload)");
  flags.add_double("seq-len", 0, 0, 1e7,
                   "direct mean decode context in tokens, instead of input + output/2 from "
                   "--workload/--input-len/--output-len");
  flags.add_int("max-micro-batches", 4, 1, 64, "largest number of micro-batches m to try");
  flags.add_int("max-gpus", 0, 0, 1000000, "cap on the total GPUs of a deployment (0: no cap)");
  flags.add_string("objective", "cost", "rank plans by tokens/s per: cost | gpu | power");
  flags.add_string("profile", "", "profile JSON from `msinfer profile` overriding k1..k4 / NIC");
}

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

Status apply_workload_flags(const FlagSet& flags, planner::SearchOptions* out) {
  planner::SearchOptions& o = *out;
  if (flags.was_set("seq-len")) {
    for (const char* f : {"workload", "input-len", "output-len"}) {
      if (flags.was_set(f)) {
        return invalid_argument(std::string("--seq-len gives the context directly; it conflicts "
                                            "with --") +
                                f);
      }
    }
    o.seq_len = flags.get_double("seq-len");
    if (!(o.seq_len > 0)) return invalid_argument("--seq-len must be > 0");
    o.workload = planner::Workload{"seq-len", o.seq_len, 0};
    o.max_context = o.seq_len;
  } else {
    MSI_ASSIGN_OR_RETURN(o.workload, planner::workload_preset(flags.get_string("workload")));
    if (flags.was_set("input-len") || flags.was_set("output-len")) o.workload.name = "custom";
    if (flags.was_set("input-len")) o.workload.input_len = flags.get_double("input-len");
    if (flags.was_set("output-len")) o.workload.output_len = flags.get_double("output-len");
    if (!(o.workload.input_len >= 0)) return invalid_argument("--input-len must be >= 0");
    if (!(o.workload.output_len >= 0)) return invalid_argument("--output-len must be >= 0");
    o.seq_len = o.workload.mean_decode_context();
    if (!(o.seq_len > 0)) return invalid_argument("--input-len + --output-len/2 must be > 0");
    o.max_context = o.workload.input_len + o.workload.output_len;
  }
  return ok_status();
}

StatusOr<SearchSetup> search_setup_from_flags(const FlagSet& flags) {
  SearchSetup setup;
  if (!flags.get_string("catalog").empty()) {
    auto cat = planner::load_catalog(flags.get_string("catalog"));
    if (!cat.ok()) return cat.status().with_context(flags.origin("catalog"));
    setup.catalog = std::move(cat).value();
  } else {
    setup.catalog = planner::default_catalog();
  }
  planner::SearchOptions& o = setup.options;
  if (flags.get_string("model").empty()) {
    return invalid_argument("--model is required (mixtral-8x22b, dbrx, scaled-moe or a config.json)");
  }
  MSI_ASSIGN_OR_RETURN(o.model, load_model_config(flags.get_string("model")));
  const planner::Catalog& cat = setup.catalog;
  if (flags.get_bool("hetero")) {
    if (flags.was_set("gpu") || flags.was_set("expert-gpu")) {
      return invalid_argument("--hetero takes its GPU types from --gpus, not --gpu/--expert-gpu");
    }
    std::vector<planner::GpuSpec> gpus;
    std::vector<std::string> names = split_list(flags.get_string("gpus"));
    if (names.empty()) {
      gpus = cat.gpus;
    } else {
      for (const auto& n : names) {
        auto g = cat.find(n);
        if (!g.ok()) return g.status().with_context("--gpus");
        bool dup = false;
        for (const auto& x : gpus) dup |= x.name == g->name;
        if (!dup) gpus.push_back(*g);
      }
    }
    for (const auto& a : gpus) {
      for (const auto& e : gpus) o.gpu_pairs.emplace_back(a, e);
    }
  } else {
    if (flags.get_string("gpu").empty()) {
      return invalid_argument("--gpu is required (or --hetero --gpus A,B,...)");
    }
    if (flags.was_set("gpus")) return invalid_argument("--gpus needs --hetero");
    auto ga = cat.find(flags.get_string("gpu"));
    if (!ga.ok()) return ga.status().with_context("--gpu");
    planner::GpuSpec ge = *ga;
    if (!flags.get_string("expert-gpu").empty()) {
      auto e = cat.find(flags.get_string("expert-gpu"));
      if (!e.ok()) return e.status().with_context("--expert-gpu");
      ge = *e;
    }
    o.gpu_pairs.emplace_back(*ga, ge);
  }
  o.slo = flags.get_double("slo-ms") * 1e-3;
  if (!(o.slo > 0)) return invalid_argument("--slo-ms must be > 0");
  MSI_RETURN_IF_ERROR(apply_workload_flags(flags, &o));
  if (flags.get_int("max-micro-batches") < 1 || flags.get_int("max-micro-batches") > 64) {
    return invalid_argument("--max-micro-batches must be in 1..64");
  }
  o.max_micro_batches = static_cast<int>(flags.get_int("max-micro-batches"));
  if (flags.get_int("max-gpus") < 0) return invalid_argument("--max-gpus must be >= 0");
  o.max_gpus = static_cast<int>(flags.get_int("max-gpus"));
  MSI_ASSIGN_OR_RETURN(o.objective, planner::parse_objective(flags.get_string("objective")));
  o.nic_util = cat.nic_util;
  if (!flags.get_string("profile").empty()) {
    auto prof = planner::load_profile(flags.get_string("profile"));
    if (!prof.ok()) return prof.status().with_context("--profile");
    planner::Profile p = std::move(prof).value();
    setup.profile = std::make_unique<planner::Profile>(std::move(p));
    o.profile = setup.profile.get();
  }
  return setup;
}

}  // namespace msinfer::cli
