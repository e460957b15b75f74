// msinfer bench: benchmarks that report figures against this machine's limits.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "msinfer/bench/kernels_bench.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/kv_cache.h"
#ifdef MSINFER_WITH_CUDA
#include "msinfer/bench/cuda_kernels_bench.h"
#endif
#include "msinfer/bench/m2n_bench.h"
#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/table.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/mla_attention.h"
#include "msinfer/kernels/cpu/threads.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

// `bench kernels --mla`: DeepSeek's absorbed latent attention for one decode
// token (kernels/cpu/mla_attention.h) at DeepSeek-V3's shape (128 heads,
// kv_lora 512, rope 64, nope = v = 128) and small-deepseek's (8, 256, 32, 64)
// at every level this CPU runs (up to --isa): the plain references (the
// scalar kernels every level ran before the vectorised ones) and the level's
// kernels timed alternately, best of each, the outputs checked against the
// references'. `attention` over each of `contexts`: bytes are the latent rows
// read once (context x (kv_lora + rope) x 2), FLOPs heads x context x 2 x
// (2 kv_lora + rope). `absorb+value_up` (mla_absorb_query + mla_value_up):
// bytes are W_UK and W_UV in bf16, FLOPs 2 x heads x kv_lora x (nope + v).
// Each level's roofline uses the limits measured at that level just before.
struct MlaShape {
  const char* name;
  int64_t heads, kv_lora, rope, nope, v;
};

// Uniform in [-1, 1), from a xorshift state.
float next_uniform(uint64_t& x) {
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return static_cast<float>(static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0);
}

// The levels this CPU runs, each with the limits measured at it, and the
// rows measured so far.
class MlaBench {
 public:
  MlaBench(int threads, bool quick) : threads_(threads), min_seconds_(quick ? 0.05 : 0.2) {}

  // Measures each level's limits (kernel threads set first).
  Status measure_levels(bool quick) {
    for (kernels::cpu::IsaLevel level : kernels::cpu::all_isa_levels()) {
      if (!kernels::cpu::isa_supported(level)) continue;
      MSI_RETURN_IF_ERROR(kernels::cpu::force_isa(level));
      levels_.push_back(level);
      limits_.push_back(bench::measure_machine(quick));
    }
    return ok_status();
  }

