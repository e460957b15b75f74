// gpt-oss checkpoints (issue 49): config.json as OpenAI publishes it, the
// tiny-gpt-oss preset's HF layout (MXFP4 experts), MXFP4 decoding by hand,
// and bad checkpoints failing at load naming the tensor or field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "msinfer/core/bf16.h"
#include "msinfer/core/model_config.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/moe.h"
#include "msinfer/model/make_model.h"
#include "msinfer/model/safetensors.h"
#include "msinfer/model/weights.h"

namespace msinfer::model {
namespace {

namespace fs = std::filesystem;

std::string make(const std::string& preset) {
  static std::map<std::string, std::string> made;
  auto it = made.find(preset);
  if (it != made.end()) return it->second;
  const std::string dir = (fs::path(::testing::TempDir()) / ("msinfer_" + preset)).string();
  MakeModelOptions o;
  o.preset = preset;
  o.out_dir = dir;
  Status s = make_model(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  made[preset] = dir;
  return dir;
}

// openai/gpt-oss-20b's config.json (the fields the engine reads and a few it ignores).
Json gpt_oss_20b_config() {
  Json types = Json::array();
  for (int i = 0; i < 24; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return Json{{"architectures", {"GptOssForCausalLM"}},
              {"attention_bias", true},
              {"attention_dropout", 0.0},
              {"eos_token_id", 200002},
              {"experts_per_token", 4},
              {"head_dim", 64},
              {"hidden_act", "silu"},
              {"hidden_size", 2880},
              {"initial_context_length", 4096},
              {"intermediate_size", 2880},
              {"layer_types", types},
              {"max_position_embeddings", 131072},
              {"model_type", "gpt_oss"},
              {"num_attention_heads", 64},
              {"num_experts_per_tok", 4},
              {"num_hidden_layers", 24},
              {"num_key_value_heads", 8},
              {"num_local_experts", 32},
              {"pad_token_id", 199999},
              {"quantization_config",
               {{"modules_to_not_convert",
                 {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                  "lm_head"}},
                {"quant_method", "mxfp4"}}},
              {"rms_norm_eps", 1e-05},
              {"rope_scaling",
               {{"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"factor", 32.0},
                {"original_max_position_embeddings", 4096},
                {"rope_type", "yarn"},
                {"truncate", false}}},
              {"rope_theta", 150000},
              {"router_aux_loss_coef", 0.9},
              {"sliding_window", 128},
              {"swiglu_limit", 7.0},
              {"tie_word_embeddings", false},
              {"vocab_size", 201088}};
}

TEST(GptOssConfigTest, ReadsThePublishedConfig) {
  auto c = parse_hf_config(gpt_oss_20b_config(), "gpt-oss-20b/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "GptOssForCausalLM");
  EXPECT_EQ(c->layers, 24);
  EXPECT_EQ(c->moe_layers, 24);
  EXPECT_EQ(c->hidden, 2880);
  EXPECT_EQ(c->expert_ffn, 2880);
  EXPECT_EQ(c->experts, 32);
  EXPECT_EQ(c->top_k, 4);
  EXPECT_EQ(c->heads, 64);
  EXPECT_EQ(c->kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_TRUE(c->mxfp4_experts);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_EQ(c->attention_window(0), 128);
  EXPECT_EQ(c->attention_window(1), 0);
  EXPECT_EQ(c->attention_window(22), 128);
  EXPECT_EQ(c->attention_window(23), 0);
  EXPECT_DOUBLE_EQ(c->swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 150000);
  EXPECT_DOUBLE_EQ(c->yarn_factor, 32);
  EXPECT_EQ(c->yarn_original_max_position, 4096);
  EXPECT_FALSE(c->yarn_truncate);
  // YaRN's concentration 0.1 ln(32) + 1 on cos and sin, no softmax factor.
  EXPECT_NEAR(c->yarn_rope_mscale(), 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{200002});
  EXPECT_TRUE(c->check_executable().ok()) << c->check_executable().to_string();
  // Without layer_types: GptOssConfig's default, the even layers slide.
  Json j = gpt_oss_20b_config();
  j.erase("layer_types");
  auto d = parse_hf_config(j, "config.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->sliding_layers, c->sliding_layers);
}

TEST(GptOssConfigTest, BadConfigsNameTheField) {
  struct Case {
    Json patch;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"sliding_window", 200000}},
       "field 'sliding_window' 200000 is larger than the context (max_position_embeddings 131072)"},
      {{{"sliding_window", 0}}, "field 'sliding_window' must be >= 1"},
      {{{"layer_types", {"sliding_attention"}}}, "field 'layer_types' must be a list of"},
      {{{"layer_types", Json::array()}}, "'layer_types'"},
      {{{"swiglu_limit", -1}}, "'swiglu_limit'"},
      {{{"quantization_config", {{"quant_method", "fp8"}}}},
       "field 'quant_method' 'fp8' is not supported (gpt-oss: mxfp4)"},
      {{{"hidden_size", 2888}}, "field 'hidden_size' 2888 is not a multiple of 32"},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2}}}}, "'rope_type'"},
  };
  for (const Case& k : cases) {
    Json j = gpt_oss_20b_config();
    j.merge_patch(k.patch);
    auto c = parse_hf_config(j, "config.json");
    ASSERT_FALSE(c.ok()) << k.patch.dump();
    EXPECT_NE(c.status().message().find(k.message), std::string::npos)
        << k.patch.dump() << ": " << c.status().message();
  }
  {  // layer_types with a bad entry
    Json j = gpt_oss_20b_config();
    j["layer_types"][3] = "global";
    auto c = parse_hf_config(j, "config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("entry 3 is not sliding_attention or full_attention"),
              std::string::npos)
        << c.status().message();
  }
}

