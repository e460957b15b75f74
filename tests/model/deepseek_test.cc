// DeepSeek-V2/V3 checkpoints (issue 45): the make-model presets write the
// published HF layout, FP8 block-scaled weights dequantise exactly and broken
// ones fail naming the tensor, and DeepSeek's reference implementation runs on
// both presets through tests/runtime/deepseek_reference.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "../common/subprocess.h"
#include "msinfer/core/bf16.h"
#include "msinfer/core/fp8.h"
#include "msinfer/core/model_config.h"
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

TEST(Fp8Test, E4m3CodesAndRounding) {
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);        // largest finite
  EXPECT_EQ(e4m3_to_float(0x08), 0.015625f);     // smallest normal 2^-6
  EXPECT_EQ(e4m3_to_float(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(e4m3_to_float(0x39), 1.125f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(c))) & 0x7f, c & 0x7f) << c;
  }
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125: even mantissa
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even (1.25)
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);
  EXPECT_EQ(float_to_e4m3(1000.f), 0x7e);  // saturates
  EXPECT_EQ(float_to_e4m3(-1000.f), 0xfe);
}

TEST(DeepSeekPresetTest, TinyV3HasThePublishedLayout) {
  const std::string dir = make("tiny-deepseek-v3");
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c->layers, 2);
  EXPECT_EQ(c->moe_layers, 1);
  EXPECT_EQ(c->nextn_predict_layers, 1);
  EXPECT_EQ(c->topk_method, ModelConfig::TopkMethod::kNoauxTc);
  EXPECT_EQ(c->scoring_func, ModelConfig::ScoringFunc::kSigmoid);
  EXPECT_EQ(c->n_group, 4);
  EXPECT_TRUE(c->fp8_weights);
  EXPECT_GT(c->yarn_factor, 1);
  EXPECT_EQ(c->hidden % 128, 64);  // a partial block of every weight that reads h
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto dtype = [&](const std::string& n) -> std::string {
    const TensorView* t = ck->find(n);
    return t == nullptr ? "missing" : dtype_name(t->dtype);
  };
  for (const std::string p : {"model.layers.0.", "model.layers.1.", "model.layers.2."}) {
    for (const char* w : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}) {
      const std::string n = p + "self_attn." + w + ".weight";
      EXPECT_EQ(dtype(n), "F8_E4M3") << n;
      EXPECT_EQ(dtype(n + "_scale_inv"), "F32") << n;
    }
    EXPECT_EQ(dtype(p + "self_attn.q_a_layernorm.weight"), "BF16");
    EXPECT_EQ(dtype(p + "self_attn.kv_a_layernorm.weight"), "BF16");
    EXPECT_EQ(dtype(p + "self_attn.q_proj.weight"), "missing");
  }
  for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
    EXPECT_EQ(dtype(std::string("model.layers.0.mlp.") + w + ".weight"), "F8_E4M3");
    EXPECT_EQ(dtype(std::string("model.layers.1.mlp.experts.15.") + w + ".weight"), "F8_E4M3");
    EXPECT_EQ(dtype(std::string("model.layers.1.mlp.shared_experts.") + w + ".weight"), "F8_E4M3");
  }
  EXPECT_EQ(dtype("model.layers.0.mlp.gate.weight"), "missing");  // dense layer
  EXPECT_EQ(dtype("model.layers.1.mlp.gate.weight"), "BF16");
  EXPECT_EQ(dtype("model.layers.1.mlp.gate.e_score_correction_bias"), "F32");
  EXPECT_EQ(dtype("model.layers.1.mlp.experts.16.gate_proj.weight"), "missing");
  for (const char* n : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight",
                        "shared_head.norm.weight", "shared_head.head.weight"}) {
    EXPECT_EQ(dtype(std::string("model.layers.2.") + n), "BF16") << n;
  }
  EXPECT_EQ(dtype("model.embed_tokens.weight"), "BF16");
  EXPECT_EQ(dtype("lm_head.weight"), "BF16");
  // Block counts: [96, 192] in 128x128 blocks is 1 x 2; [320, 192] is 3 x 2.
  EXPECT_EQ(ck->find("model.layers.0.self_attn.q_a_proj.weight_scale_inv")->shape,
            (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ck->find("model.layers.0.mlp.gate_proj.weight_scale_inv")->shape,
            (std::vector<int64_t>{3, 2}));
  // Every tensor's data is aligned to its element size (widest dtypes first).
  for (const auto& [name, t] : ck->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name;
  }
}

