#include "msinfer/core/model_config.h"

#include <gtest/gtest.h>

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
  // SPEC: KV bytes per token per layer = 4 h / g for GQA with head_dim = h / heads.
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