TEST(Mxfp4Test, DecodesBlocksByHand) {
  uint8_t bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  const float e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int scale : {127, 130, 120, 0, 254}) {
    bf16 out[32];
    mxfp4_decode_block(bytes, static_cast<uint8_t>(scale), out);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(bf16_to_float(out[2 * i]), std::ldexp(e2m1[i], scale - 127)) << scale << " " << i;
      EXPECT_EQ(bf16_to_float(out[2 * i + 1]), std::ldexp(e2m1[15 - i], scale - 127))
          << scale << " " << i;
    }
  }
}

TEST(GptOssPresetTest, TinyHasThePublishedLayout) {
  const std::string dir = make("tiny-gpt-oss");
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "GptOssForCausalLM");
  EXPECT_TRUE(c->mxfp4_experts);
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const int64_t h = c->hidden, F = c->expert_ffn, E = c->experts, hd = c->head_dim;
  const std::string p = "model.layers.1.";
  const std::map<std::string, std::pair<std::string, std::vector<int64_t>>> want = {
      {p + "self_attn.q_proj.weight", {"BF16", {c->heads * hd, h}}},
      {p + "self_attn.q_proj.bias", {"BF16", {c->heads * hd}}},
      {p + "self_attn.k_proj.bias", {"BF16", {c->kv_heads * hd}}},
      {p + "self_attn.o_proj.bias", {"BF16", {h}}},
      {p + "self_attn.sinks", {"BF16", {c->heads}}},
      {p + "mlp.router.weight", {"BF16", {E, h}}},
      {p + "mlp.router.bias", {"BF16", {E}}},
      {p + "mlp.experts.gate_up_proj_blocks", {"U8", {E, 2 * F, h / 32, 16}}},
      {p + "mlp.experts.gate_up_proj_scales", {"U8", {E, 2 * F, h / 32}}},
      {p + "mlp.experts.gate_up_proj_bias", {"BF16", {E, 2 * F}}},
      {p + "mlp.experts.down_proj_blocks", {"U8", {E, h, F / 32, 16}}},
      {p + "mlp.experts.down_proj_scales", {"U8", {E, h, F / 32}}},
      {p + "mlp.experts.down_proj_bias", {"BF16", {E, h}}},
  };
  for (const auto& [name, dt] : want) {
    const TensorView* t = ck->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(dtype_name(t->dtype), dt.first) << name;
    EXPECT_EQ(t->shape, dt.second) << name;
  }
  // 4 layers of 19 tensors (two experts' weights in two each), embedding, norm, LM head.
  EXPECT_EQ(ck->tensors().size(), static_cast<size_t>(4 * 19 + 3));
  // The experts' weights decode to values of the drawn spread (N(0, 1/h)).
  const TensorView* b = ck->find(p + "mlp.experts.gate_up_proj_blocks");
  const TensorView* s = ck->find(p + "mlp.experts.gate_up_proj_scales");
  double sum2 = 0;
  const int64_t blocks = s->numel();
  for (int64_t i = 0; i < blocks; ++i) {
    bf16 v[32];
    mxfp4_decode_block(b->data + 16 * i, s->data[i], v);
    for (int j = 0; j < 32; ++j) sum2 += std::pow(bf16_to_float(v[j]), 2);
  }
  EXPECT_NEAR(std::sqrt(sum2 / (32.0 * blocks)) * std::sqrt(double(h)), 1.0, 0.15);
  // Every preset loads, in each weight format.
  for (auto fmt : {kernels::cpu::WeightFormat::kBf16, kernels::cpu::WeightFormat::kInt8,
                   kernels::cpu::WeightFormat::kW8A8, kernels::cpu::WeightFormat::kMxfp4}) {
    LoadOptions o;
    o.weights = fmt;
    auto w = ModelWeights::load(dir, o);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const LayerWeights& L = w->get()->layers()[1];
    EXPECT_EQ(L.qkv_bias.size(), static_cast<size_t>((c->heads + 2 * c->kv_heads) * hd));
    EXPECT_EQ(L.o_bias.size(), static_cast<size_t>(h));
    EXPECT_EQ(L.sinks.size(), static_cast<size_t>(c->heads));
    EXPECT_EQ(L.router_logit_bias.size(), static_cast<size_t>(E));
    EXPECT_EQ(L.experts[3].b13.size(), static_cast<size_t>(2 * F));
    EXPECT_EQ(L.experts[3].b2.size(), static_cast<size_t>(h));
    EXPECT_EQ(L.experts[3].w13.n(), 2 * F);
  }
}