TEST(DeepSeekPresetTest, TinyV2LiteHasThePublishedLayout) {
  const std::string dir = make("tiny-deepseek-v2-lite");
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "DeepseekV2ForCausalLM");
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->shared_experts, 2);
  EXPECT_EQ(c->topk_method, ModelConfig::TopkMethod::kGreedy);
  EXPECT_FALSE(c->fp8_weights);
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  std::set<std::string> dtypes;
  for (const auto& [name, t] : ck->tensors()) {
    dtypes.insert(dtype_name(t.dtype));
    EXPECT_EQ(name.find("scale_inv"), std::string::npos) << name;
    EXPECT_EQ(name.find("e_score_correction_bias"), std::string::npos) << name;
    EXPECT_EQ(name.find("model.layers.3."), std::string::npos) << name;  // no MTP
  }
  EXPECT_EQ(dtypes, std::set<std::string>{"BF16"});
  const TensorView* q = ck->find("model.layers.1.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{4 * (16 + 8), 64}));
  const TensorView* sh = ck->find("model.layers.1.mlp.shared_experts.up_proj.weight");
  ASSERT_NE(sh, nullptr);
  EXPECT_EQ(sh->shape, (std::vector<int64_t>{2 * 48, 64}));
  EXPECT_NE(ck->find("model.layers.0.mlp.down_proj.weight"), nullptr);
  EXPECT_NE(ck->find("model.layers.2.mlp.experts.7.down_proj.weight"), nullptr);
}

// Every FP8 weight of tiny-deepseek-v3 read through read_weight_bf16 equals
// bf16(e4m3 * scale of its block), with the block computed here from the
// indices, and has the spread make-model drew it with (so the scales are
// applied, not just the codes decoded).
TEST(Fp8WeightsTest, DequantisesEveryBlockOfTheTinyV3Preset) {
  const std::string dir = make("tiny-deepseek-v3");
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok());
  int checked = 0;
  for (const auto& [name, t] : ck->tensors()) {
    if (t.dtype != DType::kF8E4M3) continue;
    const TensorView* s = ck->find(name + "_scale_inv");
    ASSERT_NE(s, nullptr) << name;
    auto w = read_weight_bf16(*ck, *c, name, t.shape, dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const int64_t rows = t.shape[0], cols = t.shape[1];
    ASSERT_EQ(static_cast<int64_t>(w->size()), rows * cols);
    double sum2 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        float scale;
        std::memcpy(&scale, s->data + 4 * ((r / 128) * s->shape[1] + k / 128), 4);
        const float want = round_to_bf16(e4m3_to_float(t.data[r * cols + k]) * scale);
        const float got = bf16_to_float((*w)[r * cols + k]);
        ASSERT_EQ(got, want) << name << " [" << r << ", " << k << "]";
        sum2 += double(got) * got;
      }
    }
    // Drawn N(0, 1/cols) (down and o projections smaller still, by 1/sqrt(2 layers)).
    const double rms = std::sqrt(sum2 / double(rows * cols)) * std::sqrt(double(cols));
    const bool out_proj =
        name.find("down_proj") != std::string::npos || name.find("o_proj") != std::string::npos;
    EXPECT_NEAR(rms, out_proj ? 0.5 : 1.0, 0.1) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 3 * 5 + 3 + 2 * (16 * 3 + 3));  // attention, dense MLP, 2 MoE layers
}

// A copy of tiny-deepseek-v3 with one tensor changed (or removed) by `edit`.
std::string broken_copy(const std::string& name,
                        const std::function<void(std::vector<TensorToWrite>&,
                                                 std::vector<std::vector<uint8_t>>&)>& edit) {
  const std::string src = make("tiny-deepseek-v3");
  const std::string dir = (fs::path(::testing::TempDir()) / ("msinfer_broken_" + name)).string();
  fs::create_directories(dir);
  fs::copy_file(fs::path(src) / "config.json", fs::path(dir) / "config.json",
                fs::copy_options::overwrite_existing);
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

TEST(Fp8WeightsTest, BrokenScalesAreLoadErrorsNamingTheTensor) {
  const std::string w = "model.layers.1.mlp.experts.3.down_proj.weight";
  const std::string sname = w + "_scale_inv";
  const std::vector<int64_t> shape = {192, 80};  // 2 x 1 blocks
  auto find = [](std::vector<TensorToWrite>& ts, const std::string& n) {
    return std::find_if(ts.begin(), ts.end(), [&](const TensorToWrite& t) { return t.name == n; });
  };
  auto set_scale = [&](float v) {
    return [&, v](std::vector<TensorToWrite>& ts, std::vector<std::vector<uint8_t>>& keep) {
      auto it = find(ts, sname);
      keep.emplace_back(8);
      std::memcpy(keep.back().data(), it->data, 8);
      std::memcpy(keep.back().data() + 4, &v, 4);  // block [1, 0]
      it->data = keep.back().data();
    };
  };
  struct Case {
    std::string name;
    std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<uint8_t>>&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing", [&](auto& ts, auto&) { ts.erase(find(ts, sname)); },
       "tensor '" + sname + "' (the block scales of F8_E4M3 '" + w + "') is missing"},
      {"blocks",
       [&](auto& ts, auto&) {
         find(ts, sname)->shape = {1, 2};
       },
       "tensor '" + sname + "' has [1, 2] blocks, expected [2, 1] for [192, 80] in 128x128 blocks"},
      {"nan", set_scale(std::nanf("")), "tensor '" + sname + "' block [1, 0] has scale nan"},
      {"zero", set_scale(0.f), "tensor '" + sname + "' block [1, 0] has scale 0.000000"},
      {"negative", set_scale(-1.f), "block scales must be finite and > 0"},
      {"inf", set_scale(INFINITY), "tensor '" + sname + "' block [1, 0] has scale inf"},
      {"dtype",
       [&](auto& ts, auto&) {
         auto it = find(ts, sname);
         it->dtype = DType::kBF16;
         it->shape = {2, 2};  // same bytes
       },
       "tensor '" + sname + "' has dtype BF16, expected F32"},
  };
  for (const Case& k : cases) {
    const std::string dir = broken_copy(k.name, k.edit);
    auto c = load_model_config(dir);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    auto ck = Checkpoint::open(dir);
    ASSERT_TRUE(ck.ok()) << k.name << ": " << ck.status().to_string();
    auto r = read_weight_bf16(*ck, *c, w, shape, dir);
    ASSERT_FALSE(r.ok()) << k.name;
    EXPECT_NE(r.status().message().find(k.message), std::string::npos)
        << k.name << ": " << r.status().message();
    // The other weights still read.
    EXPECT_TRUE(
        read_weight_bf16(*ck, *c, "model.layers.1.mlp.experts.2.down_proj.weight", shape, dir).ok())
        << k.name;
  }
  // An F8 weight in a checkpoint whose config has no quantization_config.
  const std::string dir = make("tiny-deepseek-v3");
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok());
  ModelConfig plain = *c;
  plain.fp8_weights = false;
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok());
  auto r = read_weight_bf16(*ck, plain, w, shape, dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(
                "tensor '" + w + "' is F8_E4M3 but config.json has no fp8 quantization_config"),
            std::string::npos)
      << r.status().message();
  // read_bf16 (no config) refuses rather than dropping the scales.
  auto b = read_bf16(*ck, w, shape);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("is F8_E4M3"), std::string::npos);
}

