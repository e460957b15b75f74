// GLM-4.5 / 4.6 (Glm4MoeForCausalLM, part of issue 49): the HF config.json of
// the published models read field by field, bad configs answered with the
// field at fault, plan files round-trip the model, the tiny-glm4-moe preset
// writes the published tensor layout, and broken checkpoints (a missing bias,
// a wrong shape, a bias the config does not ask for) fail at load naming the
// tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "msinfer/core/model_config.h"
#include "msinfer/model/make_model.h"
#include "msinfer/model/safetensors.h"
#include "msinfer/model/weights.h"

namespace msinfer::model {
namespace {

namespace fs = std::filesystem;

// zai-org/GLM-4.5's config.json (the fields the model reads, as published).
Json glm45_config() {
  return Json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "partial_rotary_factor": 0.5,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1536, "norm_topk_prob": true,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 160,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "num_hidden_layers": 92, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": true,
    "vocab_size": 151552})");
}

// zai-org/GLM-4.5-Air: 46 layers (one dense), hidden 4096, 128 experts of
// 1408, no q/k norm, routed_scaling_factor 1.
Json glm45_air_config() {
  Json j = glm45_config();
  j.merge_patch(Json::parse(R"({"hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "n_routed_experts": 128, "first_k_dense_replace": 1,
    "num_hidden_layers": 46, "routed_scaling_factor": 1.0, "use_qk_norm": false})"));
  return j;
}

