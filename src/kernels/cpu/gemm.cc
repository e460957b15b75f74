#include "msinfer/kernels/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "internal/level.h"
#include "msinfer/core/logging.h"

namespace msinfer::kernels::cpu {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kW8A8:
      return "w8a8";
    case WeightFormat::kMxfp4:
      return "mxfp4";
    default:
      return "bf16";
  }
}

StatusOr<WeightFormat> parse_weight_format(std::string_view name) {
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "int8") return WeightFormat::kInt8;
  if (name == "w8a8") return WeightFormat::kW8A8;
  if (name == "mxfp4") return WeightFormat::kMxfp4;
  return invalid_argument("unknown weight format '" + std::string(name) +
                          "' (expected bf16, int8, w8a8 or mxfp4)");
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

void mxfp4_decode_block(const uint8_t* bytes16, uint8_t scale, bf16* out32) {
  static constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int exp = static_cast<int>(scale) - 127;
  for (int i = 0; i < 16; ++i) {
    out32[2 * i] = float_to_bf16(std::ldexp(kE2m1[bytes16[i] & 0xF], exp));
    out32[2 * i + 1] = float_to_bf16(std::ldexp(kE2m1[bytes16[i] >> 4], exp));
  }
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

void quantize_int8_activations(const float* x, int64_t k, int8_t* q, float* scale) {
  // Written in blocks of 8 with no library call, so that the baseline build
  // (SSE2) vectorises it: it runs on the calling thread for every row of every
  // w8a8 GEMM (~5 M values per decode step of small-mixtral at 64 requests).
  float m8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= k; t += 8) {
    for (int j = 0; j < 8; ++j) m8[j] = std::max(m8[j], std::fabs(x[t + j]));  // NaNs drop out
  }
  for (; t < k; ++t) m8[0] = std::max(m8[0], std::fabs(x[t]));
  float amax = 0;
  for (float v : m8) amax = std::max(amax, v);
  // A row with an inf gets scale inf (its outputs become inf or NaN, as an
  // unquantised GEMM's would); a NaN element becomes 0.
  const float inv = amax > 0 && std::isfinite(amax) ? 127.0f / amax : 0.0f;
  // Round to nearest even by adding and subtracting 1.5 * 2^23 (exact for
  // |v| < 2^22; here |v| <= 127 up to rounding), then clamp; NaN fails both
  // comparisons and the v == v test.
  constexpr float kMagic = 12582912.0f;
  for (t = 0; t < k; ++t) {
    float v = (x[t] * inv + kMagic) - kMagic;
    v = v == v ? std::min(std::max(v, -127.0f), 127.0f) : 0.0f;
    q[t] = static_cast<int8_t>(static_cast<int32_t>(v));
  }
  *scale = amax > 0 ? amax / 127.0f : 1.0f;
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

Status pack_w8a8_panels(const bf16* w, int64_t n, int64_t k, int64_t panel, GemmWeights* out) {
  // The kernels' int32 sums are exact up to K = 2^31 / (255 * 127) = 66,311
  // (the VNNI form multiplies x + 128); past that they could wrap.
  if (k > kW8A8MaxK) {
    return invalid_argument("w8a8: K = " + std::to_string(k) + " is above " +
                            std::to_string(kW8A8MaxK) +
                            ", where the int32 sums could overflow (use --weights int8)");
  }
  out->format = WeightFormat::kW8A8;
  out->n = n;
  out->k = k;
  out->panel = panel;
  out->panels = (n + panel - 1) / panel;
  const int64_t k4 = (k + 3) / 4;
  MSI_RETURN_IF_ERROR(alloc_weight_data(static_cast<size_t>(out->panels * panel * k4 * 4), out));
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  out->scale.assign(static_cast<size_t>(out->panels * panel), 0.f);
  quantize_int8_rows(w, n, k, q.data(), out->scale.data());
  out->colsum.assign(static_cast<size_t>(out->panels * panel), 0);
  int8_t* dst = reinterpret_cast<int8_t*>(out->data.get());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = j / panel, c = j % panel;
    for (int64_t t = 0; t < k; ++t) {
      dst[((p * k4 + t / 4) * panel + c) * 4 + t % 4] = q[j * k + t];
      out->colsum[j] += q[j * k + t];
    }
  }
  return ok_status();
}

