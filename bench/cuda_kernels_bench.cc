#include "msinfer/bench/cuda_kernels_bench.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "msinfer/kernels/cuda/cuda.h"

namespace msinfer::bench {
namespace {

namespace cu = kernels::cuda;

// Seconds per call of f (enqueued on stream s): warm-up, then reps timed with events.
template <typename F>
StatusOr<double> time_calls(cudaStream_t s, int reps, F&& f) {
  for (int i = 0; i < 3; ++i) MSI_RETURN_IF_ERROR(f());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < reps; ++i) MSI_RETURN_IF_ERROR(f());
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  MSI_RETURN_IF_ERROR(cu::check("benchmark"));
  return ms * 1e-3 / reps;
}

Status fill(cu::DeviceBuffer* b, size_t bytes) {
  MSI_RETURN_IF_ERROR(b->reserve(bytes));
  // Small non-zero bf16 values (0x3c00 = 0.0078125) everywhere: zeros would flatter the GEMM.
  std::vector<uint16_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint16_t>(0x3c00 + (i * 7919) % 512);
  for (size_t off = 0; off < bytes; off += pattern.size() * 2) {
    const size_t n = std::min(bytes - off, pattern.size() * 2);
    cudaMemcpy(b->as<char>() + off, pattern.data(), n, cudaMemcpyHostToDevice);
  }
  return cu::check("fill");
}

}  // namespace