TEST(Glm4MoeConfigTest, ReadsThePublishedGlm45ConfigFieldByField) {
  auto m = parse_hf_config(glm45_config(), "GLM-4.5/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->architecture, "Glm4MoeForCausalLM");
  EXPECT_EQ(m->layers, 92);
  EXPECT_EQ(m->moe_layers, 89);
  EXPECT_EQ(m->first_k_dense_replace, 3);
  EXPECT_FALSE(m->is_moe_layer(2));
  EXPECT_TRUE(m->is_moe_layer(3));
  EXPECT_EQ(m->hidden, 5120);
  EXPECT_EQ(m->heads, 96);
  EXPECT_EQ(m->kv_heads, 8);
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_EQ(m->partial_rotary_factor, 0.5);
  EXPECT_EQ(m->rotary_dim(), 64);
  EXPECT_TRUE(m->attention_bias);
  EXPECT_TRUE(m->qk_norm);
  EXPECT_EQ(m->kv_lora_rank, 0);
  EXPECT_EQ(m->experts, 160);
  EXPECT_EQ(m->top_k, 8);
  EXPECT_EQ(m->expert_ffn, 1536);
  EXPECT_EQ(m->shared_experts, 1);
  EXPECT_EQ(m->shared_expert_ffn, 1536);
  EXPECT_EQ(m->dense_ffn, 12288);
  EXPECT_EQ(m->scoring_func, ModelConfig::ScoringFunc::kSigmoid);
  EXPECT_EQ(m->topk_method, ModelConfig::TopkMethod::kNoauxTc);
  EXPECT_EQ(m->n_group, 1);
  EXPECT_EQ(m->topk_group, 1);
  EXPECT_TRUE(m->norm_topk_prob);
  EXPECT_EQ(m->routed_scaling_factor, 2.5);
  EXPECT_EQ(m->nextn_predict_layers, 1);
  EXPECT_EQ(m->rope_theta, 1e6);
  EXPECT_EQ(m->yarn_factor, 0);
  EXPECT_EQ(m->rms_norm_eps, 1e-5);
  EXPECT_EQ(m->max_position_embeddings, 131072);
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_EQ(m->vocab, 151552);
  EXPECT_EQ(m->eos_token_ids, (std::vector<int64_t>{151329, 151336, 151338}));
  // 355 B published, which counts the MTP layer (~4 B) the engine does not run.
  EXPECT_GT(m->total_params(), 345e9);
  EXPECT_LT(m->total_params(), 356e9);
  EXPECT_TRUE(m->check_executable().ok()) << m->check_executable().to_string();
  EXPECT_TRUE(m->check_attention_tp(8).ok());
  EXPECT_TRUE(m->check_attention_tp(16).ok());  // KV heads replicated
}

TEST(Glm4MoeConfigTest, ReadsGlm45AirAndTheDefaults) {
  auto air = parse_hf_config(glm45_air_config(), "GLM-4.5-Air/config.json");
  ASSERT_TRUE(air.ok()) << air.status().to_string();
  EXPECT_EQ(air->layers, 46);
  EXPECT_EQ(air->moe_layers, 45);
  EXPECT_FALSE(air->qk_norm);
  EXPECT_EQ(air->routed_scaling_factor, 1.0);
  EXPECT_EQ(air->experts, 128);
  EXPECT_GT(air->total_params(), 100e9);  // 106 B published, with the MTP layer
  EXPECT_LT(air->total_params(), 108e9);

  // Glm4MoeConfig's defaults for what a config leaves out; model_type alone names it.
  auto d = parse_hf_config(Json::parse(R"({"model_type": "glm4_moe", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 100, "n_routed_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 32, "intermediate_size": 96})"),
                           "defaults/config.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->architecture, "Glm4MoeForCausalLM");
  EXPECT_EQ(d->head_dim, 16);
  EXPECT_EQ(d->partial_rotary_factor, 0.5);
  EXPECT_FALSE(d->attention_bias);
  EXPECT_FALSE(d->qk_norm);
  EXPECT_EQ(d->first_k_dense_replace, 1);
  EXPECT_EQ(d->moe_layers, 1);
  EXPECT_EQ(d->shared_experts, 1);
  EXPECT_TRUE(d->norm_topk_prob);
  EXPECT_EQ(d->routed_scaling_factor, 1.0);
  EXPECT_EQ(d->rope_theta, 10000);
  EXPECT_EQ(d->rms_norm_eps, 1e-5);
  EXPECT_EQ(d->scoring_func, ModelConfig::ScoringFunc::kSigmoid);

  // Newer transformers write rope_theta and partial_rotary_factor into rope_parameters.
  Json v5 = glm45_config();
  v5.erase("rope_theta");
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] =
      Json{{"rope_type", "default"}, {"rope_theta", 5e5}, {"partial_rotary_factor", 0.25}};
  auto r = parse_hf_config(v5, "v5/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope_theta, 5e5);
  EXPECT_EQ(r->rotary_dim(), 32);
}

TEST(Glm4MoeConfigTest, BadConfigsNameTheField) {
  struct Case {
    Json patch;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"head_dim", 18}}, "partial_rotary_factor"},
      {{{"head_dim", 18}}, "gives a rotary dim of 9"},
      {{{"partial_rotary_factor", 0}}, "'partial_rotary_factor' must be in (0, 1]"},
      {{{"partial_rotary_factor", 1.5}}, "'partial_rotary_factor' must be in (0, 1]"},
      {{{"rope_scaling", {{"type", "yarn"}, {"factor", 4}}}}, "'rope_scaling'"},
      {{{"rope_parameters", {{"rope_type", "llama3"}}}}, "'rope_type'"},
      {{{"n_group", 3}}, "'n_group'"},
      {{{"n_group", 8}, {"topk_group", 9}}, "'topk_group'"},
      {{{"n_routed_experts", nullptr}}, "n_routed_experts"},
      {{{"moe_intermediate_size", 0}}, "moe_intermediate_size"},
      {{{"intermediate_size", nullptr}}, "'intermediate_size' is needed"},
      {{{"first_k_dense_replace", 93}}, "'first_k_dense_replace'"},
      {{{"routed_scaling_factor", -1}}, "'routed_scaling_factor'"},
      {{{"num_key_value_heads", 7}}, "KV heads must divide attention heads"},
      {{{"use_qk_norm", "yes"}}, "use_qk_norm"},
      {{{"attention_bias", 1}}, "attention_bias"},
  };
  for (const Case& k : cases) {
    Json j = glm45_config();
    j.merge_patch(k.patch);
    auto m = parse_hf_config(j, "bad/config.json");
    ASSERT_FALSE(m.ok()) << k.patch.dump();
    EXPECT_NE(m.status().message().find(k.message), std::string::npos)
        << k.patch.dump() << ": " << m.status().message();
    EXPECT_NE(m.status().message().find("bad/config.json"), std::string::npos)
        << m.status().message();
  }
}