Status pack_mxfp4_panels(const uint8_t* blocks, const uint8_t* scales, int64_t n, int64_t k,
                         int64_t panel, GemmWeights* out) {
  if (k % kMxfp4Block != 0) {
    return invalid_argument("mxfp4: K = " + std::to_string(k) + " is not a multiple of " +
                            std::to_string(kMxfp4Block));
  }
  const int64_t g = k / kMxfp4Block;
  for (int64_t i = 0; i < n * g; ++i) {
    if (scales[i] == 0xFF) {
      return invalid_argument("mxfp4: scale [" + std::to_string(i / g) + ", " +
                              std::to_string(i % g) + "] is 255, the e8m0 NaN");
    }
  }
  out->format = WeightFormat::kMxfp4;
  out->n = n;
  out->k = k;
  out->panel = panel;
  out->panels = (n + panel - 1) / panel;
  const int64_t bb = out->mxfp4_block_bytes(), half = panel / 2;
  MSI_RETURN_IF_ERROR(alloc_weight_data(static_cast<size_t>(out->panels * g * bb), out));
  uint8_t* dst = out->data.get();
  // Padding columns: code 0 (value 0) with scale 1 (no denormal scale in the FMAs).
  for (int64_t i = 0; i < out->panels * g; ++i) std::memset(dst + i * bb, 127, panel);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = j / panel, c = j % panel;
    const int shift = c < half ? 0 : 4;
    for (int64_t b = 0; b < g; ++b) {
      uint8_t* blk = dst + (p * g + b) * bb;
      blk[c] = scales[j * g + b];
      const uint8_t* src = blocks + (j * g + b) * 16;
      for (int64_t t = 0; t < kMxfp4Block; ++t) {
        const uint8_t code = (src[t / 2] >> (4 * (t & 1))) & 0xF;
        blk[panel + t * half + c % half] |= static_cast<uint8_t>(code << shift);
      }
    }
  }
  return ok_status();
}

void quantize_w8a8_rows(const float* x, int64_t m, int64_t k, std::vector<int32_t>* q,
                        std::vector<float>* scale) {
  const int64_t k4 = (k + 3) / 4;
  q->assign(static_cast<size_t>(m * k4), 0);
  scale->resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    quantize_int8_activations(x + i * k, k, reinterpret_cast<int8_t*>(q->data() + i * k4),
                              scale->data() + i);
  }
}

}  // namespace internal

StatusOr<PackedLinear> PackedLinear::pack(const bf16* w, int64_t n, int64_t k,
                                          WeightFormat format) {
  return pack(w, n, k, format, active_isa());
}

StatusOr<PackedLinear> PackedLinear::pack(const bf16* w, int64_t n, int64_t k, WeightFormat format,
                                          IsaLevel level) {
  if (n <= 0 || k <= 0 || w == nullptr) return invalid_argument("PackedLinear: empty weight");
  if (format == WeightFormat::kMxfp4) {
    return invalid_argument(
        "PackedLinear: mxfp4 weights are packed from their blocks (pack_mxfp4)");
  }
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

StatusOr<PackedLinear> PackedLinear::pack_mxfp4(const uint8_t* blocks, const uint8_t* scales,
                                                int64_t n, int64_t k) {
  return pack_mxfp4(blocks, scales, n, k, active_isa());
}

StatusOr<PackedLinear> PackedLinear::pack_mxfp4(const uint8_t* blocks, const uint8_t* scales,
                                                int64_t n, int64_t k, IsaLevel level) {
  if (n <= 0 || k <= 0 || blocks == nullptr || scales == nullptr) {
    return invalid_argument("PackedLinear: empty mxfp4 weight");
  }
  if (!isa_supported(level)) {
    return failed_precondition(std::string("PackedLinear: CPU kernel level ") + isa_name(level) +
                               " is not available here (" + isa_description() + ")");
  }
  auto g = std::make_shared<internal::GemmWeights>();
  MSI_RETURN_IF_ERROR(internal::kernels_for(level).pack_mxfp4(blocks, scales, n, k, g.get()));
  g->level = level;
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