  // Times before() and after() alternately at every level; an error if
  // their outputs differ by more than 1e-4 of the largest.
  Status measure(const MlaShape& sh, const std::string& kernel, int64_t ctx, double flops,
                 double bytes, const std::function<void()>& before,
                 const std::function<void()>& after, const std::vector<float>& want,
                 const std::vector<float>& got) {
    namespace k = kernels::cpu;
    using Clock = std::chrono::steady_clock;
    for (size_t li = 0; li < levels_.size(); ++li) {
      const k::IsaLevel level = levels_[li];
      MSI_RETURN_IF_ERROR(k::force_isa(level));
      double tb = 1e30, ta = 1e30, sb = 0, sa = 0;
      for (int rep = 0; rep < 3 || sb < min_seconds_ || sa < min_seconds_; ++rep) {
        const auto t0 = Clock::now();
        before();
        const auto t1 = Clock::now();
        after();
        const auto t2 = Clock::now();
        const double a = std::chrono::duration<double>(t1 - t0).count();
        const double b = std::chrono::duration<double>(t2 - t1).count();
        tb = std::min(tb, a), ta = std::min(ta, b), sb += a, sa += b;
      }
      double err = 0, top = 1e-30;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
        top = std::max(top, static_cast<double>(std::fabs(want[i])));
      }
      if (!(err / top < 1e-4)) {
        return internal_error("--mla: " + kernel + " at " + k::isa_name(level) +
                              " differs from the reference by " + fmt(err / top, 6) +
                              " (relative)");
      }
      add_row(sh, kernel, ctx, li, flops, bytes, tb, ta);
    }
    return ok_status();
  }

  int report(bool json) const {
    namespace k = kernels::cpu;
    Json machine = Json::object();
    for (size_t li = 0; li < levels_.size(); ++li) {
      machine[k::isa_name(levels_[li])] = limits_[li].to_json();
    }
    if (json) {
      std::cout << Json{{"machine", machine}, {"threads", threads_}, {"mla", rows_}}.dump(2)
                << "\n";
      return 0;
    }
    std::printf("machine: %s; %d kernel thread(s); limits at each level (%s):\n",
                limits_.front().cpu.c_str(), threads_,
                threads_ == 1 ? "one thread" : "all threads");
    for (size_t li = 0; li < levels_.size(); ++li) {
      std::printf("  %-11s fp32 FMA peak %.0f GFLOP/s, read bandwidth %.1f GB/s\n",
                  k::isa_name(levels_[li]), peak(li) / 1e9, bandwidth(li) / 1e9);
    }
    std::printf("\n");
    std::cout << table_.to_string();
    return 0;
  }

 private:
  double bandwidth(size_t li) const {
    return threads_ == 1 ? limits_[li].read_bw_1t : limits_[li].read_bw;
  }
  double peak(size_t li) const {
    return threads_ == 1 ? limits_[li].fp32_flops_1t : limits_[li].fp32_flops;
  }

  // One row: the kernel at level li took tb (reference) and ta seconds.
  void add_row(const MlaShape& sh, const std::string& kernel, int64_t ctx, size_t li, double flops,
               double bytes, double tb, double ta) {
    const char* level = kernels::cpu::isa_name(levels_[li]);
    const double bw = bandwidth(li), fl = peak(li);
    const double t_mem = bytes / bw, t_fma = flops / fl, roof = std::max(t_mem, t_fma);
    const std::string bound = t_mem >= t_fma ? "memory" : "compute (fp32)";
    table_.add_row({sh.name, kernel, ctx > 0 ? std::to_string(ctx) : "", level, fmt(tb * 1e3, 3),
                    fmt(ta * 1e3, 3), fmt(tb / ta, 1), fmt(flops / ta / 1e9, 1),
                    fmt(bytes / ta / 1e9, 2), fmt_pct(roof / ta), bound});
    rows_.push_back(Json{{"shape", sh.name},
                         {"kernel", kernel},
                         {"heads", sh.heads},
                         {"kv_lora", sh.kv_lora},
                         {"rope", sh.rope},
                         {"context", ctx},
                         {"level", level},
                         {"before_seconds", tb},
                         {"after_seconds", ta},
                         {"speedup", tb / ta},
                         {"flops", flops},
                         {"bytes", bytes},
                         {"read_bandwidth", bw},
                         {"fp32_peak", fl},
                         {"roofline_fraction", roof / ta},
                         {"bound", bound}});
    std::fprintf(stderr, "  mla %s %s %lld %s: %.3f ms -> %.3f ms\n", sh.name, kernel.c_str(),
                 static_cast<long long>(ctx), level, tb * 1e3, ta * 1e3);
  }

  int threads_;
  double min_seconds_;
  std::vector<kernels::cpu::IsaLevel> levels_;
  std::vector<bench::MachineLimits> limits_;
  Json rows_ = Json::array();
  Table table_{{"shape", "kernel", "context", "level", "before ms", "after ms", "speedup",
                "GFLOP/s", "GB/s", "roofline", "bound"}};
};

// mla_attention for one decode token over `ctx` positions of random latents.
Status bench_mla_attention(MlaBench& b, const MlaShape& sh, int64_t ctx, int64_t block_size,
                           const std::vector<float>& q_lat, const std::vector<float>& q_pe,
                           uint64_t& rng) {
  namespace k = kernels::cpu;
  const int64_t d = sh.kv_lora + sh.rope, H = sh.heads, R = sh.kv_lora;
  std::vector<float> want(H * R), got(H * R);
  const int64_t blocks = (ctx + block_size - 1) / block_size;
  std::vector<bf16> pool(static_cast<size_t>(blocks * block_size * d));
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);
  for (bf16& v : pool) v = float_to_bf16(next_uniform(rng));
  const k::PagedKvLayer kv{pool.data(), nullptr, block_size, 1, d};
  const int32_t pos = static_cast<int32_t>(ctx - 1);
  const int32_t* tab = table.data();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  return b.measure(
      sh, "attention", ctx, 2.0 * H * ctx * (d + R), 2.0 * ctx * d,
      [&] {
        k::mla_attention_reference(q_lat.data(), q_pe.data(), 1, H, R, sh.rope, kv, &pos, &tab,
                                   scale, want.data());
      },
      [&] {
        k::mla_attention(q_lat.data(), q_pe.data(), 1, H, R, sh.rope, kv, &pos, &tab, scale,
                         got.data());
      },
      want, got);
}

