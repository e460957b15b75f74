// bf16 GEMMs through oneDNN's matmul with pre-packed weights: the amx level's
// GEMM (oneDNN uses AMX tiles there). The avx512bf16 level used it too until
// its own vdpbf16ps kernel measured faster at small M on Zen 5 (docs/benchmarks-history.md);
// oneDNN 2.6 has no bf16 matmul on AVX2 and no bf16/f16 weights with f32
// activations, so the lower levels use msinfer's own panel kernels. Primitives are created per (N,
// K, M bucket) and cached; M is bucketed and padded so a serving loop creates only a few.
#include <cstdlib>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "internal/level.h"
#include "msinfer/core/logging.h"

namespace msinfer::kernels::cpu::internal {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

// `weights`: the packed layout the primitive must read (null: oneDNN picks).
dnnl::matmul::primitive_desc make_pd(int64_t m, int64_t n, int64_t k,
                                     const memory::desc* weights = nullptr) {
  memory::desc src({m, k}, dt::bf16, tag::ab);
  memory::desc wei = weights ? *weights : memory::desc({k, n}, dt::bf16, tag::any);
  memory::desc dst({m, n}, dt::f32, tag::ab);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), engine());
}

struct OnednnWeights {
  memory weights;
  memory::desc desc;
};

// Primitive cache keyed by (m bucket, n, k).
class PrimitiveCache {
 public:
  dnnl::matmul get(int64_t m, int64_t n, int64_t k, const memory::desc& packed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_tuple(m, n, k);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    // The weights were packed once, in the layout oneDNN picks for M = 1;
    // every M reads that layout. Left to choose, oneDNN 2.6 picks by M and
    // thread count: on an AMX CPU with two threads, N = 64 gets 64-column
    // blocks at M < 8 (avx512_core_bf16) and 32-column ones from M = 8 on
    // (AMX), and the AMX kernel takes the 64-column layout as well.
    dnnl::matmul::primitive_desc pd;
    try {
      pd = make_pd(m, n, k, &packed);
    } catch (const dnnl::error& e) {
      MSI_CHECK(false) << "oneDNN has no bf16 matmul for M = " << m << " (N = " << n
                       << ", K = " << k << ") on the weights' packed layout: " << e.what();
    }
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

Status onednn_probe() {
  try {
    auto pd = make_pd(1, 32, 32);
    dnnl::matmul prim(pd);
    return ok_status();
  } catch (const dnnl::error& e) {
    return internal_error(std::string("oneDNN bf16 matmul: ") + e.what());
  }
}

Status onednn_pack(const bf16* w, int64_t n, int64_t k, GemmWeights* out) {
  try {
    auto pd = make_pd(1, n, k);
    auto packed = std::make_shared<OnednnWeights>();
    packed->desc = pd.weights_desc();
    packed->weights = memory(packed->desc, engine());
    memory::desc user_desc({k, n}, dt::bf16, tag::ba);  // W [n, k] row-major is W^T in "ba"
    memory user(user_desc, engine(), const_cast<bf16*>(w));
    dnnl::stream s(engine());
    dnnl::reorder(user, packed->weights).execute(s, user, packed->weights);
    s.wait();
    out->onednn_bytes = packed->desc.get_size();
    out->onednn = packed;
    return ok_status();
  } catch (const dnnl::error& e) {
    return internal_error(std::string("oneDNN packing failed: ") + e.what());
  }
}

void onednn_forward(const GemmWeights& w, const float* x, int64_t m, float* y) {
  const auto* packed = static_cast<const OnednnWeights*>(w.onednn.get());
  const int64_t mb = gemm_m_bucket(m), k = w.k, n = w.n;
  thread_local std::vector<bf16> xs;
  thread_local std::vector<float> ys;
  xs.resize(static_cast<size_t>(mb * k));
  kernels_for(w.level).to_bf16(x, xs.data(), m * k);
  if (mb > m) std::fill(xs.begin() + m * k, xs.end(), bf16{0});
  float* out = y;
  if (mb > m) {
    ys.resize(static_cast<size_t>(mb * n));
    out = ys.data();
  }
  dnnl::matmul prim = cache().get(mb, n, k, packed->desc);
  memory src({{mb, k}, dt::bf16, tag::ab}, engine(), xs.data());
  memory dst({{mb, n}, dt::f32, tag::ab}, engine(), out);
  thread_local dnnl::stream s(engine());
  prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, packed->weights}, {DNNL_ARG_DST, dst}});
  s.wait();
  if (out != y) std::copy(ys.begin(), ys.begin() + m * n, y);
}

}  // namespace msinfer::kernels::cpu::internal
