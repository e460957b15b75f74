// Flags of every command that runs the CPU engine: the kernel level and the
// weight format (docs/ENGINE.md, "CPU kernel levels").
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/threads.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/kv_cache.h"

namespace msinfer::cli {

void add_engine_flags(FlagSet& flags) {
  flags.add_string("isa", "",
                   "CPU kernel level cap: generic | avx2 | avx512 | avx512bf16 | amx (default:\n"
                   "MSINFER_ISA, else the best this CPU runs); inherited by the workers this\n"
                   "command starts");
  flags.add_string("weights", "bf16",
                   "GEMM weight format: bf16; int8 (quantised at load, symmetric per output\n"
                   "channel; router and embedding stay bf16); or w8a8 (the same int8 weights,\n"
                   "and each activation row quantised to int8 at run time: integer dot\n"
                   "products, faster for batches on CPUs without bf16 dot products); or mxfp4\n"
                   "(an MXFP4 checkpoint's experts, gpt-oss's, kept 4-bit and decoded in the\n"
                   "GEMM's registers; everything else bf16)",
                   "MSINFER_WEIGHTS");
  flags.add_int("threads", 0, 0, 4096,
                "compute threads of the engine's kernels (0: OMP_NUM_THREADS, else one per\n"
                "core this process may run on; serve, co-located: the HTTP loop runs beside\n"
                "them); inherited by the workers this command starts");
  flags.add_string("device", "cpu",
                   "where the engine computes: cpu, or cuda[:N] (a GPU, in builds with the CUDA\n"
                   "backend); in a disaggregated deployment the default of both worker kinds",
                   "MSINFER_DEVICE");
  flags.add_string("attention-device", "",
                   "disaggregated: the attention workers' device (default: --device)");
  flags.add_string("expert-device", "",
                   "disaggregated: the expert workers' device (default: --device)");
  flags.add_string("attention-cost", "",
                   "PER_TOKEN,PER_POSITION: the attention cost model micro-batches are balanced\n"
                   "by (a token costs PER_TOKEN + PER_POSITION x its context; default: FLOPs\n"
                   "from the model's shape, K/V bytes at 8 FLOPs each)");
  flags.add_int("block-size", runtime::KvCache::kDefaultBlockSize, 1, 1024,
                "tokens per KV cache block (vLLM's name): the unit the cache is paged and a\n"
                "prefix reused in; smaller blocks reuse more of a shared prefix (a request\n"
                "finds whole blocks only) and leave less unused at a sequence's end, at more\n"
                "block-table entries per token; every worker of a deployment uses it");
  flags.add_bool("no-prefix-caching",
                 "turn off automatic prefix caching: every prompt is computed whole (default:\n"
                 "on; full KV blocks are reused by later requests with the same tokens before\n"
                 "them, docs/RUNTIME.md \"Prefix caching\")");
}

StatusOr<std::pair<double, double>> parse_attention_cost(const std::string& s) {
  if (s.empty()) return std::make_pair(0.0, 0.0);
  const size_t comma = s.find(',');
  char* end = nullptr;
  const std::string a = s.substr(0, comma), b = comma == std::string::npos ? "" : s.substr(comma + 1);
  const double t = std::strtod(a.c_str(), &end);
  const bool ok_t = end != a.c_str() && *end == '\0';
  const double p = std::strtod(b.c_str(), &end);
  const bool ok_p = end != b.c_str() && *end == '\0';
  if (comma == std::string::npos || !ok_t || !ok_p || !(t >= 0) || !(p >= 0) ||
      !std::isfinite(t) || !std::isfinite(p) || t + p <= 0) {
    return invalid_argument("--attention-cost: expected PER_TOKEN,PER_POSITION (numbers >= 0, "
                            "not both 0), got '" + s + "'");
  }
  return std::make_pair(t, p);
}

Status apply_isa_flag(const std::string& level) {
  if (level.empty()) return ok_status();
  auto want = kernels::cpu::parse_isa(level);
  if (!want.ok()) return want.status().with_context("--isa");
  // Before the first kernel call: the level is read once per process, and
  // worker processes inherit the environment.
  ::setenv("MSINFER_ISA", level.c_str(), 1);
  if (*want > kernels::cpu::detected_isa()) {
    return invalid_argument(std::string("--isa ") + level + ": this CPU runs at most " +
                            kernels::cpu::isa_name(kernels::cpu::detected_isa()));
  }
  return ok_status();
}

Status check_kv_cache_fits_memory(int64_t kv_cache_mb) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return ok_status();  // unknown: the allocation decides
  const double mib = static_cast<double>(pages) * static_cast<double>(page) / (1 << 20);
  if (static_cast<double>(kv_cache_mb) <= mib) return ok_status();
  char have[32];
  std::snprintf(have, sizeof(have), "%.0f", mib);
  return invalid_argument("--kv-cache-mb " + std::to_string(kv_cache_mb) +
                          " is more than this machine's memory (" + have + " MiB)");
}

StatusOr<kernels::cpu::WeightFormat> apply_engine_flags(const FlagSet& flags) {
  MSI_RETURN_IF_ERROR(apply_isa_flag(flags.get_string("isa")));
  if (const int64_t threads = flags.get_int("threads"); threads > 0) {
    kernels::cpu::set_compute_threads(static_cast<int>(threads));
    // Worker processes read it when their OpenMP starts.
    ::setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  }
  // Spelling and the flags' combination first, then whether this build has
  // the backend: a conflict is reported the same in every build.
  const char* const kDeviceFlags[] = {"device", "attention-device", "expert-device"};
  for (const char* f : kDeviceFlags) {
    MSI_RETURN_IF_ERROR(
        runtime::check_device_name(flags.get_string(f)).with_context(std::string("--") + f));
  }
  auto format = kernels::cpu::parse_weight_format(flags.get_string("weights"));
  if (!format.ok()) return format.status().with_context("--weights");
  // int8 and w8a8 are CPU kernels: where nothing computes on the CPU they
  // would be ignored silently (the GPU backend multiplies the bf16 weights).
  const std::string device = flags.get_string("device");
  auto on_cpu = [&](const char* f) {
    const std::string d = flags.get_string(f);
    return runtime::is_cpu_device(d.empty() ? device : d);
  };
  if (*format != kernels::cpu::WeightFormat::kBf16 && !runtime::is_cpu_device(device) &&
      !on_cpu("attention-device") && !on_cpu("expert-device")) {
    return invalid_argument(std::string("--weights ") + kernels::cpu::weight_format_name(*format) +
                            " is for the CPU engine; with --device " + device +
                            " every GEMM runs on the GPU in bf16 (drop --weights, or put the "
                            "experts or attention on the CPU)");
  }
  for (const char* f : kDeviceFlags) {
    MSI_RETURN_IF_ERROR(
        runtime::check_device(flags.get_string(f)).with_context(std::string("--") + f));
  }
  MSI_RETURN_IF_ERROR(parse_attention_cost(flags.get_string("attention-cost")).status());
  return *format;
}

}  // namespace msinfer::cli