// mla_absorb_query + mla_value_up for one token.
Status bench_mla_absorb(MlaBench& b, const MlaShape& sh, const std::vector<float>& q_lat,
                        uint64_t& rng) {
  namespace k = kernels::cpu;
  const int64_t H = sh.heads, R = sh.kv_lora;
  std::vector<bf16> w_uk(H * sh.nope * R), w_uv(H * sh.v * R);
  for (bf16& v : w_uk) v = float_to_bf16(next_uniform(rng) * 0.1f);
  for (bf16& v : w_uv) v = float_to_bf16(next_uniform(rng) * 0.1f);
  std::vector<float> q_nope(H * sh.nope), want(H * sh.v + H * R), got(want.size());
  for (float& v : q_nope) v = next_uniform(rng);
  return b.measure(
      sh, "absorb+value_up", 0, 2.0 * H * R * (sh.nope + sh.v),
      2.0 * static_cast<double>(w_uk.size() + w_uv.size()),
      [&] {
        k::mla_absorb_query_reference(q_nope.data(), 1, H, sh.nope, R, w_uk.data(), want.data());
        k::mla_value_up_reference(q_lat.data(), 1, H, R, sh.v, w_uv.data(), want.data() + H * R);
      },
      [&] {
        k::mla_absorb_query(q_nope.data(), 1, H, sh.nope, R, w_uk.data(), got.data());
        k::mla_value_up(q_lat.data(), 1, H, R, sh.v, w_uv.data(), got.data() + H * R);
      },
      want, got);
}

int run_bench_mla(const std::vector<int64_t>& contexts, int threads, int64_t block_size, bool quick,
                  bool json) {
  namespace k = kernels::cpu;
  const MlaShape shapes[] = {{"deepseek-v3", 128, 512, 64, 128, 128},
                             {"small-deepseek", 8, 256, 32, 64, 64}};
  k::set_compute_threads(threads);
  k::enter_compute_thread();
  const k::IsaLevel saved = k::active_isa();
  MlaBench b(threads, quick);
  Status s = b.measure_levels(quick);
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (const MlaShape& sh : shapes) {
    if (!s.ok()) break;
    std::vector<float> q_lat(sh.heads * sh.kv_lora), q_pe(sh.heads * sh.rope);
    for (float& v : q_lat) v = next_uniform(rng);
    for (float& v : q_pe) v = next_uniform(rng);
    for (int64_t ctx : contexts) {
      s = bench_mla_attention(b, sh, ctx, block_size, q_lat, q_pe, rng);
      if (!s.ok()) break;
    }
    if (s.ok()) s = bench_mla_absorb(b, sh, q_lat, rng);
  }
  if (s.ok()) s = k::force_isa(saved);
  if (!s.ok()) return report_error("bench kernels", s);
  return b.report(json);
}

// A comma-separated list of integers in [lo, hi] (a flag's value), or why not.
StatusOr<std::vector<int64_t>> int_list(const std::string& text, const std::string& flag,
                                        long long lo, long long hi) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || x < lo || x > hi) {
      return invalid_argument(flag + ": '" + item + "' is not an integer " + std::to_string(lo) +
                              ".." + std::to_string(hi));
    }
    v.push_back(x);
  }
  if (v.empty()) return invalid_argument(flag + ": empty");
  return v;
}