// A copy of tiny-gpt-oss with its tensors changed by `edit`, and its config by `config`.
std::string broken_copy(const std::string& name,
                        const std::function<void(std::vector<TensorToWrite>&,
                                                 std::vector<std::vector<uint8_t>>&)>& edit,
                        const Json& config_patch = Json()) {
  const std::string src = make("tiny-gpt-oss");
  const std::string dir = (fs::path(::testing::TempDir()) / ("gpt_oss_broken_" + name)).string();
  fs::create_directories(dir);
  auto cj = read_json_file((fs::path(src) / "config.json").string());
  EXPECT_TRUE(cj.ok());
  Json config = *cj;
  if (!config_patch.is_null()) config.merge_patch(config_patch);
  EXPECT_TRUE(write_json_file((fs::path(dir) / "config.json").string(), config).ok());
  auto ck = Checkpoint::open(src);
  EXPECT_TRUE(ck.ok());
  std::vector<TensorToWrite> ts;
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(16);
  for (const auto& [n, t] : ck->tensors()) ts.push_back({n, t.dtype, t.shape, t.data});
  edit(ts, keep);
  Status s = write_safetensors((fs::path(dir) / "model.safetensors").string(), ts);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

// --weights mxfp4: the experts stay 4-bit (17 bytes per 32 values, scales
// included) and everything else is bf16; each expert's clamped SwiGLU FFN
// gives what the bf16-decoded load gives: the same bits at the generic, avx2
// and avx512 levels (the mxfp4 kernel is the bf16 one on the decoded values),
// within float rounding at avx512bf16 and amx (vdpbf16ps for bf16). Also per
// expert tp shard (w2's columns by whole blocks).
TEST(GptOssWeightsTest, Mxfp4KeepsExpertsFourBitAndComputesLikeTheDecodedBf16) {
  using kernels::cpu::WeightFormat;
  const std::string dir = make("tiny-gpt-oss");
  for (int tp : {1, 2}) {
    for (int rank = 0; rank < tp; ++rank) {
      LoadOptions ob, om;
      ob.expert_tp_size = om.expert_tp_size = tp;
      ob.expert_tp_rank = om.expert_tp_rank = rank;
      om.weights = WeightFormat::kMxfp4;
      auto wb = ModelWeights::load(dir, ob);
      auto wm = ModelWeights::load(dir, om);
      ASSERT_TRUE(wb.ok()) << wb.status().to_string();
      ASSERT_TRUE(wm.ok()) << wm.status().to_string();
      const ModelConfig& c = wm->get()->config();
      const int64_t h = c.hidden, fs = c.expert_ffn / tp;
      EXPECT_LT(wm->get()->packed_bytes(), wb->get()->packed_bytes());
      const kernels::cpu::IsaLevel level = kernels::cpu::active_isa();
      const bool same_bits = level == kernels::cpu::IsaLevel::kGeneric ||
                             level == kernels::cpu::IsaLevel::kAvx2 ||
                             level == kernels::cpu::IsaLevel::kAvx512;
      const kernels::cpu::ClampedSwiglu act{static_cast<float>(c.swiglu_alpha),
                                            static_cast<float>(c.swiglu_limit)};
      for (int l = 0; l < c.layers; ++l) {
        const LayerWeights& Lb = wb->get()->layers()[l];
        const LayerWeights& Lm = wm->get()->layers()[l];
        EXPECT_EQ(Lm.qkv.format(), WeightFormat::kBf16);
        EXPECT_EQ(Lm.o.format(), WeightFormat::kBf16);
        EXPECT_EQ(Lm.router.format(), WeightFormat::kBf16);
        for (int e = 0; e < c.experts; ++e) {
          const ExpertWeights& eb = Lb.experts[e];
          const ExpertWeights& em = Lm.experts[e];
          ASSERT_EQ(em.w13.format(), WeightFormat::kMxfp4);
          ASSERT_EQ(em.w2.format(), WeightFormat::kMxfp4);
          ASSERT_EQ(em.w13.n(), 2 * fs);
          ASSERT_EQ(em.w2.k(), fs);
          EXPECT_LE(
              em.w13.bytes() + em.w2.bytes(),
              static_cast<size_t>((2 * fs + 31) / 32 * 32 * h + (h + 31) / 32 * 32 * fs) * 17 / 32);
          EXPECT_EQ(em.b13, eb.b13);
          EXPECT_EQ(em.b2, eb.b2);
          for (int64_t rows : {1, 3, 14}) {
            std::vector<float> x(rows * h), yb(rows * h), ym(rows * h);
            for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i + e + l);
            const float* b2 = eb.b2.empty() ? nullptr : eb.b2.data();
            kernels::cpu::expert_ffn_clamped(eb.w13, eb.b13.data(), eb.w2, b2, act, x.data(), rows,
                                             yb.data());
            kernels::cpu::expert_ffn_clamped(em.w13, em.b13.data(), em.w2, b2, act, x.data(), rows,
                                             ym.data());
            if (same_bits) {
              ASSERT_EQ(ym, yb) << "layer " << l << " expert " << e << " rows " << rows;
            } else {
              double err = 0, mx = 1e-30;
              for (size_t i = 0; i < yb.size(); ++i) {
                err = std::max(err, static_cast<double>(std::fabs(ym[i] - yb[i])));
                mx = std::max(mx, static_cast<double>(std::fabs(yb[i])));
              }
              ASSERT_LT(err / mx, 1e-5) << "layer " << l << " expert " << e << " rows " << rows;
            }
          }
        }
      }
    }
  }
}

