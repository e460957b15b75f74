#include "msinfer/core/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace msinfer {
namespace {

// Published parameter counts, to 2%: the formulas count every weight matrix.
TEST(ModelSpecTest, BuiltinsMatchPublishedSizes) {
  struct Case {
    const char* name;
    double params;
  };
  for (const Case c : {Case{"mixtral-8x22b", 140.6e9}, Case{"dbrx", 132e9},
                       Case{"scaled-moe", 317e9}}) {
    auto m = builtin_model(c.name);
    ASSERT_TRUE(m.ok()) << c.name;
    EXPECT_NEAR(m->total_params() / c.params, 1.0, 0.02) << c.name << " " << m->total_params();
    EXPECT_TRUE(m->validate().ok());
  }
  auto m = builtin_model("Mixtral-8x22B");
  EXPECT_EQ(m->layers, 56);
  EXPECT_EQ(m->hidden, 6144);
  EXPECT_EQ(m->expert_ffn, 16384);
  EXPECT_EQ(m->experts, 8);
  EXPECT_EQ(m->top_k, 2);
  EXPECT_DOUBLE_EQ(m->gqa_group(), 6.0);
  // docs/PLANNER.md 3b: KV bytes per token per layer = 4 h / g for GQA with head_dim = h / heads.
  EXPECT_DOUBLE_EQ(m->kv_bytes_per_token_per_layer(), 4.0 * 6144 / 6.0);
  auto d = builtin_model("dbrx");
  EXPECT_EQ(d->experts, 16);
  EXPECT_EQ(d->top_k, 4);
  EXPECT_EQ(d->expert_ffn, 10752);
}

TEST(ModelSpecTest, UnknownNameListsBuiltins) {
  auto m = load_model_config("gpt-5");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("mixtral-8x22b, dbrx, scaled-moe"), std::string::npos);
  auto p = load_model_config("/nonexistent/config.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("no such file"), std::string::npos);
}

TEST(ModelSpecTest, HandComputedTinyModel) {
  ModelConfig m;
  m.name = "tiny";
  m.layers = m.moe_layers = 2;
  m.hidden = 64;
  m.expert_ffn = 128;
  m.experts = 4;
  m.top_k = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.vocab = 100;
  // q 64*64 + k,v 2*64*32 + o 64*64
  EXPECT_DOUBLE_EQ(m.attention_params_per_layer(), 12288);
  // 2 layers * (12288 + 2*64 norms) + 2 routers * 64*4 + embed and head 2*100*64 + final norm 64
  EXPECT_DOUBLE_EQ(m.attention_side_params(), 2 * (12288 + 128) + 2 * 256 + 12800 + 64);
  EXPECT_DOUBLE_EQ(m.expert_params(), 2 * 3 * 64 * 128);
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_per_layer(), 2 * 2 * 2 * 16);
  EXPECT_DOUBLE_EQ(m.attention_side_flops_per_token_per_moe_layer(), (2 * 12288 + 2 * 256 + 6400));
  EXPECT_DOUBLE_EQ(m.attention_score_flops(100), 4 * 4 * 16 * 100);
  EXPECT_DOUBLE_EQ(m.expert_flops_per_token(), 6 * 64 * 128);
  m.kv_heads = 3;
  EXPECT_FALSE(m.validate().ok());  // 4 heads not divisible by 3 KV heads
}

