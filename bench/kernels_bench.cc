#include "msinfer/bench/kernels_bench.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "internal/timing.h"
#include "msinfer/kernels/cpu/attention.h"
#include "msinfer/kernels/cpu/moe.h"

namespace msinfer::bench {
namespace {

using internal::seconds_per_call;

std::vector<bf16> random_bf16(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

// A random MXFP4 weight [n, k] kept 4-bit: e2m1 codes uniform, e8m0 scales
// around 2^-6 (values of the spread of random_bf16's).
StatusOr<kernels::cpu::PackedLinear> random_mxfp4(int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> blocks(static_cast<size_t>(n * k / 2)),
      scales(static_cast<size_t>(n * k / 32));
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(119 + rng() % 4);
  return kernels::cpu::PackedLinear::pack_mxfp4(blocks.data(), scales.data(), n, k);
}

// The compute roof of a row: the AMX tiles' peak for bf16 weights at the amx
// level (oneDNN runs them on tiles); the vdpbf16ps peak for the other GEMMs
// at the levels that run them as bf16 dot products (avx512bf16, amx: int8
// weights); the fp32 FMA peak for everything else (the panel levels widen
// bf16/int8 to fp32; attention runs in fp32).
std::pair<double, const char*> compute_peak(const KernelBenchRow& r, const MachineLimits& m) {
  if (m.amx_flops > 0 && r.kernel == "expert_ffn" && r.weights == "bf16") {
    return {m.amx_flops, "amx"};
  }
  if (m.bf16_flops > 0 && r.kernel == "expert_ffn") return {m.bf16_flops, "bf16"};
  return {m.fp32_flops, "fp32"};
}

void finish(KernelBenchRow& r, const MachineLimits& m) {
  const auto [peak, name] = compute_peak(r, m);
  r.peak = name;
  const double t_compute = r.flops / peak, t_memory = r.bytes / m.read_bw;
  r.bound = t_compute > t_memory ? "compute" : "memory";
  r.roofline_fraction = std::max(t_compute, t_memory) / r.seconds;
}

}  // namespace

Json KernelBenchResult::to_json() const {
  Json rows_j = Json::array();
  for (const auto& r : rows) {
    rows_j.push_back({{"kernel", r.kernel},
                      {"weights", r.weights},
                      {"tokens", r.tokens},
                      {"context", r.context},
                      {"kv_block_size", r.kv_block_size},
                      {"ms", r.seconds * 1e3},
                      {"gflops", r.gflops()},
                      {"gb_s", r.gb_s()},
                      {"weight_bytes", r.weight_bytes},
                      {"roofline_fraction", r.roofline_fraction},
                      {"compute_peak", r.peak},
                      {"bound", r.bound}});
  }
  return Json{{"machine", machine.to_json()}, {"results", rows_j}};
}

StatusOr<KernelBenchResult> bench_kernels(const KernelBenchOptions& o,
                                          void (*progress)(const std::string&)) {
  KernelBenchResult res;
  res.machine = measure_machine(o.quick);
  auto report = [&](const KernelBenchRow& r) {
    if (progress == nullptr) return;
    progress(r.kernel + " " + r.weights + " tokens " + std::to_string(r.tokens) +
             (r.context ? " context " + std::to_string(r.context) : std::string()) + ": " +
             std::to_string(r.seconds * 1e3) + " ms");
  };
  if (progress) progress("machine limits measured (" + res.machine.isa + ")");
  const double min_s = o.quick ? o.min_seconds / 4 : o.min_seconds;

  // Expert FFN at the model's shapes.
  const int64_t h = o.hidden, f = o.expert_ffn;
  // Enough experts that their weights (~17 MiB each) do not fit in the caches:
  // calls cycle through them as a layer's experts would, so weights stream from DRAM.
  const int copies = o.quick ? 8 : 16;
  for (const kernels::cpu::WeightFormat fmt : o.weights) {
    std::vector<kernels::cpu::PackedLinear> p13(copies), p2(copies);
    for (int c = 0; c < copies; ++c) {
      if (fmt == kernels::cpu::WeightFormat::kMxfp4) {
        MSI_ASSIGN_OR_RETURN(p13[c], random_mxfp4(2 * f, h, 1 + c));
        MSI_ASSIGN_OR_RETURN(p2[c], random_mxfp4(h, f, 100 + c));
        continue;
      }
      auto w13 = random_bf16(2 * f * h, 0.03f, 1 + c), w2 = random_bf16(h * f, 0.02f, 100 + c);
      MSI_ASSIGN_OR_RETURN(p13[c], kernels::cpu::PackedLinear::pack(w13.data(), 2 * f, h, fmt));
      MSI_ASSIGN_OR_RETURN(p2[c], kernels::cpu::PackedLinear::pack(w2.data(), h, f, fmt));
    }
    for (int64_t m : o.tokens) {
      std::vector<float> x(m * h, 0.5f), y(m * h);
      KernelBenchRow r;
      r.kernel = "expert_ffn";
      r.weights = kernels::cpu::weight_format_name(fmt);
      r.tokens = m;
      int next = 0;
      r.seconds = seconds_per_call(
          [&] {
            kernels::cpu::expert_ffn(p13[next], p2[next], x.data(), m, y.data());
            next = (next + 1) % copies;
          },
          min_s);
      r.flops = 6.0 * h * f * m;
      // Packed weights (int8: one byte each plus a scale per row; mxfp4: 17
      // bytes per 32 values) + activations.
      r.weight_bytes = static_cast<double>(p13[0].bytes() + p2[0].bytes());
      r.bytes = r.weight_bytes + 4.0 * m * (2 * h + 3 * f);
      finish(r, res.machine);
      report(r);
      res.rows.push_back(r);
    }
  }

  // Decode attention: `decode_requests` tokens, each over `context` cached positions,
  // in blocks scattered over a 256 MiB pool (larger than the caches); successive calls
  // read different blocks, as successive layers and micro-batches would.
  const int64_t R = o.decode_requests, kvh = o.kv_heads, hd = o.head_dim, H = o.heads;
  const int64_t block = o.kv_block_size;
  const int64_t block_elems = kvh * block * hd;
  const int64_t pool_blocks = (o.quick ? 64ll << 20 : 256ll << 20) / (2 * 2 * block_elems);
  std::vector<bf16> kpool(pool_blocks * block_elems), vpool(kpool.size());
  {
    std::mt19937_64 rng(7);
    for (auto& x : kpool) x = float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    vpool = kpool;
  }
  kernels::cpu::PagedKvLayer kv{kpool.data(), vpool.data(), block, kvh, hd};
  for (int64_t ctx : o.contexts) {
    const int64_t blocks_per = (ctx + block - 1) / block;
    const int64_t sets = std::max<int64_t>(1, pool_blocks / (R * blocks_per));
    std::vector<int32_t> order(pool_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(ctx);
    std::shuffle(order.begin(), order.end(), rng);
    // Block tables of `sets` disjoint batches of R requests.
    std::vector<std::vector<int32_t>> tables(sets * R);
    for (int64_t i = 0; i < sets * R; ++i) {
      for (int64_t b = 0; b < blocks_per; ++b) {
        tables[i].push_back(order[(i * blocks_per + b) % pool_blocks]);
      }
    }
    std::vector<int32_t> pos(R, static_cast<int32_t>(ctx - 1));
    std::vector<const int32_t*> tp(R);
    std::vector<float> q(R * H * hd, 0.1f), out(q.size());
    int64_t next = 0;
    KernelBenchRow row;
    row.kernel = "decode_attention";
    row.weights = "bf16";  // the KV cache
    row.tokens = R;
    row.context = ctx;
    row.kv_block_size = block;
    row.seconds = seconds_per_call(
        [&] {
          for (int64_t r = 0; r < R; ++r) tp[r] = tables[next * R + r].data();
          next = (next + 1) % sets;
          kernels::cpu::paged_attention(q.data(), R, H, kv, pos.data(), tp.data(), 0.125f,
                                        out.data());
        },
        min_s);
    row.bytes = 2.0 /*K,V*/ * 2.0 /*bf16*/ * R * ctx * kvh * hd;
    row.flops = 4.0 * R * H * hd * ctx;
    finish(row, res.machine);
    report(row);
    res.rows.push_back(row);
  }
  return res;
}

}  // namespace msinfer::bench