int run_bench_kernels(int argc, char** argv) {
  FlagSet flags("bench kernels",
                "Measures this machine's fp32 FMA peak, bf16 peak (AVX512-BF16 only) and memory\n"
                "read bandwidth, then the expert FFN (bf16 and int8 weights; w8a8 on request)\n"
                "for 1..1024 tokens per expert and decode attention over 128..4096 tokens of\n"
                "context at the small-mixtral shapes, each as a fraction of its roofline, at\n"
                "the active CPU kernel level (MSINFER_ISA or --isa to force a lower one).");
  flags.add_bool("json", "print one JSON object");
  flags.add_bool("quick", "shorter measurements (noisier)");
  flags.add_string("isa", "", "CPU kernel level: generic|avx2|avx512|avx512bf16|amx (default: best)");
  flags.add_string("weights", "bf16,int8",
                   "expert weight formats to measure, comma-separated: bf16, int8, w8a8, mxfp4\n"
                   "(w8a8's compute roofline is the fp32 FMA peak too: its fraction may pass 1;\n"
                   "mxfp4: random 4-bit weights, the hidden size and FFN width multiples of 32)");
  flags.add_int("hidden", 1024, 32, 65536,
                "expert FFN hidden size (default small-mixtral's; gpt-oss-20b: 2880)");
  flags.add_int("expert-ffn", 2816, 32, 65536,
                "expert FFN width (default small-mixtral's; gpt-oss-20b: 2880)");
  flags.add_string("tokens", "", "tokens per expert, comma-separated (default 1,2,4,...,1024)");
  flags.add_string("contexts", "",
                   "decode attention context lengths, comma-separated (default 128,256,...,4096)");
  flags.add_int("kv-block-size", runtime::KvCache::kDefaultBlockSize, 1, 4096,
                "token slots per KV block in the decode attention runs (the engine's default)");
  flags.add_string("device", "cpu",
                   "cpu, or cuda[:N]: the GPU's bf16 GEMM rate and copy bandwidth, then the CUDA\n"
                   "backend's kernels at Mixtral-8x7B shapes against them");
  flags.add_bool("mla",
                 "instead: DeepSeek's latent attention (one decode token) at DeepSeek-V3's\n"
                 "and small-deepseek's shapes, before (the plain reference) and after\n"
                 "(each level's kernel), side by side at every level up to --isa");
  flags.add_string("mla-contexts", "128,1024,4096", "--mla: context lengths, comma-separated");
  flags.add_int("mla-threads", 1, 1, 1024, "--mla: kernel threads");
  if (auto done = parse_command_line(flags, "bench kernels", argc, argv, 3)) return *done;
  Status s;
  if (flags.get_bool("mla")) {
    s = apply_isa_flag(flags.get_string("isa"));
    if (!s.ok()) return report_error("bench kernels", s);
    auto contexts = int_list(flags.get_string("mla-contexts"), "--mla-contexts", 1, 1048576);
    if (!contexts.ok()) return report_error("bench kernels", contexts.status());
    return run_bench_mla(*contexts, static_cast<int>(flags.get_int("mla-threads")),
                         flags.get_int("kv-block-size"), flags.get_bool("quick"),
                         flags.get_bool("json"));
  }
  if (const std::string& device = flags.get_string("device"); !runtime::is_cpu_device(device)) {
    s = runtime::check_device(device);
    if (!s.ok()) return report_error("bench kernels", s.with_context("--device"));
#ifdef MSINFER_WITH_CUDA
    bench::CudaKernelBenchOptions co;
    co.device = device;
    co.quick = flags.get_bool("quick");
    auto r = bench::bench_cuda_kernels(co, [](const std::string& line) {
      std::fprintf(stderr, "  %s\n", line.c_str());
    });
    if (!r.ok()) return report_error("bench kernels", r.status());
    if (flags.get_bool("json")) std::cout << r->dump(2) << "\n";
    return 0;
#endif
  }
  bench::KernelBenchOptions o;
  o.quick = flags.get_bool("quick");
  o.kv_block_size = flags.get_int("kv-block-size");
  o.hidden = flags.get_int("hidden");
  o.expert_ffn = flags.get_int("expert-ffn");
  s = apply_isa_flag(flags.get_string("isa"));
  if (!s.ok()) return report_error("bench kernels", s);
  o.weights.clear();
  {
    std::stringstream ss(flags.get_string("weights"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto f = kernels::cpu::parse_weight_format(item);
      if (!f.ok()) return report_error("bench kernels", f.status().with_context("--weights"));
      o.weights.push_back(*f);
    }
    if (o.weights.empty()) return report_error("bench kernels", invalid_argument("--weights: empty"));
  }
  if (!flags.get_string("tokens").empty()) {
    auto tokens = int_list(flags.get_string("tokens"), "--tokens", 1, 65536);
    if (!tokens.ok()) return report_error("bench kernels", tokens.status());
    o.tokens = *tokens;
  }
  if (!flags.get_string("contexts").empty()) {
    auto contexts = int_list(flags.get_string("contexts"), "--contexts", 1, 1048576);
    if (!contexts.ok()) return report_error("bench kernels", contexts.status());
    o.contexts = *contexts;
  }
  // Progress on stderr (the run takes about a minute), under --json too.
  auto r = bench::bench_kernels(o, [](const std::string& line) {
    std::fprintf(stderr, "  %s\n", line.c_str());
  });
  if (!r.ok()) return report_error("bench kernels", r.status());
  if (flags.get_bool("json")) {
    std::cout << r->to_json().dump(2) << "\n";
    return 0;
  }
  const auto& m = r->machine;
  std::printf("machine: %s, %d threads, kernel level %s; fp32 FMA peak %.0f GFLOP/s (1 thread "
              "%.0f); ",
              m.cpu.c_str(), m.threads, m.isa.c_str(), m.fp32_flops / 1e9, m.fp32_flops_1t / 1e9);
  if (m.avx512_bf16) {
    std::printf("bf16 peak %.0f GFLOP/s (1 thread %.0f); ", m.bf16_flops / 1e9,
                m.bf16_flops_1t / 1e9);
  }
  if (m.amx_flops > 0) {
    std::printf("AMX bf16 peak %.0f GFLOP/s (1 thread %.0f); ", m.amx_flops / 1e9,
                m.amx_flops_1t / 1e9);
  }
  std::printf("read bandwidth %.1f GB/s (1 thread %.1f)\n\n", m.read_bw / 1e9, m.read_bw_1t / 1e9);
  // "x bf16": the bf16 expert FFN's time at the same tokens over this row's.
  auto vs_bf16 = [&](const bench::KernelBenchRow& row) -> std::string {
    if (row.kernel != "expert_ffn" || row.weights == "bf16") return "";
    for (const auto& b : r->rows) {
      if (b.kernel == row.kernel && b.weights == "bf16" && b.tokens == row.tokens) {
        return fmt(b.seconds / row.seconds, 2);
      }
    }
    return "";
  };
  Table t({"kernel", "weights", "tokens", "context", "MiB w", "ms", "x bf16", "GFLOP/s", "GB/s",
           "roofline", "bound"});
  for (const auto& row : r->rows) {
    t.add_row({row.kernel, row.weights, std::to_string(row.tokens),
               row.context ? std::to_string(row.context) : "",
               row.weight_bytes > 0 ? fmt(row.weight_bytes / 1048576.0, 2) : "",
               fmt(row.seconds * 1e3, 3), vs_bf16(row),
               fmt(row.gflops(), 1), fmt(row.gb_s(), 1), fmt_pct(row.roofline_fraction),
               row.bound + (row.bound == "compute" ? " (" + row.peak + ")" : "")});
  }
  std::cout << t.to_string();
  return 0;
}

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_signal = 0;

void forward_signal(int sig) {
  g_signal = sig;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

// Waits for `child`, passing SIGINT, SIGTERM and SIGHUP on to it meanwhile;
// returns its wait status.
int wait_forwarding_signals(pid_t child) {
  g_child = child;
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

StatusOr<std::vector<int64_t>> parse_sizes(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    // Digits with an optional fraction, then an optional suffix (no hex, inf or nan).
    const size_t num = item.find_first_not_of("0123456789.");
    const std::string digits = item.substr(0, num);
    char* end = nullptr;
    double v = digits.empty() || digits.find_first_of("0123456789") == std::string::npos
                   ? -1
                   : std::strtod(digits.c_str(), &end);
    if (end != nullptr && *end != '\0') v = -1;
    std::string suffix = num == std::string::npos ? "" : item.substr(num);
    if (suffix == "k" || suffix == "K" || suffix == "KB") v *= 1024;
    else if (suffix == "m" || suffix == "M" || suffix == "MB") v *= 1024 * 1024;
    else if (!suffix.empty()) return invalid_argument("--size: cannot read '" + item + "'");
    if (!(v >= 1) || v > (64 << 20)) return invalid_argument("--size: " + item + " must be 1 B .. 64 MiB");
    out.push_back(static_cast<int64_t>(v));
  }
  if (out.empty()) return invalid_argument("--size: empty list");
  return out;
}

// bench m2n's flags, checked, before any rank starts (--profile-into is read
// and re-written at the end).
StatusOr<bench::M2NBenchOptions> m2n_options_from_flags(const FlagSet& flags) {
  bench::M2NBenchOptions o;
  o.senders = static_cast<int>(flags.get_int("senders"));
  o.receivers = static_cast<int>(flags.get_int("receivers"));
  o.iterations = static_cast<int>(flags.get_int("iters"));
  o.baseline_mpi = flags.get_string("baseline") == "mpi";
  o.verify = !flags.get_bool("no-verify");
  {
    auto t = comm::parse_transport(flags.get_string("provider"));
    if (!t.ok() || *t == comm::TransportKind::kFabricVerbs ||
        *t == comm::TransportKind::kFabricEfa) {
      return invalid_argument("--provider must be direct, socket, shm or tcp");
    }
    o.transport = *t;
  }
  if (flags.get_string("baseline") != "mpi" && flags.get_string("baseline") != "none") {
    return invalid_argument("--baseline must be mpi or none");
  }
  const std::string imb = flags.get_string("imbalance");
  if (imb.rfind("zipf:", 0) == 0) {
    FlagSet one("bench m2n", "");
    one.add_double("imbalance", 1, 0, 16, "");
    if (!one.parse({"--imbalance=" + imb.substr(5)}).ok() || !(one.get_double("imbalance") > 0)) {
      return invalid_argument("--imbalance zipf:S needs a number S in (0, 16], got '" + imb + "'");
    }
    o.zipf = one.get_double("imbalance");
  } else if (imb != "none") {
    return invalid_argument("--imbalance: expected none or zipf:S");
  }
  auto sizes = parse_sizes(flags.get_string("size"));
  if (!sizes.ok()) return sizes.status();
  o.sizes = *sizes;
  const std::string& into_path = flags.get_string("profile-into");
  if (!into_path.empty()) {
    Status s = check_output_path("--profile-into", into_path);
    std::error_code ec;
    if (s.ok() && std::filesystem::exists(into_path, ec) &&
        !std::filesystem::is_regular_file(into_path, ec)) {
      s = invalid_argument("--profile-into " + into_path + ": not a regular file");
    }
    if (s.ok() && std::filesystem::exists(into_path, ec)) {
      auto j = read_json_file(into_path);
      s = j.ok() ? ok_status() : j.status().with_context("--profile-into");
    }
    if (!s.ok()) return s;
  }
  return o;
}

// Started directly: runs this command again under mpirun and returns its exit
// code.
int relaunch_under_mpirun(const bench::M2NBenchOptions& o, int argc, char** argv) {
  // Re-launch under mpirun: one rank per process, the data over the chosen
  // transport, MPI only for the bootstrap and the baseline (ob1 pml: UCX
  // needs IB), on the btl that matches the transport.
  // Ranks are bound round-robin to cores (rank r on core r mod cores), so on
  // a host with fewer cores than ranks every core gets the same mix of
  // senders and receivers. Left to the scheduler, the placement drifts
  // mid-run (both senders on one core, say) and the one-way time with it,
  // 2-6x on the 2-core VM, for msinfer and MPI alike.
  const std::string btl = bench::mpi_btl_for(o.transport);
  std::vector<std::string> args = {"mpirun",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--map-by",
                                   "core",
                                   "--bind-to",
                                   "core:overload-allowed",
                                   "-np",
                                   std::to_string(o.senders + o.receivers),
                                   "--mca",
                                   "pml",
                                   "ob1",
                                   "--mca",
                                   "btl",
                                   "self," + btl};
  if (btl == "tcp") {
    for (const char* a : {"--mca", "btl_tcp_if_include", "lo", "-x", "FI_TCP_IFACE=lo"})
      args.push_back(a);
  }
  auto exe = self_executable();
  if (!exe.ok()) return report_error("bench m2n", exe.status());
  args.push_back(*exe);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  // mpirun runs as a child, not in place of this process: once it exits, for
  // whatever reason (SIGINT included: mpirun sends its ranks SIGTERM and, a
  // second later, SIGKILL), the ranks' shared-memory objects are removed here.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child < 0) {
    return report_error("bench m2n", internal_error(std::string("fork: ") + std::strerror(errno)));
  }
  if (child == 0) {
    ::execvp("mpirun", cargs.data());
    std::fprintf(stderr, "msinfer bench m2n: cannot run mpirun (install openmpi-bin)\n");
    ::_exit(127);
  }
  const int status = wait_forwarding_signals(child);
  comm::remove_dead_shm_endpoints();
  if (g_signal != 0) {  // interrupted: die of the same signal, as if it had come here
    ::signal(g_signal, SIG_DFL);
    ::raise(g_signal);
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int run_bench_m2n(int argc, char** argv) {
  FlagSet flags("bench m2n",
                "M2N then N2M rounds between M attention and N expert processes on this host:\n"
                "one-way latency (round trip / 2) p50/p99 and GB/s per sender, every byte\n"
                "verified; with the MPI baseline the same traffic goes through Open MPI\n"
                "Isend/Irecv and MPI_Alltoallv in the same processes. Started directly, it\n"
                "re-launches itself under mpirun (Open MPI) with M + N ranks.");
  flags.add_int("senders", 4, 1, 128, "attention processes M");
  flags.add_int("receivers", 4, 1, 128, "expert processes N");
  flags.add_string("size", "2k,32k,256k,2m,8m",
                   "bytes per (sender, receiver) message; list, k/m suffixes");
  flags.add_int("iters", 50, 1, 1000000, "timed rounds per size");
  flags.add_string("provider", "direct",
                   "direct | socket (msinfer's shared-memory and TCP transports) | shm | tcp\n"
                   "(libfabric providers); MPI uses the matching btl: vader for direct and shm,\n"
                   "tcp for socket and tcp");
  flags.add_string("baseline", "mpi", "mpi | none");
  flags.add_string("imbalance", "none", "none | zipf:S (skewed rows per receiver)");
  flags.add_bool("no-verify", "skip the byte checks (they run outside the timed span anyway)");
  flags.add_bool("json", "print one JSON object");
  flags.add_string(
      "profile-into", "",
      "add the measured transfer model (nic_gb_s, nic_util_curve) to this profile "
      "JSON (from `msinfer profile`; created if missing) for plan/simulate/bench serve");
  if (auto done = parse_command_line(flags, "bench m2n", argc, argv, 3)) return *done;
  auto options = m2n_options_from_flags(flags);
  if (!options.ok()) return report_error("bench m2n", options.status());
  const bench::M2NBenchOptions& o = *options;
  if (!comm::launched_by_mpi()) return relaunch_under_mpirun(o, argc, argv);
  Status s;
  auto rows = bench::run_m2n_bench(o);
  if (!rows.ok()) return report_error("bench m2n", rows.status());
  if (rows->empty()) return 0;  // not rank 0
  if (const std::string& into = flags.get_string("profile-into"); !into.empty()) {
    Json base = Json::object();
    if (std::ifstream(into).good()) {
      auto j = read_json_file(into);
      if (!j.ok()) return report_error("bench m2n", j.status());
      base = *j;
    }
    auto merged = bench::add_transfer_model(base, *rows);
    if (!merged.ok()) return report_error("bench m2n", merged.status().with_context(into));
    // Checked: a failed write is an error, never "written" (issue 12 item 1).
    s = write_text_file(into, merged->dump(2) + "\n");
    if (!s.ok()) return report_error("bench m2n", s.with_context("--profile-into"));
    std::fprintf(stderr, "msinfer bench m2n: transfer model written into %s\n", into.c_str());
  }
  if (flags.get_bool("json")) {
    std::cout << Json{{"results", bench::m2n_rows_to_json(*rows)}}.dump(2) << "\n";
    return 0;
  }
  std::printf(
      "M2N + N2M, %d senders x %d receivers, %s, %d rounds per size, one-way = round trip / 2\n\n",
      o.senders, o.receivers, comm::transport_name(o.transport), o.iterations);
  Table t({"size", "name", "p50 us", "p99 us", "GB/s per sender"});
  for (const auto& r : *rows) {
    t.add_row({fmt_si(static_cast<double>(r.size)) + "B", r.name, fmt(r.p50_us, 1), fmt(r.p99_us, 1),
               fmt(r.gbps, 2)});
  }
  std::cout << t.to_string();
  return 0;
}

}  // namespace

int run_bench(int argc, char** argv) {
  const std::string what = argc > 2 ? argv[2] : "";
  if (what == "kernels") return run_bench_kernels(argc, argv);
  if (what == "m2n") return run_bench_m2n(argc, argv);
  if (what == "serve") return run_bench_serve(argc, argv);
  if (what == "--help" || what == "-h" || what.empty()) {
    std::printf("usage: msinfer bench kernels [--json] [--quick]\n"
                "       msinfer bench m2n [--senders M --receivers N --size BYTES --provider direct|socket|shm|tcp ...]\n"
                "       msinfer bench serve --offline --model DIR [--num-prompts P --input-len I "
                "--output-len O] [deployment flags] [--json]\n");
    return what.empty() ? 2 : 0;
  }
  return report_error("bench", invalid_argument("unknown benchmark '" + what + "' (kernels, m2n, serve)"));
}

}  // namespace msinfer::cli