// Attention tp: the query heads split evenly; the KV heads split evenly or
// are replicated (one per rank) when tp is a multiple of them.
TEST(ModelSpecTest, AttentionTpSplitsOrReplicatesTheKvHeads) {
  ModelConfig m;
  m.heads = 32;
  m.kv_heads = 4;
  m.head_dim = 128;
  for (int tp : {1, 2, 4, 8, 16, 32}) EXPECT_TRUE(m.check_attention_tp(tp).ok()) << tp;
  EXPECT_EQ(m.kv_heads_per_attention_rank(1), 4);
  EXPECT_EQ(m.kv_heads_per_attention_rank(2), 2);
  EXPECT_EQ(m.kv_heads_per_attention_rank(4), 1);
  EXPECT_EQ(m.kv_heads_per_attention_rank(8), 1);  // each KV head on two ranks
  // Rank r's query heads [4r, 4r + 4) read KV head 4r / 8 = r / 2.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.first_kv_head_of_attention_rank(r, 8), r / 2) << r;
  for (int r = 0; r < 2; ++r) EXPECT_EQ(m.first_kv_head_of_attention_rank(r, 2), 2 * r) << r;
  // Per rank: 2 of 4 heads at tp 2, one head (not a half) at tp 8.
  const double kv = m.kv_bytes_per_token_per_layer();
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_per_layer_per_attention_rank(2), kv / 2);
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_per_layer_per_attention_rank(8), kv / 4);
  for (int tp : {3, 6, 64}) {
    const Status s = m.check_attention_tp(tp);
    ASSERT_FALSE(s.ok()) << tp;
    EXPECT_NE(s.message().find("tp_attention " + std::to_string(tp) +
                               " must divide the query heads (32) and divide or be a multiple of "
                               "the KV heads (4)"),
              std::string::npos)
        << s.message();
  }
  m.kv_heads = 8;
  m.heads = 24;
  // 16: a multiple of the 8 KV heads, but the 24 heads do not split 16 ways.
  EXPECT_FALSE(m.check_attention_tp(16).ok());
  // 12: divides the heads, neither divides nor is a multiple of 8.
  EXPECT_FALSE(m.check_attention_tp(12).ok());
  // MLA: one latent per token, read by every head, so every rank holds all of it.
  m.kv_lora_rank = 512;
  m.qk_rope_head_dim = 64;
  EXPECT_TRUE(m.check_attention_tp(12).ok());
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_per_layer(), 2.0 * (512 + 64));
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_per_layer_per_attention_rank(8),
                   m.kv_bytes_per_token_per_layer());
}

Json mixtral_8x7b() {
  return Json::parse(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "rope_theta": 1e6, "tie_word_embeddings": false})");
}

TEST(HfConfigTest, Mixtral) {
  auto m = parse_hf_config(mixtral_8x7b(), "mixtral/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->experts, 8);
  EXPECT_EQ(m->moe_layers, 32);
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_NEAR(m->total_params() / 46.7e9, 1.0, 0.02);
}

TEST(HfConfigTest, Qwen3MoeAndQwen2MoeWithSharedExpert) {
  Json q3 = Json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
    "moe_intermediate_size": 768, "intermediate_size": 6144, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "vocab_size": 151936, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": true, "tie_word_embeddings": false})");
  auto m = parse_hf_config(q3, "qwen3/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->head_dim, 128);  // explicit head_dim, not hidden / heads
  EXPECT_EQ(m->moe_layers, 48);
  EXPECT_NEAR(m->total_params() / 30.5e9, 1.0, 0.02);

  q3["mlp_only_layers"] = {0, 5};
  q3["decoder_sparse_step"] = 2;
  m = parse_hf_config(q3, "qwen3/config.json");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->moe_layers, 23);  // odd layers 1, 3, .., 47 except mlp-only layer 5

  Json q2 = Json::parse(R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 3584,
    "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "num_experts": 64, "num_experts_per_tok": 8,
    "vocab_size": 151936})");
  m = parse_hf_config(q2, "qwen2/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->shared_expert_ffn, 20480);
  EXPECT_NEAR(m->total_params() / 57.4e9, 1.0, 0.02);
}

