// msinfer profile: measure T_a and T_e of a model on this machine, fit k1..k4.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/bench/profile.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/table.h"
#include "msinfer/kernels/cpu/isa.h"
#include "planner_flags.h"

namespace msinfer::cli {

int run_profile(int argc, char** argv) {
  FlagSet flags(
      "profile",
      "Measures T_a (one layer of one micro-batch on an attention worker) over\n"
      "micro-batch sizes at a context length, and T_e (one expert's FFN) over\n"
      "per-expert batch sizes, fits T_a = k1 b_a + k2 and T_e = k3 b_e + k4\n"
      "(docs/PLANNER.md, section 3b) and writes the file `msinfer plan --profile` reads.\n"
      "For `plan --devices cpu` (section 8) it also times the step's head (final norm,\n"
      "LM head, greedy pick), a layer's attention stage and experts run again right\n"
      "after (a later micro-batch), and the cores this process's kernels and a group\n"
      "of as many busy threads as the machine has cores get: run it on the machine\n"
      "as it will be when the plan runs.");
  flags.add_string("model", "", "model directory");
  flags.add_string("out", "", "write the profile JSON here");
  flags.add_int("seq-len", 512, 1, 1 << 20, "context length of the decoding requests");
  flags.add_int("kv-cache-mb", 1024, 1, 1 << 20, "KV cache budget for the attention measurements");
  flags.add_double("seconds", 0.3, 0, 600,
                   "measuring time per point (> 0): the median of 5 rounds that take it\n"
                   "together (T_a: of the calls in walks over the layers that take it)");
  flags.add_bool("json", "print the profile JSON instead of tables");
  add_engine_flags(flags);
  if (auto done = parse_command_line(flags, "profile", argc, argv, 2)) return *done;
  Status s;
  if (!(flags.get_double("seconds") > 0)) {
    return report_error("profile", invalid_argument("--seconds must be in (0, 600]"));
  }
  // Flags, output path and model before the measurements (issue 12 item 7).
  if (!flags.get_string("out").empty()) {
    s = check_output_path("--out", flags.get_string("out"));
    if (!s.ok()) return report_error("profile", s);
  }
  s = check_model_dir(flags);
  if (!s.ok()) return report_error("profile", s);
  auto weight_format = apply_engine_flags(flags);
  if (!weight_format.ok()) return report_error("profile", weight_format.status());
  bench::ProfileOptions o;
  o.weights = *weight_format;
  o.model_dir = flags.get_string("model");
  o.seq_len = flags.get_int("seq-len");
  o.kv_cache_mb = flags.get_int("kv-cache-mb");
  o.min_seconds = flags.get_double("seconds");
  o.device = flags.get_string("device");
  const bool json = flags.get_bool("json");
  void (*progress)(const std::string&) = [](const std::string& line) {
    std::fprintf(stderr, "  %s\n", line.c_str());
  };
  // Progress goes to stderr, so it shows under --json too.
  if (runtime::is_cpu_device(o.device)) {
    std::fprintf(stderr, "msinfer profile: CPU kernels %s, %s weights\n",
                 kernels::cpu::isa_description().c_str(), kernels::cpu::weight_format_name(o.weights));
  } else {
    std::fprintf(stderr, "msinfer profile: device %s, bf16 weights\n", o.device.c_str());
  }
  auto r = bench::profile_model(o, progress);
  if (!r.ok()) return report_error("profile", r.status());
  Json j = r->to_json(o);
  if (!flags.get_string("out").empty()) {
    s = write_json_file(flags.get_string("out"), j);
    if (!s.ok()) return report_error("profile", s.with_context("--out"));
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  Table t({"stage", "fit", "R^2", "max error"});
 t.add_row({std::string("T_a"), "k1 = " + fmt(r->attention_fit.slope * 1e3, 5) + " ms/token, k2 = " +
                        fmt(r->attention_fit.intercept * 1e3, 4) + " ms",
             fmt(r->attention_fit.r2, 4), fmt_pct(r->attention_fit.max_rel_error)});
 t.add_row({std::string("T_e"), "k3 = " + fmt(r->expert_fit.slope * 1e3, 5) + " ms/token, k4 = " +
                        fmt(r->expert_fit.intercept * 1e3, 4) + " ms",
             fmt(r->expert_fit.r2, 4), fmt_pct(r->expert_fit.max_rel_error)});
  std::cout << t.to_string();
  if (!flags.get_string("out").empty()) std::printf("profile written to %s\n", flags.get_string("out").c_str());
  return 0;
}

}  // namespace msinfer::cli