TEST(Glm4MoeConfigTest, PlanFilesRoundTripTheModel) {
  for (const Json& src : {glm45_config(), glm45_air_config()}) {
    auto m = parse_hf_config(src, "config.json");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const Json j = m->to_json();
    auto back = ModelConfig::from_json(JsonFields(j, "plan.json"));
    ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << j.dump(2);
    EXPECT_EQ(back->to_json(), j);
    EXPECT_EQ(back->architecture, "Glm4MoeForCausalLM");
    EXPECT_EQ(back->attention_bias, m->attention_bias);
    EXPECT_EQ(back->partial_rotary_factor, 0.5);
    EXPECT_EQ(back->qk_norm, m->qk_norm);
    EXPECT_EQ(back->moe_layers, m->moe_layers);
    EXPECT_EQ(back->first_k_dense_replace, m->first_k_dense_replace);
    EXPECT_EQ(back->shared_expert_ffn, m->shared_expert_ffn);
    EXPECT_EQ(back->scoring_func, ModelConfig::ScoringFunc::kSigmoid);
    EXPECT_EQ(back->topk_method, ModelConfig::TopkMethod::kNoauxTc);
    EXPECT_EQ(back->routed_scaling_factor, m->routed_scaling_factor);
    EXPECT_EQ(back->nextn_predict_layers, 1);
    EXPECT_EQ(back->total_params(), m->total_params());
  }
}

