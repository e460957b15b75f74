#include "internal/weight_loader.h"

#include <cmath>
#include <cstring>

#include "msinfer/core/fp8.h"

namespace msinfer::model::internal {

// Appends the tensor's values as bf16 to out.
void append_bf16(const TensorView& t, std::vector<bf16>& out) {
  const size_t n = static_cast<size_t>(t.numel());
  const size_t at = out.size();
  out.resize(at + n);
  switch (t.dtype) {
    case DType::kBF16:
      std::memcpy(out.data() + at, t.data, n * 2);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[at + i] = float_to_bf16(f16_to_float(h));
      }
      break;
    case DType::kF32:
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, t.data + 4 * i, 4);
        out[at + i] = float_to_bf16(f);
      }
      break;
    case DType::kF8E4M3:  // the raw codes, unscaled: callers apply the block scales
      for (size_t i = 0; i < n; ++i) out[at + i] = float_to_bf16(e4m3_to_float(t.data[i]));
      break;
    case DType::kU8:  // raw bytes (MXFP4 blocks, e8m0 scales): callers refuse them first
      for (size_t i = 0; i < n; ++i) out[at + i] = float_to_bf16(static_cast<float>(t.data[i]));
      break;
  }
}

// Every weight is held as bf16 values, norms included (as an HF bf16 load does).
std::vector<float> to_float(const TensorView& t) {
  std::vector<bf16> b;
  append_bf16(t, b);
  std::vector<float> f(b.size());
  bf16_to_float_n(b.data(), f.data(), static_cast<int64_t>(b.size()));
  return f;
}

// Appends rows [r0, r1) x columns [c0, c1) of the [rows, cols] weight `t` as
// bf16. A float8_e4m3fn weight is dequantised with its block scales (see
// read_weight_bf16 in weights.h); `scale` is then its checked
// <name>_scale_inv, else null.
void append_weight_bf16(const TensorView& t, const TensorView* scale, const ModelConfig& c,
                        int64_t r0, int64_t r1, int64_t c0, int64_t c1, std::vector<bf16>& out) {
  const int64_t cols = t.shape[1];
  if (t.dtype != DType::kF8E4M3) {
    const size_t elem = dtype_size(t.dtype);
    for (int64_t r = r0; r < r1; ++r) {
      TensorView row = t;
      row.shape = {c1 - c0};
      row.data = t.data + static_cast<size_t>(r * cols + c0) * elem;
      append_bf16(row, out);
    }
    return;
  }
  const int64_t sc = scale->shape[1];
  size_t at = out.size();
  out.resize(at + static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = t.data + r * cols;
    const uint8_t* srow = scale->data + 4 * (r / c.fp8_block_rows) * sc;
    for (int64_t col = c0; col < c1; ++col) {
      float s;
      std::memcpy(&s, srow + 4 * (col / c.fp8_block_cols), 4);
      out[at++] = float_to_bf16(e4m3_to_float(row[col]) * s);
    }
  }
}

// The block-scale tensor of the float8 weight `t` ([rows, cols]), checked: a
// float32 [ceil(rows/br), ceil(cols/bc)] of finite positive values.
StatusOr<const TensorView*> fp8_scale(const Checkpoint& ckpt, const ModelConfig& c,
                                      const TensorView& t, const std::string& dir) {
  if (!c.fp8_weights) {
    return invalid_argument(t.file + ": tensor '" + t.name +
                            "' is F8_E4M3 but config.json has no fp8 quantization_config");
  }
  if (t.shape.size() != 2) {
    return invalid_argument(t.file + ": F8_E4M3 tensor '" + t.name + "' has shape " +
                            t.shape_string() + "; block scaling needs a matrix");
  }
  const std::string name = fp8_scale_name(t.name);
  const TensorView* s = ckpt.find(name);
  if (s == nullptr) {
    return invalid_argument(dir + ": tensor '" + name + "' (the block scales of F8_E4M3 '" +
                            t.name + "') is missing");
  }
  const int64_t sr = (t.shape[0] + c.fp8_block_rows - 1) / c.fp8_block_rows;
  const int64_t sc = (t.shape[1] + c.fp8_block_cols - 1) / c.fp8_block_cols;
  if (s->dtype != DType::kF32) {
    return invalid_argument(s->file + ": tensor '" + name + "' has dtype " + dtype_name(s->dtype) +
                            ", expected F32");
  }
  if (s->shape != std::vector<int64_t>{sr, sc}) {
    TensorView want;
    want.shape = {sr, sc};
    return invalid_argument(s->file + ": tensor '" + name + "' has " + s->shape_string() +
                            " blocks, expected " + want.shape_string() + " for " +
                            t.shape_string() + " in " + std::to_string(c.fp8_block_rows) + "x" +
                            std::to_string(c.fp8_block_cols) + " blocks");
  }
  for (int64_t i = 0; i < sr * sc; ++i) {
    float v;
    std::memcpy(&v, s->data + 4 * i, 4);
    if (!(std::isfinite(v) && v > 0)) {
      return invalid_argument(s->file + ": tensor '" + name + "' block [" + std::to_string(i / sc) +
                              ", " + std::to_string(i % sc) + "] has scale " + std::to_string(v) +
                              "; block scales must be finite and > 0");
    }
  }
  return s;
}

Status load_gqa_projections(Loader& ld, const ModelConfig& c, const std::string& a, int atp_rank,
                            int atp, kernels::cpu::WeightFormat fmt, LayerWeights& L) {
  const int64_t h = c.hidden, hd = c.head_dim, H = c.heads, KV = c.kv_heads;
  const int64_t q0 = atp_rank * (H / atp) * hd, q1 = q0 + (H / atp) * hd;
  const int64_t k0 = c.first_kv_head_of_attention_rank(atp_rank, atp) * hd;
  const int64_t k1 = k0 + c.kv_heads_per_attention_rank(atp) * hd;
  MSI_ASSIGN_OR_RETURN(L.qkv, ld.pack_blocks({{a + "q_proj.weight", {H * hd, h}, q0, q1, 0, h},
                                              {a + "k_proj.weight", {KV * hd, h}, k0, k1, 0, h},
                                              {a + "v_proj.weight", {KV * hd, h}, k0, k1, 0, h}},
                                             fmt));
  MSI_ASSIGN_OR_RETURN(L.o,
                       ld.pack_blocks({{a + "o_proj.weight", {h, H * hd}, 0, h, q0, q1}}, fmt));
  if (!c.attention_bias) return ok_status();
  MSI_ASSIGN_OR_RETURN(std::vector<float> qb, ld.vec(a + "q_proj.bias", H * hd));
  MSI_ASSIGN_OR_RETURN(std::vector<float> kb, ld.vec(a + "k_proj.bias", KV * hd));
  MSI_ASSIGN_OR_RETURN(std::vector<float> vb, ld.vec(a + "v_proj.bias", KV * hd));
  L.qkv_bias.assign(qb.begin() + q0, qb.begin() + q1);
  L.qkv_bias.insert(L.qkv_bias.end(), kb.begin() + k0, kb.begin() + k1);
  L.qkv_bias.insert(L.qkv_bias.end(), vb.begin() + k0, vb.begin() + k1);
  return ok_status();
}

}  // namespace msinfer::model::internal
