#include "msinfer/kernels/cpu/gemm.h"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "internal/vec.h"

namespace msinfer::kernels::cpu {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

struct Runtime {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
};

Runtime& runtime() {
  static Runtime* r = new Runtime();
  return *r;
}

dnnl::matmul::primitive_desc make_pd(int64_t m, int64_t n, int64_t k) {
  memory::desc src({m, k}, dt::bf16, tag::ab);
  memory::desc wei({k, n}, dt::bf16, tag::any);
  memory::desc dst({m, n}, dt::f32, tag::ab);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), runtime().engine);
}

struct Packed {
  memory weights;
  memory::desc desc;
};

// Primitive cache keyed by (n, k, m bucket).
class PrimitiveCache {
 public:
  dnnl::matmul get(int64_t m, int64_t n, int64_t k, const memory::desc& packed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_tuple(m, n, k);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    auto pd = make_pd(m, n, k);
    MSI_CHECK(pd.weights_desc() == packed)
        << "oneDNN chose a different weight layout for M = " << m << " (N = " << n
        << ", K = " << k << "); the packed layout is assumed independent of M";
    dnnl::matmul prim(pd);
    cache_.emplace(key, prim);
    return prim;
  }

 private:
  std::mutex mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, dnnl::matmul> cache_;
};

PrimitiveCache& cache() {
  static PrimitiveCache* c = new PrimitiveCache();
  return *c;
}

}  // namespace

int64_t gemm_m_bucket(int64_t m) {
  if (m <= 1) return 1;
  if (m <= 64) {
    int64_t b = 1;
    while (b < m) b *= 2;
    return b;
  }
  return (m + 63) / 64 * 64;
}

StatusOr<PackedLinear> PackedLinear::pack(const bf16* w, int64_t n, int64_t k) {
  if (n <= 0 || k <= 0) return invalid_argument("PackedLinear: empty weight");
  try {
    auto pd = make_pd(1, n, k);
    auto packed = std::make_shared<Packed>();
    packed->desc = pd.weights_desc();
    packed->weights = memory(packed->desc, runtime().engine);
    memory::desc user_desc({k, n}, dt::bf16, tag::ba);  // W [n, k] row-major is W^T in "ba"
    memory user(user_desc, runtime().engine, const_cast<bf16*>(w));
    dnnl::stream s(runtime().engine);
    dnnl::reorder(user, packed->weights).execute(s, user, packed->weights);
    s.wait();
    PackedLinear p;
    p.n_ = n;
    p.k_ = k;
    p.impl_ = packed;
    return p;
  } catch (const dnnl::error& e) {
    return internal_error(std::string("oneDNN packing failed: ") + e.what());
  }
}

size_t PackedLinear::bytes() const {
  if (!impl_) return 0;
  return static_cast<const Packed*>(impl_.get())->desc.get_size();
}

void PackedLinear::forward(const float* x, int64_t m, float* y) const {
  if (m <= 0) return;
  MSI_CHECK(impl_) << "PackedLinear used before pack()";
  const auto* packed = static_cast<const Packed*>(impl_.get());
  const int64_t mb = gemm_m_bucket(m);
  thread_local std::vector<bf16> xs;
  thread_local std::vector<float> ys;
  xs.resize(static_cast<size_t>(mb * k_));
  internal::to_bf16(x, xs.data(), m * k_);
  if (mb > m) std::fill(xs.begin() + m * k_, xs.end(), bf16{0});
  float* out = y;
  if (mb > m) {
    ys.resize(static_cast<size_t>(mb * n_));
    out = ys.data();
  }
  dnnl::matmul prim = cache().get(mb, n_, k_, packed->desc);
  memory src({{mb, k_}, dt::bf16, tag::ab}, runtime().engine, xs.data());
  memory dst({{mb, n_}, dt::f32, tag::ab}, runtime().engine, out);
  thread_local dnnl::stream s(runtime().engine);
  prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, packed->weights}, {DNNL_ARG_DST, dst}});
  s.wait();
  if (out != y) std::copy(ys.begin(), ys.begin() + m * n_, y);
}

void linear_reference(const bf16* w, int64_t n, int64_t k, const float* x, int64_t m, float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) {
        acc += static_cast<double>(round_to_bf16(x[i * k + t])) * bf16_to_float(w[j * k + t]);
      }
      y[i * n + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace msinfer::kernels::cpu
