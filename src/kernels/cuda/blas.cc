// GEMMs of the CUDA backend: cuBLASLt for the dense projections (an algorithm
// chosen by cuBLASLt's heuristic once per shape), cuBLAS's grouped GEMM for
// the experts' FFN, one call per projection over every expert with rows.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <map>
#include <tuple>

#include "msinfer/kernels/cuda/cuda.h"

namespace msinfer::kernels::cuda {
namespace {

constexpr size_t kLtWorkspace = 32ull << 20;

Status blas_error(const char* what, int code) {
  return internal_error(std::string("cuBLAS ") + what + " failed (status " + std::to_string(code) +
                        ")");
}

#define MSI_CUBLAS(call)                                      \
  do {                                                        \
    const auto _st = (call);                                  \
    if (_st != CUBLAS_STATUS_SUCCESS) return blas_error(#call, static_cast<int>(_st)); \
  } while (0)

}  // namespace

struct Blas::Impl {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  DeviceBuffer lt_ws, xb, gu, act, yb, ptrs;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans;
  bool grouped_ok = true;  // false once cuBLAS refused the grouped GEMM here

  ~Impl() {
    for (auto& [k, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
    }
    if (lt) cublasLtDestroy(lt);
    if (blas) cublasDestroy(blas);
  }

  // C (n x m, column-major) = W^T (W stored k x n column-major = [n, k] row-major) * X.
  StatusOr<const Plan*> plan(int64_t m, int64_t n, int64_t k) {
    const auto key = std::make_tuple(m, n, k);
    auto it = plans.find(key);
    if (it != plans.end()) return &it->second;
    Plan p;
    MSI_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    MSI_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    MSI_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    MSI_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));
    MSI_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k));
    MSI_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    MSI_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kLtWorkspace;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const auto st = cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res,
                                                   &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      return blas_error("cublasLtMatmulAlgoGetHeuristic (no algorithm for this shape)",
                        static_cast<int>(st));
    }
    p.algo = res.algo;
    return &(plans[key] = p);
  }
};

StatusOr<std::unique_ptr<Blas>> Blas::create(cudaStream_t s) {
  std::unique_ptr<Blas> b(new Blas(s));
  b->impl_ = std::make_unique<Impl>();
  MSI_CUBLAS(cublasLtCreate(&b->impl_->lt));
  MSI_CUBLAS(cublasCreate(&b->impl_->blas));
  MSI_CUBLAS(cublasSetStream(b->impl_->blas, s));
  MSI_RETURN_IF_ERROR(b->impl_->lt_ws.reserve(kLtWorkspace));
  return b;
}

Blas::Blas(cudaStream_t s) : stream_(s) {}
Blas::~Blas() = default;

size_t Blas::scratch_bytes() const {
  const Impl& i = *impl_;
  return i.lt_ws.bytes() + i.xb.bytes() + i.gu.bytes() + i.act.bytes() + i.yb.bytes() +
         i.ptrs.bytes();
}

Status Blas::linear(const float* x, int64_t m, const DeviceMatrix& w, float* y) {
  if (m == 0) return ok_status();
  MSI_RETURN_IF_ERROR(impl_->xb.reserve(static_cast<size_t>(m * w.k) * 2));
  to_bf16(x, m * w.k, impl_->xb.as<bf16>(), stream_);
  return linear_bf16(impl_->xb.as<bf16>(), m, w, y);
}

Status Blas::linear_bf16(const bf16* x, int64_t m, const DeviceMatrix& w, float* y) {
  if (m == 0) return ok_status();
  MSI_ASSIGN_OR_RETURN(const Impl::Plan* p, impl_->plan(m, w.n, w.k));
  const float one = 1.f, zero = 0.f;
  MSI_CUBLAS(cublasLtMatmul(impl_->lt, p->desc, &one, w.w, p->a, x, p->b, &zero, y, p->c, y, p->c,
                            &p->algo, impl_->lt_ws.as<void>(), kLtWorkspace, stream_));
  return ok_status();
}