TEST(GptOssWeightsTest, Mxfp4OnACheckpointWithoutMxfp4ExpertsIsAnError) {
  LoadOptions o;
  o.weights = kernels::cpu::WeightFormat::kMxfp4;
  auto w = ModelWeights::load(make("tiny-mixtral"), o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("--weights mxfp4"), std::string::npos)
      << w.status().to_string();
  EXPECT_NE(w.status().message().find("quant_method"), std::string::npos) << w.status().to_string();
}

TEST(GptOssWeightsTest, BrokenCheckpointsAreLoadErrorsNamingTheTensor) {
  const std::string x = "model.layers.2.mlp.experts.";
  auto find = [](std::vector<TensorToWrite>& ts, const std::string& n) {
    return std::find_if(ts.begin(), ts.end(), [&](const TensorToWrite& t) { return t.name == n; });
  };
  struct Case {
    std::string name;
    std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<uint8_t>>&)> edit;
    std::string message;
    Json config = Json();
  };
  const std::vector<Case> cases = {
      {"missing_scales", [&](auto& ts, auto&) { ts.erase(find(ts, x + "down_proj_scales")); },
       "tensor '" + x + "down_proj_scales' (the e8m0 scales of MXFP4 '" + x +
           "down_proj_blocks') is missing"},
      {"scales_shape",
       [&](auto& ts, auto&) {
         auto it = find(ts, x + "gate_up_proj_scales");
         it->shape = {it->shape[0], it->shape[2], it->shape[1]};  // same bytes, transposed
       },
       "tensor '" + x + "gate_up_proj_scales' has shape [8, 3, 128], expected [8, 128, 3]"},
      {"scales_dtype",
       [&](auto& ts, auto&) {
         auto it = find(ts, x + "gate_up_proj_scales");
         it->dtype = DType::kBF16;
         it->shape = {it->shape[0], it->shape[1], it->shape[2] / 3};  // a shape with fewer bytes
       },
       "tensor '" + x + "gate_up_proj_scales' has shape [8, 128, 1], expected [8, 128, 3]"},
      {"scale_nan",
       [&](auto& ts, auto& keep) {
         auto it = find(ts, x + "down_proj_scales");
         keep.emplace_back(static_cast<const uint8_t*>(it->data),
                           static_cast<const uint8_t*>(it->data) + 8 * 96 * 2);
         keep.back()[(5 * 96 + 7) * 2 + 1] = 0xFF;
         it->data = keep.back().data();
       },
       "tensor '" + x + "down_proj_scales' [5, 7, 1] is 255, the e8m0 NaN"},
      {"missing_blocks", [&](auto& ts, auto&) { ts.erase(find(ts, x + "gate_up_proj_blocks")); },
       "tensor '" + x + "gate_up_proj_blocks' is missing"},
      {"missing_sinks",
       [&](auto& ts, auto&) { ts.erase(find(ts, "model.layers.1.self_attn.sinks")); },
       "tensor 'model.layers.1.self_attn.sinks' is missing"},
      {"window", [](auto&, auto&) {},
       "field 'sliding_window' 131073 is larger than the context (max_position_embeddings 131072)",
       Json{{"sliding_window", 131073}}},
  };
  for (const Case& k : cases) {
    const std::string dir = broken_copy(k.name, k.edit, k.config);
    auto w = ModelWeights::load(dir);
    ASSERT_FALSE(w.ok()) << k.name;
    EXPECT_NE(w.status().message().find(k.message), std::string::npos)
        << k.name << ": " << w.status().message();
  }
  // An expert worker that loads no experts reads none of the expert tensors,
  // and one that loads some reads the scales it needs.
  const std::string dir = broken_copy(
      "missing_scales_attn", [&](auto& ts, auto&) { ts.erase(find(ts, x + "down_proj_scales")); });
  LoadOptions attention_only;
  attention_only.all_experts = false;
  EXPECT_TRUE(ModelWeights::load(dir, attention_only).ok());
}

}  // namespace
}  // namespace msinfer::model