TEST(HfConfigTest, Dbrx) {
  Json j = Json::parse(R"({"architectures": ["DbrxForCausalLM"], "d_model": 6144,
    "n_heads": 48, "n_layers": 40, "vocab_size": 100352,
    "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
    "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}})");
  auto m = parse_hf_config(j, "dbrx/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto b = builtin_model("dbrx");
  EXPECT_DOUBLE_EQ(m->total_params(), b->total_params());
  j["ffn_config"].erase("moe_top_k");
  m = parse_hf_config(j, "dbrx/config.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("dbrx/config.json.ffn_config: field 'moe_top_k' is missing"),
            std::string::npos);
}

TEST(HfConfigTest, DeepSeekV3WithMlaDenseLayersAndSharedExpert) {
  Json j = Json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "tie_word_embeddings": false})");
  auto m = parse_hf_config(j, "dsv3/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->moe_layers, 58);
  EXPECT_EQ(m->shared_expert_ffn, 2048);
  EXPECT_EQ(m->dense_ffn, 18432);
  EXPECT_DOUBLE_EQ(m->kv_bytes_per_token_per_layer(), 2.0 * (512 + 64));  // latent cache
  EXPECT_NEAR(m->total_params() / 671e9, 1.0, 0.02);
}

// deepseek-ai/DeepSeek-V3 config.json as published (the fields msinfer reads,
// and some it ignores).
Json deepseek_v3() {
  return Json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_group": 8, "topk_group": 4,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
    "routed_scaling_factor": 2.5, "aux_loss_alpha": 0.001, "seq_aux": true, "ep_size": 1,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16"})");
}

// deepseek-ai/DeepSeek-V2-Lite config.json as published.
Json deepseek_v2_lite() {
  return Json::parse(R"({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
    "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": false,
    "routed_scaling_factor": 1.0, "q_lora_rank": null, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "vocab_size": 102400, "bos_token_id": 100000, "eos_token_id": 100001,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
}

TEST(HfConfigTest, DeepSeekV3EveryField) {
  auto m = parse_hf_config(deepseek_v3(), "dsv3/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->q_lora_rank, 1536);
  EXPECT_EQ(m->kv_lora_rank, 512);
  EXPECT_EQ(m->head_dim, 192);
  EXPECT_EQ(m->shared_experts, 1);
  EXPECT_EQ(m->first_k_dense_replace, 3);
  EXPECT_EQ(m->moe_layer_freq, 1);
  EXPECT_FALSE(m->is_moe_layer(2));
  EXPECT_TRUE(m->is_moe_layer(3));
  EXPECT_EQ(m->nextn_predict_layers, 1);
  EXPECT_EQ(m->scoring_func, ModelConfig::ScoringFunc::kSigmoid);
  EXPECT_EQ(m->topk_method, ModelConfig::TopkMethod::kNoauxTc);
  EXPECT_EQ(m->n_group, 8);
  EXPECT_EQ(m->topk_group, 4);
  EXPECT_TRUE(m->norm_topk_prob);
  EXPECT_DOUBLE_EQ(m->routed_scaling_factor, 2.5);
  EXPECT_DOUBLE_EQ(m->rope_theta, 10000);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-6);
  EXPECT_EQ(m->max_position_embeddings, 163840);
  EXPECT_DOUBLE_EQ(m->yarn_factor, 40);
  EXPECT_EQ(m->yarn_original_max_position, 4096);
  EXPECT_DOUBLE_EQ(m->yarn_beta_fast, 32);
  EXPECT_DOUBLE_EQ(m->yarn_beta_slow, 1);
  EXPECT_DOUBLE_EQ(m->yarn_mscale, 1.0);
  EXPECT_DOUBLE_EQ(m->yarn_mscale_all_dim, 1.0);
  // 0.1 * ln(40) + 1
  EXPECT_NEAR(m->yarn_attention_mscale(), 1.368888, 1e-6);
  EXPECT_DOUBLE_EQ(m->yarn_rope_mscale(), 1.0);
  EXPECT_TRUE(m->fp8_weights);
  EXPECT_EQ(m->fp8_block_rows, 128);
  EXPECT_EQ(m->fp8_block_cols, 128);
  EXPECT_EQ(m->bos_token_id, 0);
  ASSERT_EQ(m->eos_token_ids.size(), 1u);
  EXPECT_EQ(m->eos_token_ids[0], 1);
  // The engine runs it, co-located and disaggregated.
  EXPECT_TRUE(m->check_executable().ok()) << m->check_executable().to_string();
  // A plan file carries the model: every field survives the round trip.
  Json j = m->to_json();
  auto back = ModelConfig::from_json(JsonFields(j, "plan.model"));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->to_json(), j);
  EXPECT_DOUBLE_EQ(back->total_params(), m->total_params());
}