StatusOr<Json> bench_cuda_kernels(const CudaKernelBenchOptions& o,
                                  const std::function<void(const std::string&)>& progress) {
  MSI_ASSIGN_OR_RETURN(int index, cu::parse_device(o.device));
  MSI_ASSIGN_OR_RETURN(cu::DeviceInfo dev, cu::open_device(index));
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  MSI_ASSIGN_OR_RETURN(auto blas, cu::Blas::create(s));
  const int reps = o.quick ? 5 : 20;
  Json rows = Json::array();
  auto row = [&](const std::string& kernel, const std::string& shape, double sec, double flops,
                 double bytes, double fraction, const std::string& of) {
    Json r{{"kernel", kernel}, {"shape", shape}, {"seconds", sec}, {"tflops", flops / sec / 1e12},
           {"gb_s", bytes / sec / 1e9}, {"fraction", fraction}, {"of", of}};
    char line[256];
    std::snprintf(line, sizeof line, "%-22s %-34s %9.1f us %8.1f TFLOP/s %8.0f GB/s %5.1f%% of %s",
                  kernel.c_str(), shape.c_str(), sec * 1e6, flops / sec / 1e12, bytes / sec / 1e9,
                  100 * fraction, of.c_str());
    progress(line);
    rows.push_back(std::move(r));
  };

  // Limits.
  MSI_ASSIGN_OR_RETURN(double copy_bw, cu::measure_copy_bandwidth(size_t{2} << 30, reps));
  const int64_t P = 8192;
  cu::DeviceBuffer a, b, c;
  MSI_RETURN_IF_ERROR(fill(&a, P * P * 2));
  MSI_RETURN_IF_ERROR(fill(&b, P * P * 2));
  MSI_RETURN_IF_ERROR(c.reserve(P * P * 4));
  MSI_ASSIGN_OR_RETURN(double gemm_s, time_calls(s, reps, [&] {
                         return blas->linear_bf16(a.as<bf16>(), P, {b.as<bf16>(), P, P}, c.as<float>());
                       }));
  const double peak = 2.0 * P * P * P / gemm_s;
  {
    char line[200];
    std::snprintf(line, sizeof line, "%s: bf16 GEMM %.0f TFLOP/s (cuBLASLt %lldx%lldx%lld), copy %.0f GB/s",
                  dev.name.c_str(), peak / 1e12, (long long)P, (long long)P, (long long)P, copy_bw / 1e9);
    progress(line);
  }
  a = {};
  b = {};
  c = {};

  // Experts: Mixtral-8x7B shapes.
  const int64_t h = 4096, F = 14336, E = 8;
  std::vector<cu::DeviceBuffer> w13(E), w2(E);
  std::vector<cu::ExpertMatrices> mats(E);
  for (int64_t e = 0; e < E; ++e) {
    MSI_RETURN_IF_ERROR(fill(&w13[e], 2 * F * h * 2));
    MSI_RETURN_IF_ERROR(fill(&w2[e], h * F * 2));
    mats[e] = {{w13[e].as<bf16>(), 2 * F, h}, {w2[e].as<bf16>(), h, F}};
  }
  const double weight_bytes = static_cast<double>(E) * 3 * h * F * 2;
  for (int64_t per : {1, 4, 16, 64, 256, 1024, 4096}) {
    if (o.quick && per != 1 && per != 16 && per != 4096) continue;
    const int64_t rows_n = per * E;
    std::vector<int64_t> offset(E + 1);
    for (int64_t e = 0; e <= E; ++e) offset[e] = e * per;
    cu::DeviceBuffer x, y;
    MSI_RETURN_IF_ERROR(x.reserve(rows_n * h * 4));
    MSI_RETURN_IF_ERROR(y.reserve(rows_n * h * 4));
    cudaMemset(x.as<void>(), 0, rows_n * h * 4);
    MSI_ASSIGN_OR_RETURN(double sec, time_calls(s, reps, [&] {
                           return blas->expert_ffn(mats, offset, x.as<float>(), y.as<float>());
                         }));
    const double flops = 2.0 * 3 * h * F * rows_n;
    const double bytes = weight_bytes + rows_n * h * 8.0;
    // Small batches stream the weights (bandwidth-bound), large ones compute.
    const bool bw_bound = flops / peak < bytes / copy_bw;
    row("expert_ffn_grouped", std::to_string(E) + " experts x " + std::to_string(per) + " rows", sec,
        flops, bytes, bw_bound ? bytes / sec / copy_bw : flops / sec / peak,
        bw_bound ? "copy bandwidth" : "bf16 GEMM peak");
  }
  w13.clear();
  w2.clear();

  // Decode attention: 32 query / 8 KV heads of 128, bf16 KV cache.
  const int64_t H = 32, KVH = 8, hd = 128, bs = 16;
  for (auto [T, ctx] : {std::pair<int64_t, int64_t>{1, 4096}, {8, 4096}, {64, 2048}, {64, 8192}}) {
    if (o.quick && T == 64 && ctx == 8192) continue;
    const int64_t blocks_per = (ctx + bs - 1) / bs, blocks = T * blocks_per;
    cu::DeviceBuffer kp, vp, q, out, pos, tab, ws;
    MSI_RETURN_IF_ERROR(fill(&kp, blocks * KVH * bs * hd * 2));
    MSI_RETURN_IF_ERROR(fill(&vp, blocks * KVH * bs * hd * 2));
    MSI_RETURN_IF_ERROR(q.reserve(T * H * hd * 4));
    cudaMemset(q.as<void>(), 0, T * H * hd * 4);
    MSI_RETURN_IF_ERROR(out.reserve(T * H * hd * 4));
    std::vector<int32_t> hp(T, static_cast<int32_t>(ctx - 1)), ht(T * blocks_per);
    for (int64_t i = 0; i < T * blocks_per; ++i) ht[i] = static_cast<int32_t>(i);
    MSI_RETURN_IF_ERROR(pos.upload(hp.data(), hp.size() * 4));
    MSI_RETURN_IF_ERROR(tab.upload(ht.data(), ht.size() * 4));
    MSI_RETURN_IF_ERROR(ws.reserve(cu::attention_workspace_floats(T, H, hd, ctx) * 4));
    const cu::PagedKvLayer kv{kp.as<bf16>(), vp.as<bf16>(), bs, KVH, hd};
    MSI_ASSIGN_OR_RETURN(double sec, time_calls(s, reps, [&] {
                           cu::paged_attention(q.as<float>(), T, H, kv, pos.as<int32_t>(),
                                               tab.as<int32_t>(), blocks_per, ctx, 0.088f,
                                               ws.as<float>(), out.as<float>(), s);
                           return ok_status();
                         }));
    const double bytes = 2.0 * T * ctx * KVH * hd * 2;  // K and V once
    const double flops = 4.0 * T * H * ctx * hd;
    row("decode_attention", std::to_string(T) + " requests x " + std::to_string(ctx) + " context",
        sec, flops, bytes, bytes / sec / copy_bw, "copy bandwidth");
  }

  // Dense projections at decode: QKV (6144 x 4096) for 8 and 64 tokens.
  {
    cu::DeviceBuffer w, x, y;
    const int64_t n = (H + 2 * KVH) * hd, k = h;
    MSI_RETURN_IF_ERROR(fill(&w, n * k * 2));
    for (int64_t m : {8, 64}) {
      MSI_RETURN_IF_ERROR(x.reserve(m * k * 4));
      MSI_RETURN_IF_ERROR(y.reserve(m * n * 4));
      cudaMemset(x.as<void>(), 0, m * k * 4);
      MSI_ASSIGN_OR_RETURN(double sec, time_calls(s, reps, [&] {
                             return blas->linear(x.as<float>(), m, {w.as<bf16>(), n, k}, y.as<float>());
                           }));
      const double bytes = n * k * 2.0 + m * (k + n) * 4.0;
      row("linear_qkv", std::to_string(m) + " tokens x 6144x4096", sec, 2.0 * m * n * k, bytes,
          bytes / sec / copy_bw, "copy bandwidth");
    }
  }
  const bool grouped = blas->grouped();
  blas.reset();
  cudaStreamDestroy(s);
  return Json{{"device", {{"name", dev.name},
                          {"index", dev.index},
                          {"multiprocessors", dev.multiprocessors},
                          {"memory_gib", dev.memory_bytes / 1073741824.0}}},
              {"limits", {{"bf16_gemm_tflops", peak / 1e12}, {"copy_gb_s", copy_bw / 1e9}}},
              {"grouped_gemm", grouped ? "cublasGemmGroupedBatchedEx" : "per-expert cublasGemmEx"},
              {"rows", rows}};
}

}  // namespace msinfer::bench
