#include "msinfer/kernels/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "internal/level.h"
#include "msinfer/core/logging.h"

namespace msinfer::kernels::cpu {

const char* weight_format_name(WeightFormat f) {
  return f == WeightFormat::kInt8 ? "int8" : "bf16";
}

StatusOr<WeightFormat> parse_weight_format(std::string_view name) {
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "int8") return WeightFormat::kInt8;
  return invalid_argument("unknown weight format '" + std::string(name) +
                          "' (expected bf16 or int8)");
}

int64_t gemm_m_bucket(int64_t m) {
  if (m <= 1) return 1;
  if (m <= 64) {
    int64_t b = 1;
    while (b < m) b *= 2;
    return b;
  }
  return (m + 63) / 64 * 64;
}

void quantize_int8_rows(const bf16* w, int64_t n, int64_t k, int8_t* q, float* scale) {
  for (int64_t j = 0; j < n; ++j) {
    const bf16* row = w + j * k;
    float amax = 0;
    for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(bf16_to_float(row[t])));
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / s;
    scale[j] = s;
    for (int64_t t = 0; t < k; ++t) {
      const float v = std::nearbyint(bf16_to_float(row[t]) * inv);
      q[j * k + t] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

namespace internal {

Status alloc_weight_data(size_t bytes, GemmWeights* out) {
  void* mem = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (mem == nullptr)
    return resource_exhausted("GEMM weight of " + std::to_string(bytes) + " bytes");
  std::memset(mem, 0, bytes);
  out->data.reset(static_cast<uint8_t*>(mem));
  out->data_bytes = bytes;
  return ok_status();
}

Status pack_panels(const bf16* w, int64_t n, int64_t k, WeightFormat format, int64_t panel,
                   GemmWeights* out) {
  out->format = format;
  out->n = n;
  out->k = k;
  out->panel = panel;
  out->panels = (n + panel - 1) / panel;
  const size_t elem = format == WeightFormat::kInt8 ? 1 : 2;
  MSI_RETURN_IF_ERROR(alloc_weight_data(static_cast<size_t>(out->panels * panel * k) * elem, out));
  void* mem = out->data.get();
  if (format == WeightFormat::kBf16) {
    bf16* dst = static_cast<bf16*>(mem);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = j / panel, c = j % panel;
      for (int64_t t = 0; t < k; ++t) dst[(p * k + t) * panel + c] = w[j * k + t];
    }
  } else {
    std::vector<int8_t> q(static_cast<size_t>(n * k));
    out->scale.assign(static_cast<size_t>(out->panels * panel), 0.f);
    quantize_int8_rows(w, n, k, q.data(), out->scale.data());
    int8_t* dst = static_cast<int8_t*>(mem);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = j / panel, c = j % panel;
      for (int64_t t = 0; t < k; ++t) dst[(p * k + t) * panel + c] = q[j * k + t];
    }
  }
  return ok_status();
}

}  // namespace internal

StatusOr<PackedLinear> PackedLinear::pack(const bf16* w, int64_t n, int64_t k,
                                          WeightFormat format) {
  return pack(w, n, k, format, active_isa());
}

StatusOr<PackedLinear> PackedLinear::pack(const bf16* w, int64_t n, int64_t k, WeightFormat format,
                                          IsaLevel level) {
  if (n <= 0 || k <= 0 || w == nullptr) return invalid_argument("PackedLinear: empty weight");
  if (!isa_supported(level)) {
    return failed_precondition(std::string("PackedLinear: CPU kernel level ") + isa_name(level) +
                               " is not available here (" + isa_description() + ")");
  }
  auto g = std::make_shared<internal::GemmWeights>();
  g->level = level;
  MSI_RETURN_IF_ERROR(internal::kernels_for(level).pack(w, n, k, format, g.get()));
  g->level = level;
  g->format = format;
  g->n = n;
  g->k = k;
  PackedLinear p;
  p.n_ = n;
  p.k_ = k;
  p.impl_ = std::move(g);
  return p;
}

size_t PackedLinear::bytes() const { return impl_ ? impl_->bytes() : 0; }
IsaLevel PackedLinear::level() const { return impl_ ? impl_->level : IsaLevel::kGeneric; }
WeightFormat PackedLinear::format() const { return impl_ ? impl_->format : WeightFormat::kBf16; }

void PackedLinear::forward(const float* x, int64_t m, float* y) const {
  if (m <= 0) return;
  MSI_CHECK(impl_) << "PackedLinear used before pack()";
  internal::kernels_for(impl_->level).forward(*impl_, x, m, y);
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