Status Blas::expert_ffn(const std::vector<ExpertMatrices>& experts,
                        const std::vector<int64_t>& offset, const float* x, float* y) {
  Impl& im = *impl_;
  const int64_t rows = offset.back();
  if (rows == 0 || experts.empty()) return ok_status();
  int64_t h = 0, f = 0;
  for (size_t i = 0; i + 1 < offset.size(); ++i) {
    if (offset[i + 1] > offset[i]) {
      h = experts[i].w13.k, f = experts[i].w2.k;
      break;
    }
  }
  MSI_RETURN_IF_ERROR(im.xb.reserve(static_cast<size_t>(rows * h) * 2));
  MSI_RETURN_IF_ERROR(im.gu.reserve(static_cast<size_t>(rows * 2 * f) * 2));
  MSI_RETURN_IF_ERROR(im.act.reserve(static_cast<size_t>(rows * f) * 2));
  MSI_RETURN_IF_ERROR(im.yb.reserve(static_cast<size_t>(rows * h) * 2));
  bf16* xb = im.xb.as<bf16>();
  bf16* gu = im.gu.as<bf16>();
  bf16* act = im.act.as<bf16>();
  bf16* yb = im.yb.as<bf16>();
  to_bf16(x, rows * h, xb, stream_);

  // The experts with rows, one group each (their row counts differ).
  std::vector<int> which;
  for (size_t i = 0; i + 1 < offset.size(); ++i) {
    if (offset[i + 1] > offset[i]) which.push_back(static_cast<int>(i));
  }
  const int G = static_cast<int>(which.size());
  std::vector<cublasOperation_t> ta(G, CUBLAS_OP_T), tb(G, CUBLAS_OP_N);
  std::vector<int> m1(G), n1(G), k1(G), lda1(G), ldb1(G), ldc1(G);
  std::vector<int> m2(G), k2(G), lda2(G), ldb2(G), ldc2(G), one_each(G, 1);
  std::vector<float> alpha(G, 1.f), beta(G, 0.f);
  // Device pointer arrays: A1 B1 C1 A2 B2 C2, G each.
  std::vector<const void*> host_ptrs(6 * static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    const ExpertMatrices& e = experts[which[g]];
    const int64_t r0 = offset[which[g]], n = offset[which[g] + 1] - r0;
    m1[g] = static_cast<int>(2 * f), n1[g] = static_cast<int>(n), k1[g] = static_cast<int>(h);
    lda1[g] = static_cast<int>(h), ldb1[g] = static_cast<int>(h), ldc1[g] = static_cast<int>(2 * f);
    m2[g] = static_cast<int>(h), k2[g] = static_cast<int>(f);
    lda2[g] = static_cast<int>(f), ldb2[g] = static_cast<int>(f), ldc2[g] = static_cast<int>(h);
    host_ptrs[0 * G + g] = e.w13.w;
    host_ptrs[1 * G + g] = xb + r0 * h;
    host_ptrs[2 * G + g] = gu + r0 * 2 * f;
    host_ptrs[3 * G + g] = e.w2.w;
    host_ptrs[4 * G + g] = act + r0 * f;
    host_ptrs[5 * G + g] = yb + r0 * h;
  }
  MSI_RETURN_IF_ERROR(im.ptrs.upload(host_ptrs.data(), host_ptrs.size() * sizeof(void*), stream_));
  const void* const* dp = im.ptrs.as<const void* const>();
  void* const* dpm = reinterpret_cast<void* const*>(im.ptrs.as<void*>());

  auto grouped = [&](int which_proj) -> cublasStatus_t {
    const bool first = which_proj == 0;
    return cublasGemmGroupedBatchedEx(
        im.blas, ta.data(), tb.data(), first ? m1.data() : m2.data(), n1.data(),
        first ? k1.data() : k2.data(), alpha.data(), dp + (first ? 0 : 3) * G, CUDA_R_16BF,
        first ? lda1.data() : lda2.data(), dp + (first ? 1 : 4) * G, CUDA_R_16BF,
        first ? ldb1.data() : ldb2.data(), beta.data(), dpm + (first ? 2 : 5) * G, CUDA_R_16BF,
        first ? ldc1.data() : ldc2.data(), G, one_each.data(), CUBLAS_COMPUTE_32F);
  };
  // Where cuBLAS refuses the grouped form, one GEMM per expert (same result).
  auto per_expert = [&](int which_proj) -> Status {
    const bool first = which_proj == 0;
    const float a = 1.f, b = 0.f;
    for (int g = 0; g < G; ++g) {
      MSI_CUBLAS(cublasGemmEx(
          im.blas, CUBLAS_OP_T, CUBLAS_OP_N, first ? m1[g] : m2[g], n1[g], first ? k1[g] : k2[g],
          &a, host_ptrs[(first ? 0 : 3) * G + g], CUDA_R_16BF, first ? lda1[g] : lda2[g],
          host_ptrs[(first ? 1 : 4) * G + g], CUDA_R_16BF, first ? ldb1[g] : ldb2[g], &b,
          const_cast<void*>(host_ptrs[(first ? 2 : 5) * G + g]), CUDA_R_16BF,
          first ? ldc1[g] : ldc2[g], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return ok_status();
  };
  for (int proj = 0; proj < 2; ++proj) {
    if (im.grouped_ok && grouped(proj) != CUBLAS_STATUS_SUCCESS) im.grouped_ok = false;
    if (!im.grouped_ok) MSI_RETURN_IF_ERROR(per_expert(proj));
    if (proj == 0) silu_mul(gu, rows, f, act, stream_);
  }
  to_float(yb, rows * h, y, stream_);
  return ok_status();
}

bool Blas::grouped() const { return impl_->grouped_ok; }

StatusOr<double> measure_copy_bandwidth(size_t bytes, int reps) {
  DeviceBuffer a, b;
  MSI_RETURN_IF_ERROR(a.reserve(bytes));
  MSI_RETURN_IF_ERROR(b.reserve(bytes));
  cudaMemset(a.as<void>(), 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice);  // warm-up
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) cudaMemcpy(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  MSI_RETURN_IF_ERROR(check("measure_copy_bandwidth"));
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3);
}

}  // namespace msinfer::kernels::cuda