TEST(HfConfigTest, DeepSeekV2LiteAndV2) {
  auto m = parse_hf_config(deepseek_v2_lite(), "dsv2lite/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->q_lora_rank, 0);  // null: a plain q_proj
  EXPECT_EQ(m->shared_experts, 2);
  EXPECT_EQ(m->shared_expert_ffn, 2 * 1408);
  EXPECT_EQ(m->moe_layers, 26);
  EXPECT_EQ(m->dense_ffn, 10944);
  EXPECT_EQ(m->scoring_func, ModelConfig::ScoringFunc::kSoftmax);
  EXPECT_EQ(m->topk_method, ModelConfig::TopkMethod::kGreedy);
  EXPECT_FALSE(m->norm_topk_prob);
  EXPECT_EQ(m->nextn_predict_layers, 0);
  EXPECT_FALSE(m->fp8_weights);
  EXPECT_NEAR(m->yarn_attention_mscale(), 0.1 * 0.707 * std::log(40.0) + 1, 1e-12);
  EXPECT_NEAR(m->total_params() / 15.7e9, 1.0, 0.02);  // "16B": 15.7B published

  // DeepSeek-V2 (236B): group-limited greedy over 8 groups, 3 of them per token.
  Json j = deepseek_v2_lite();
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 8;
  j["topk_group"] = 3;
  j["n_routed_experts"] = 160;
  m = parse_hf_config(j, "dsv2/config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->topk_method, ModelConfig::TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(m->n_group, 8);
  EXPECT_EQ(m->topk_group, 3);

  // Without the optional fields: the HF defaults of each architecture.
  j = deepseek_v2_lite();
  for (const char* k : {"topk_method", "scoring_func", "norm_topk_prob", "n_group", "topk_group",
                        "routed_scaling_factor", "rope_scaling", "rope_theta", "rms_norm_eps"}) {
    j.erase(k);
  }
  m = parse_hf_config(j, "c.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->topk_method, ModelConfig::TopkMethod::kGreedy);
  EXPECT_FALSE(m->norm_topk_prob);
  EXPECT_DOUBLE_EQ(m->yarn_factor, 0);
  EXPECT_DOUBLE_EQ(m->yarn_attention_mscale(), 1.0);
  EXPECT_DOUBLE_EQ(m->rope_theta, 10000);
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  j["n_group"] = 8;
  j["topk_group"] = 4;
  m = parse_hf_config(j, "c.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->topk_method, ModelConfig::TopkMethod::kNoauxTc);
  EXPECT_EQ(m->scoring_func, ModelConfig::ScoringFunc::kSigmoid);
  EXPECT_TRUE(m->norm_topk_prob);
}

TEST(HfConfigTest, BadDeepSeekConfigsNameTheField) {
  struct Case {
    const char* key;
    Json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"n_group", 7, "field 'n_group' 7 does not divide n_routed_experts (256)"},
      {"n_group", 0, "field 'n_group' must be in 1..n_routed_experts"},
      {"topk_group", 9, "field 'topk_group' 9 must be in 1..n_group (8)"},
      {"topk_group", 0, "field 'topk_group' 0 must be in 1..n_group (8)"},
      {"scoring_func", "relu", "field 'scoring_func' 'relu' is not one of softmax, sigmoid"},
      {"topk_method", "random",
       "field 'topk_method' 'random' is not one of greedy, group_limited_greedy, noaux_tc"},
      {"routed_scaling_factor", 0, "field 'routed_scaling_factor' must be in (0, 1e6)"},
      {"moe_layer_freq", 0, "field 'moe_layer_freq' must be in 1..layers"},
      {"first_k_dense_replace", -1,
       "field 'first_k_dense_replace' must be in 0..num_hidden_layers"},
      {"num_nextn_predict_layers", -1, "field 'num_nextn_predict_layers' must be in 0..64"},
      {"num_experts_per_tok", 129,
       "field 'num_experts_per_tok' 129 exceeds the experts of topk_group groups (128)"},
      {"rope_scaling", Json{{"type", "linear"}, {"factor", 4}},
       "rope_scaling: field 'type' 'linear' is not supported (DeepSeek models: yarn)"},
      {"rope_scaling", Json{{"type", "yarn"}, {"factor", 4}},
       "rope_scaling: field 'original_max_position_embeddings' is missing"},
      {"rope_scaling",
       Json{{"type", "yarn"}, {"factor", -1}, {"original_max_position_embeddings", 4096}},
       "rope_scaling: field 'factor' must be > 0"},
      {"quantization_config", Json{{"quant_method", "awq"}},
       "quantization_config: field 'quant_method' 'awq' is not supported (fp8)"},
      {"quantization_config",
       Json{{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}},
       "quantization_config: field 'fmt' 'e5m2' is not supported (e4m3)"},
      {"quantization_config", Json{{"quant_method", "fp8"}, {"weight_block_size", {128}}},
       "quantization_config: field 'weight_block_size' must be two block sizes"},
  };
  for (const Case& c : cases) {
    Json j = deepseek_v3();
    j[c.key] = c.value;
    auto m = parse_hf_config(j, "dsv3/config.json");
    ASSERT_FALSE(m.ok()) << c.key << " = " << c.value.dump();
    EXPECT_NE(m.status().message().find(c.message), std::string::npos)
        << c.key << ": " << m.status().message();
    EXPECT_EQ(m.status().message().rfind("dsv3/config.json", 0), 0u) << m.status().message();
  }
  // Dense layers need their width.
  Json j = deepseek_v3();
  j.erase("intermediate_size");
  auto m = parse_hf_config(j, "dsv3/config.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("field 'intermediate_size' is needed (>= 1) for the 3 dense"),
            std::string::npos)
      << m.status().message();
}

TEST(HfConfigTest, MalformedConfigsGiveClearErrors) {
  Json j = mixtral_8x7b();
  j["architectures"] = {"LlamaForCausalLM"};
  auto m = parse_hf_config(j, "c.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("architecture 'LlamaForCausalLM' is not supported"),
            std::string::npos);
  EXPECT_NE(m.status().message().find("Qwen3MoeForCausalLM"), std::string::npos);

  j = mixtral_8x7b();
  j.erase("num_local_experts");
  m = parse_hf_config(j, "c.json");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "c.json: field 'num_local_experts' is missing");

  j = mixtral_8x7b();
  j["hidden_size"] = "4096";
  m = parse_hf_config(j, "c.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("field 'hidden_size' must be an integer"), std::string::npos);

  j = mixtral_8x7b();
  j["num_experts_per_tok"] = 9;  // more than the 8 experts
  m = parse_hf_config(j, "c.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("top-K must be in 1..experts"), std::string::npos);

  j = mixtral_8x7b();
  j["num_hidden_layers"] = 0;
  EXPECT_FALSE(parse_hf_config(j, "c.json").ok());

  j = Json::parse(R"({"model_type": "llama"})");
  m = parse_hf_config(j, "c.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model_type 'llama' is not supported"), std::string::npos);
  EXPECT_FALSE(parse_hf_config(Json::array(), "c.json").ok());
}

TEST(HfConfigTest, LoadFromDirectoryAndBrokenFile) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(::testing::TempDir()) / "msinfer_model_spec_test";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << mixtral_8x7b().dump();
  }
  auto m = load_model_config(dir.string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->name, "msinfer_model_spec_test");
  {
    std::ofstream(dir / "config.json") << "{\"architectures\": [\"MixtralForCausalLM\"";
  }
  m = load_model_config((dir / "config.json").string());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("not valid JSON"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ModelSpecTest, JsonRoundTrip) {
  auto m = builtin_model("dbrx");
  Json j = m->to_json();
  auto back = ModelConfig::from_json(JsonFields(j, "model"));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_DOUBLE_EQ(back->total_params(), m->total_params());
  EXPECT_EQ(back->name, "dbrx");
}

}  // namespace
}  // namespace msinfer
