// gpt-oss layers: GQA with sinks and biases, MXFP4 or bf16 experts.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "internal/weight_loader.h"
#include "msinfer/core/logging.h"

namespace msinfer::model::internal {

using kernels::cpu::PackedLinear;

bool is_gpt_oss(const ModelConfig& c) { return c.architecture == "GptOssForCausalLM"; }

namespace {

// The float values of a float tensor that may be stacked ([E, n]: all of it).
StatusOr<std::vector<float>> float_tensor(Loader& ld, const std::string& name,
                                          std::vector<int64_t> shape) {
  MSI_ASSIGN_OR_RETURN(const TensorView* t, ld.get(name, std::move(shape)));
  if (t->dtype == DType::kF8E4M3 || t->dtype == DType::kU8) {
    return invalid_argument(t->file + ": tensor '" + name + "' is " + dtype_name(t->dtype) +
                            "; expected a float type");
  }
  return to_float(*t);
}

// One gpt-oss MXFP4 expert tensor (`base` = "...mlp.experts.gate_up_proj" or
// "...down_proj", [E, rows, cols] in value terms), checked: `base`_blocks U8
// [E, rows, cols / 32, 16] and `base`_scales U8 [E, rows, cols / 32].
struct Mxfp4Tensor {
  const TensorView* blocks = nullptr;
  const TensorView* scales = nullptr;
  int64_t rows = 0, cols = 0;
  // Row r of expert e as bf16 (exact: an e2m1 value times a power of two).
  void row(int64_t e, int64_t r, bf16* out) const {
    const int64_t g = cols / 32;
    const uint8_t* b = blocks->data + (e * rows + r) * g * 16;
    const uint8_t* sc = scales->data + (e * rows + r) * g;
    for (int64_t j = 0; j < g; ++j) mxfp4_decode_block(b + j * 16, sc[j], out + j * 32);
  }
  // Row r of expert e as stored: cols / 32 blocks of 16 bytes, and their scales.
  const uint8_t* row_blocks(int64_t e, int64_t r) const {
    return blocks->data + (e * rows + r) * (cols / 32) * 16;
  }
  const uint8_t* row_scales(int64_t e, int64_t r) const {
    return scales->data + (e * rows + r) * (cols / 32);
  }
};

StatusOr<Mxfp4Tensor> mxfp4_tensor(Loader& ld, const Checkpoint& ckpt, const std::string& dir,
                                   const std::string& base, int64_t E, int64_t rows, int64_t cols) {
  const std::string bn = base + "_blocks", sn = base + "_scales";
  if (ckpt.find(sn) == nullptr) {
    ld.skip(sn);
    return invalid_argument(dir + ": tensor '" + sn + "' (the e8m0 scales of MXFP4 '" + bn +
                            "') is missing");
  }
  Mxfp4Tensor m;
  m.rows = rows;
  m.cols = cols;
  MSI_ASSIGN_OR_RETURN(m.blocks, ld.get(bn, {E, rows, cols / 32, 16}));
  MSI_ASSIGN_OR_RETURN(m.scales, ld.get(sn, {E, rows, cols / 32}));
  for (const TensorView* t : {m.blocks, m.scales}) {
    if (t->dtype != DType::kU8) {
      return invalid_argument(t->file + ": tensor '" + t->name + "' has dtype " +
                              dtype_name(t->dtype) + ", expected U8 (MXFP4)");
    }
  }
  const int64_t n = m.scales->numel();
  for (int64_t i = 0; i < n; ++i) {
    if (m.scales->data[i] == 0xFF) {  // e8m0's NaN
      const int64_t g = cols / 32;
      return invalid_argument(m.scales->file + ": tensor '" + sn + "' [" +
                              std::to_string(i / g / rows) + ", " + std::to_string(i / g % rows) +
                              ", " + std::to_string(i % g) + "] is 255, the e8m0 NaN");
    }
  }
  return m;
}

}  // namespace

// One gpt-oss decoder layer: GQA with biases on q/k/v/o and a sink per head,
// the router Linear with its bias, and the experts stored stacked
// (mlp.experts.gate_up_proj_* / down_proj_*, MXFP4, with biases). HF's
// gate_up_proj interleaves its output rows (2j: gate j, 2j + 1: up j); w13
// takes the gate rows first, then the up rows, as for every other model, and
// b13 the same order. Attention tp and expert tp slice as in the GQA loader.
Status load_gpt_oss_layer(Loader& ld, const Checkpoint& ckpt, const std::string& dir,
                          const ModelConfig& c, int i, const LoadOptions& options,
                          LayerWeights& L) {
  const std::string p = layer_prefix(i), a = p + "self_attn.", x = p + "mlp.experts.";
  const kernels::cpu::WeightFormat fmt = dense_format(options.weights);
  const int64_t h = c.hidden, H = c.heads, F = c.expert_ffn;
  const int64_t E = c.experts;
  const int atp = options.attention_tp_size, atp_rank = options.attention_tp_rank;
  const bool rest = options.attention && atp_rank == 0;
  std::vector<std::string> rest_names = {p + "input_layernorm.weight",
                                         p + "post_attention_layernorm.weight",
                                         p + "mlp.router.weight", p + "mlp.router.bias"};
  std::vector<std::string> attn_names = {a + "sinks"};
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    attn_names.push_back(a + m + ".weight");
    attn_names.push_back(a + m + ".bias");
  }
  if (!options.attention) {
    for (const auto& n : attn_names) ld.skip(n);
  } else {
    MSI_RETURN_IF_ERROR(load_gqa_projections(ld, c, a, atp_rank, atp, fmt, L));
    if (c.attention_bias) {
      MSI_ASSIGN_OR_RETURN(std::vector<float> ob, ld.vec(a + "o_proj.bias", h));
      if (rest) L.o_bias = std::move(ob);
    }
    MSI_ASSIGN_OR_RETURN(std::vector<float> sinks, ld.vec(a + "sinks", H));
    const int64_t h0 = atp_rank * (H / atp);  // this rank's first head
    L.sinks.assign(sinks.begin() + h0, sinks.begin() + h0 + H / atp);
  }
  if (rest) {
    MSI_ASSIGN_OR_RETURN(L.input_norm, ld.vec(p + "input_layernorm.weight", h));
    MSI_ASSIGN_OR_RETURN(L.post_attn_norm, ld.vec(p + "post_attention_layernorm.weight", h));
    MSI_ASSIGN_OR_RETURN(
        L.router, ld.pack({{p + "mlp.router.weight", {E, h}}}, kernels::cpu::WeightFormat::kBf16));
    MSI_ASSIGN_OR_RETURN(L.router_logit_bias, ld.vec(p + "mlp.router.bias", E));
  } else {
    for (const auto& n : rest_names) ld.skip(n);
  }
  L.experts.resize(E);
  std::vector<int> wanted;
  for (int e = 0; e < E; ++e) {
    if (options.all_experts ||
        std::find(options.experts.begin(), options.experts.end(), e) != options.experts.end()) {
      wanted.push_back(e);
    }
  }
  const std::vector<std::string> expert_names = {
      x + "gate_up_proj_blocks", x + "gate_up_proj_scales", x + "gate_up_proj_bias",
      x + "down_proj_blocks",    x + "down_proj_scales",    x + "down_proj_bias"};
  if (wanted.empty()) {
    for (const auto& n : expert_names) ld.skip(n);
    return ok_status();
  }
  if (!c.mxfp4_experts) {
    return invalid_argument(dir +
                            ": gpt-oss experts are read as MXFP4 only (config.json "
                            "quantization_config {\"quant_method\": \"mxfp4\"})");
  }
  MSI_ASSIGN_OR_RETURN(Mxfp4Tensor gu,
                       mxfp4_tensor(ld, ckpt, dir, x + "gate_up_proj", E, 2 * F, h));
  MSI_ASSIGN_OR_RETURN(Mxfp4Tensor dn, mxfp4_tensor(ld, ckpt, dir, x + "down_proj", E, h, F));
  MSI_ASSIGN_OR_RETURN(std::vector<float> gu_bias,
                       float_tensor(ld, x + "gate_up_proj_bias", {E, 2 * F}));
  MSI_ASSIGN_OR_RETURN(std::vector<float> dn_bias, float_tensor(ld, x + "down_proj_bias", {E, h}));
  const int64_t tp = options.expert_tp_size, tp_rank = options.expert_tp_rank;
  const int64_t f0 = tp_rank * (F / tp), f1 = f0 + F / tp, fs = f1 - f0;
  if (options.weights == kernels::cpu::WeightFormat::kMxfp4) {
    // Kept 4-bit: the same rows (and w2's columns) as below, copied block by
    // block; a shard's columns of w2 must be whole blocks.
    if (fs % 32 != 0) {
      return invalid_argument(dir + ": --weights mxfp4 with tp_expert " + std::to_string(tp) +
                              ": the shard's FFN width " + std::to_string(fs) +
                              " is not a multiple of 32 (MXFP4's block)");
    }
    const int64_t gh = h / 32, gs = fs / 32, b0 = f0 / 32;
    std::vector<uint8_t> b13(static_cast<size_t>(2 * fs * gh * 16)),
        s13(static_cast<size_t>(2 * fs * gh));
    std::vector<uint8_t> b2(static_cast<size_t>(h * gs * 16)), s2(static_cast<size_t>(h * gs));
    for (int e : wanted) {
      ExpertWeights& ew = L.experts[e];
      ew.b13.resize(2 * fs);
      for (int64_t j = f0; j < f1; ++j) {
        for (int64_t half = 0; half < 2; ++half) {  // gate row j - f0, up row fs + j - f0
          const int64_t dst = half * fs + j - f0;
          std::memcpy(b13.data() + dst * gh * 16, gu.row_blocks(e, 2 * j + half), gh * 16);
          std::memcpy(s13.data() + dst * gh, gu.row_scales(e, 2 * j + half), gh);
          ew.b13[dst] = gu_bias[e * 2 * F + 2 * j + half];
        }
      }
      for (int64_t r = 0; r < h; ++r) {
        std::memcpy(b2.data() + r * gs * 16, dn.row_blocks(e, r) + b0 * 16, gs * 16);
        std::memcpy(s2.data() + r * gs, dn.row_scales(e, r) + b0, gs);
      }
      MSI_ASSIGN_OR_RETURN(ew.w13, PackedLinear::pack_mxfp4(b13.data(), s13.data(), 2 * fs, h));
      MSI_ASSIGN_OR_RETURN(ew.w2, PackedLinear::pack_mxfp4(b2.data(), s2.data(), h, fs));
      if (tp_rank == 0) ew.b2.assign(dn_bias.begin() + e * h, dn_bias.begin() + (e + 1) * h);
    }
  } else {
    std::vector<bf16> w13(static_cast<size_t>(2 * fs * h)), row(static_cast<size_t>(F));
    std::vector<bf16> w2(static_cast<size_t>(h * fs));
    for (int e : wanted) {
      ExpertWeights& ew = L.experts[e];
      ew.b13.resize(2 * fs);
      for (int64_t j = f0; j < f1; ++j) {
        gu.row(e, 2 * j, w13.data() + (j - f0) * h);
        gu.row(e, 2 * j + 1, w13.data() + (fs + j - f0) * h);
        ew.b13[j - f0] = gu_bias[e * 2 * F + 2 * j];
        ew.b13[fs + j - f0] = gu_bias[e * 2 * F + 2 * j + 1];
      }
      for (int64_t r = 0; r < h; ++r) {
        dn.row(e, r, row.data());
        std::memcpy(w2.data() + r * fs, row.data() + f0, sizeof(bf16) * fs);
      }
      MSI_ASSIGN_OR_RETURN(ew.w13, PackedLinear::pack(w13.data(), 2 * fs, h, fmt));
      MSI_ASSIGN_OR_RETURN(ew.w2, PackedLinear::pack(w2.data(), h, fs, fmt));
      if (tp_rank == 0) ew.b2.assign(dn_bias.begin() + e * h, dn_bias.begin() + (e + 1) * h);
    }
  }
  for (const Mxfp4Tensor* m : {&gu, &dn}) {
    ld.release(*m->blocks);
    ld.release(*m->scales);
  }
  return ok_status();
}

}  // namespace msinfer::model::internal