// DeepSeek's own inference/model.py on both presets, through the harness:
// well-formed output, and its absorbed-MLA decode with the latent KV cache
// agrees with a prefill of the same tokens (float32, so only summation order
// differs). Skips without torch or without the reference checkout.
class DeepSeekReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepSeekReferenceTest, RunsOnThePreset) {
  const std::string dir = make(GetParam());
  const std::string script =
      std::string(MSINFER_SOURCE_DIR) + "/tests/runtime/deepseek_reference.py";
  const std::string out = (fs::path(::testing::TempDir()) / "ref.json").string();
  const std::string err = (fs::path(::testing::TempDir()) / "ref.err").string();
  auto run = [&](const std::string& ids, int steps, const std::string& dtype) -> Json {
    const std::string rc = msinfer::testing::run_capture(
        "cd " + std::string(MSINFER_SOURCE_DIR) + " && /usr/bin/python3 " + script + " " + dir +
        " " + ids + " " + std::to_string(steps) + " --dtype " + dtype + " > " + out + " 2> " + err +
        "; echo $?");
    std::ifstream e(err);
    const std::string err_text((std::istreambuf_iterator<char>(e)), {});
    if (rc == "77\n") return Json{{"skip", err_text}};
    EXPECT_EQ(rc, "0\n") << err_text;
    auto j = read_json_file(out);
    EXPECT_TRUE(j.ok()) << err_text;
    return j.ok() ? *j : Json();
  };
  Json bf = run("5,17,42,99,3,250,7", 4, "bf16");
  if (bf.contains("skip")) GTEST_SKIP() << bf["skip"].get<std::string>();
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(bf["tokens"].size(), 4u);
  ASSERT_EQ(bf["logits"].size(), 4u);
  for (const auto& step : bf["logits"]) {
    ASSERT_EQ(static_cast<int64_t>(step.size()), c->vocab);
    double sum2 = 0;
    for (const auto& v : step) {
      ASSERT_TRUE(std::isfinite(v.get<double>()));
      sum2 += v.get<double>() * v.get<double>();
    }
    const double rms = std::sqrt(sum2 / double(step.size()));
    EXPECT_GT(rms, 0.2);  // logits of order 1
    EXPECT_LT(rms, 5.0);
  }
  Json f = run("5,17,42,99,3,250,7", 3, "float32");
  ASSERT_EQ(f["tokens"].size(), 3u);
  // Prefill of the prompt plus the first two greedy tokens against step 2's decode.
  const std::string longer = "5,17,42,99,3,250,7," + std::to_string(f["tokens"][0].get<int>()) +
                             "," + std::to_string(f["tokens"][1].get<int>());
  Json p = run(longer, 1, "float32");
  ASSERT_EQ(p["logits"].size(), 1u);
  double max_diff = 0;
  for (size_t v = 0; v < p["logits"][0].size(); ++v) {
    max_diff = std::max(
        max_diff, std::fabs(p["logits"][0][v].get<double>() - f["logits"][2][v].get<double>()));
  }
  EXPECT_LT(max_diff, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, DeepSeekReferenceTest,
                         ::testing::Values("tiny-deepseek-v3", "tiny-deepseek-v2-lite"),
                         [](const auto& info) {
                           return info.param == "tiny-deepseek-v3" ? std::string("V3")
                                                                   : std::string("V2Lite");
                         });

}  // namespace
}  // namespace msinfer::model