std::string tiny_glm() {
  static const std::string dir = [] {
    const std::string d = (fs::path(::testing::TempDir()) / "msinfer_tiny_glm4_moe").string();
    MakeModelOptions o;
    o.preset = "tiny-glm4-moe";
    o.out_dir = d;
    Status s = make_model(o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return d;
  }();
  return dir;
}

TEST(Glm4MoePresetTest, TinyGlm4MoeHasThePublishedLayout) {
  const std::string dir = tiny_glm();
  auto c = load_model_config(dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Glm4MoeForCausalLM");
  EXPECT_EQ(c->layers, 3);
  EXPECT_EQ(c->moe_layers, 2);
  EXPECT_EQ(c->rotary_dim(), 16);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->n_group, 3);
  EXPECT_EQ(c->topk_group, 2);
  EXPECT_EQ(c->shared_expert_ffn, 48);
  EXPECT_EQ(c->nextn_predict_layers, 1);
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto shape = [&](const std::string& n) {
    const TensorView* t = ck->find(n);
    EXPECT_NE(t, nullptr) << n;
    return t == nullptr ? std::vector<int64_t>{} : t->shape;
  };
  const std::string a = "model.layers.1.self_attn.";
  EXPECT_EQ(shape(a + "q_proj.weight"), (std::vector<int64_t>{192, 80}));
  EXPECT_EQ(shape(a + "q_proj.bias"), (std::vector<int64_t>{192}));
  EXPECT_EQ(shape(a + "k_proj.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape(a + "v_proj.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(ck->find(a + "o_proj.bias"), nullptr);
  EXPECT_EQ(shape(a + "q_norm.weight"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{144, 80}));
  EXPECT_EQ(ck->find("model.layers.0.mlp.gate.weight"), nullptr);
  EXPECT_EQ(shape("model.layers.2.mlp.gate.weight"), (std::vector<int64_t>{12, 80}));
  EXPECT_EQ(ck->find("model.layers.2.mlp.gate.e_score_correction_bias")->dtype, DType::kF32);
  EXPECT_EQ(shape("model.layers.2.mlp.experts.11.down_proj.weight"),
            (std::vector<int64_t>{80, 48}));
  EXPECT_EQ(shape("model.layers.2.mlp.shared_experts.up_proj.weight"),
            (std::vector<int64_t>{48, 80}));
  EXPECT_EQ(shape("model.layers.3.eh_proj.weight"), (std::vector<int64_t>{80, 160}));  // MTP

  // The loader takes every tensor but the MTP layer's, which it skips.
  auto w = ModelWeights::load(dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& L1 = w->get()->layers()[1];
  EXPECT_EQ(L1.qkv_bias.size(), 192u + 2 * 64);
  EXPECT_FALSE(L1.router.empty());
  EXPECT_EQ(L1.router_bias.size(), 12u);
  EXPECT_FALSE(L1.dense_ffn.w13.empty());  // the shared expert
  EXPECT_TRUE(w->get()->layers()[0].router.empty());
  EXPECT_FALSE(w->get()->layers()[0].dense_ffn.w13.empty());
  EXPECT_TRUE(w->get()->layers()[0].experts[0].w13.empty());

  // Attention tp rank 1 of 2: heads 3..5 and KV head 1, the same rows of the biases.
  LoadOptions lo;
  lo.attention_tp_rank = 1;
  lo.attention_tp_size = 2;
  lo.all_experts = false;
  auto r1 = ModelWeights::load(dir, lo);
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  const std::vector<float>& b = r1->get()->layers()[1].qkv_bias;
  ASSERT_EQ(b.size(), 96u + 2 * 32);
  EXPECT_EQ(b[0], L1.qkv_bias[96]);          // q head 3
  EXPECT_EQ(b[96], L1.qkv_bias[192 + 32]);   // k head 1
  EXPECT_EQ(b[128], L1.qkv_bias[256 + 32]);  // v head 1
  EXPECT_TRUE(r1->get()->layers()[1].router.empty());
}

// A copy of tiny-glm4-moe with `config` merged into its config.json and its
// tensors changed by `edit`.
std::string broken_copy(const std::string& name, const Json& config,
                        const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  const std::string src = tiny_glm();
  const std::string dir =
      (fs::path(::testing::TempDir()) / ("msinfer_glm_broken_" + name)).string();
  fs::create_directories(dir);
  auto j = read_json_file((fs::path(src) / "config.json").string());
  EXPECT_TRUE(j.ok());
  j->merge_patch(config);
  EXPECT_TRUE(write_json_file((fs::path(dir) / "config.json").string(), *j).ok());
  auto ck = Checkpoint::open(src);
  EXPECT_TRUE(ck.ok());
  std::vector<TensorToWrite> ts;
  for (const auto& [n, t] : ck->tensors()) ts.push_back({n, t.dtype, t.shape, t.data});
  edit(ts);
  Status s = write_safetensors((fs::path(dir) / "model.safetensors").string(), ts);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

TEST(Glm4MoeWeightsTest, BrokenCheckpointsFailNamingTheTensor) {
  auto find = [](std::vector<TensorToWrite>& ts, const std::string& n) {
    return std::find_if(ts.begin(), ts.end(), [&](const TensorToWrite& t) { return t.name == n; });
  };
  const std::string kb = "model.layers.1.self_attn.k_proj.bias";
  struct Case {
    std::string name;
    Json config;
    std::function<void(std::vector<TensorToWrite>&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing_bias", Json::object(), [&](auto& ts) { ts.erase(find(ts, kb)); },
       "tensor '" + kb + "' is missing"},
      {"bias_shape", Json::object(),
       [&](auto& ts) { find(ts, kb)->shape = {32}; },  // fewer bytes: a valid file
       "tensor '" + kb + "' has shape [32], expected [64]"},
      {"unasked_bias", Json{{"attention_bias", false}}, [](auto&) {},
       "unexpected tensor 'model.layers.0.self_attn.k_proj.bias'"},
      {"missing_router_bias", Json::object(),
       [&](auto& ts) { ts.erase(find(ts, "model.layers.2.mlp.gate.e_score_correction_bias")); },
       "tensor 'model.layers.2.mlp.gate.e_score_correction_bias' is missing"},
      {"shared_expert_shape", Json::object(),
       [&](auto& ts) {
         find(ts, "model.layers.1.mlp.shared_experts.up_proj.weight")->shape = {40, 80};
       },
       "tensor 'model.layers.1.mlp.shared_experts.up_proj.weight' has shape [40, 80], expected "
       "[48, 80]"},
      {"missing_q_norm", Json::object(),
       [&](auto& ts) { ts.erase(find(ts, "model.layers.0.self_attn.q_norm.weight")); },
       "tensor 'model.layers.0.self_attn.q_norm.weight' is missing"},
      {"odd_rotary", Json{{"partial_rotary_factor", 0.15625}},  // 32 * 0.15625 = 5
       [](auto&) {}, "partial_rotary_factor"},
  };
  for (const Case& k : cases) {
    const std::string dir = broken_copy(k.name, k.config, k.edit);
    auto w = ModelWeights::load(dir);
    ASSERT_FALSE(w.ok()) << k.name;
    EXPECT_NE(w.status().message().find(k.message), std::string::npos)
        << k.name << ": " << w.status().message();
  }
}

}  // namespace
}  // namespace msinfer::model
