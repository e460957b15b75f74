// msinfer bench: benchmarks that report figures against this machine's limits.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "msinfer/bench/kernels_bench.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/table.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

int run_bench_kernels(int argc, char** argv) {
  FlagSet flags("bench kernels",
                "Measures this machine's bf16 peak and memory read bandwidth, then the expert\n"
                "FFN for 1..1024 tokens per expert and decode attention over 128..4096 tokens\n"
                "of context at the small-mixtral shapes, each as a fraction of its roofline.");
  flags.add_bool("json", "print one JSON object");
  flags.add_bool("quick", "shorter measurements (noisier)");
  Status s = flags.parse(argc, argv, 3);
  if (!s.ok()) return report_error("bench kernels", s);
  if (flags.help_requested()) {
    std::cout << flags.usage();
    return 0;
  }
  bench::KernelBenchOptions o;
  o.quick = flags.get_bool("quick");
  auto r = bench::bench_kernels(o);
  if (!r.ok()) return report_error("bench kernels", r.status());
  if (flags.get_bool("json")) {
    std::cout << r->to_json().dump(2) << "\n";
    return 0;
  }
  const auto& m = r->machine;
  std::printf("machine: %d threads; bf16 peak %.0f GFLOP/s (1 thread %.0f)%s; read bandwidth "
              "%.1f GB/s (1 thread %.1f)\n\n",
              m.threads, m.bf16_flops / 1e9, m.bf16_flops_1t / 1e9,
              m.avx512_bf16 ? "" : " [no AVX512-BF16]", m.read_bw / 1e9, m.read_bw_1t / 1e9);
  Table t({"kernel", "tokens", "context", "ms", "GFLOP/s", "GB/s", "roofline", "bound"});
  for (const auto& row : r->rows) {
    t.add_row({row.kernel, std::to_string(row.tokens),
               row.context ? std::to_string(row.context) : "", fmt(row.seconds * 1e3, 3),
               fmt(row.gflops(), 1), fmt(row.gb_s(), 1), fmt_pct(row.roofline_fraction), row.bound});
  }
  std::cout << t.to_string();
  return 0;
}

}  // namespace

int run_bench(int argc, char** argv) {
  const std::string what = argc > 2 ? argv[2] : "";
  if (what == "kernels") return run_bench_kernels(argc, argv);
  if (what == "--help" || what == "-h" || what.empty()) {
    std::printf("usage: msinfer bench kernels [--json] [--quick]\n");
    return what.empty() ? 2 : 0;
  }
  return report_error("bench", invalid_argument("unknown benchmark '" + what + "' (kernels)"));
}

}  // namespace msinfer::cli
