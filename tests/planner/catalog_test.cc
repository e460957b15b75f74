#include "msinfer/planner/catalog.h"

#include <gtest/gtest.h>

#include <cmath>

namespace msinfer::planner {
namespace {

TEST(CatalogTest, DefaultCatalogHasSpecGpus) {
  const Catalog& c = default_catalog();
  for (const char* n : {"L20", "L40S", "H20", "A800", "A100", "H800", "H100-SXM", "H200", "B200"}) {
    EXPECT_TRUE(c.find(n).ok()) << n;
  }
  // The paper's GPU table (docs/PLANNER.md, defaults).
  auto a100 = c.find("a100");  // alias, case-insensitive
  ASSERT_TRUE(a100.ok());
  EXPECT_EQ(a100->name, "A100-80G");
  EXPECT_DOUBLE_EQ(a100->bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(a100->memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(a100->memory_bandwidth, 2039e9);
  EXPECT_DOUBLE_EQ(a100->price, 2.26);
  auto l20 = c.find("L20");
  EXPECT_DOUBLE_EQ(l20->price, 1.00);
  EXPECT_DOUBLE_EQ(l20->bf16_flops, 119.5e12);
  auto h800 = c.find("H800");
  EXPECT_DOUBLE_EQ(h800->price, 5.28);
  EXPECT_DOUBLE_EQ(h800->tdp_w, 700);
  EXPECT_DOUBLE_EQ(c.find("H20")->memory_bandwidth, 4096e9);
  EXPECT_DOUBLE_EQ(c.find("L40S")->bf16_flops, 362e12);
}

TEST(CatalogTest, UnknownGpuListsKnownOnes) {
  auto g = default_catalog().find("TPUv9");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.status().message().find("GPU 'TPUv9'"), std::string::npos);
  EXPECT_NE(g.status().message().find("L40S"), std::string::npos);
}

Json minimal_catalog() {
  return Json::parse(R"({
    "defaults": {"nic_util_curve": [[1024, 0.1], [4096, 0.5]]},
    "gpus": [{"name": "X", "bf16_tflops": 100, "memory_gb": 10, "memory_bandwidth_gb_s": 1000,
              "nic_gbit_s": 100, "gpus_per_node": 8, "intra_node_gb_s": 100, "price": 1,
              "tdp_w": 300}]})");
}

TEST(CatalogTest, ParsesUnitsAndDefaults) {
  auto c = parse_catalog(minimal_catalog(), "mini.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const GpuSpec& g = c->gpus[0];
  EXPECT_DOUBLE_EQ(g.bf16_flops, 100e12);
  EXPECT_DOUBLE_EQ(g.nic_bandwidth, 100e9 / 8);  // Gbit/s to bytes/s
  EXPECT_DOUBLE_EQ(g.efficiency.compute, Efficiency{}.compute);
}

TEST(CatalogTest, MalformedEntriesNameEntryAndField) {
  struct Case {
    std::string patch_path;
    Json value;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"/gpus/0/memory_gb", Json(0), "mini.json: gpus[0] (X): field 'memory_gb' must be in (0, "},
      {"/gpus/0/price", Json("cheap"), "gpus[0] (X): field 'price' must be a number"},
      {"/gpus/0/gpus_per_node", Json(0), "field 'gpus_per_node' must be in 1..128, got 0"},
      // Issue 12 item 3: figures far outside any GPU are refused.
      {"/gpus/0/gpus_per_node", Json(1e9), "field 'gpus_per_node' must be in 1..128"},
      {"/gpus/0/gpus_per_node", Json(2.5), "field 'gpus_per_node' must be an integer"},
      {"/gpus/0/bf16_tflops", Json(1e300), "field 'bf16_tflops' must be in (0, "},
      {"/gpus/0/price", Json(-1), "field 'price' must be in (0, "},
      {"/gpus/0/efficiency", Json{{"compute", 1.5}},
       "efficiency: field 'compute' must be in (0, 1]"},
      {"/gpus/0/name", Json(""), "field 'name' must not be empty"},
      {"/defaults/nic_util_curve", Json::parse("[[4096, 0.5], [1024, 0.1]]"),
       "bytes must increase"},
      {"/defaults/nic_util_curve", Json::parse("[[4096, 1.5]]"), "utilisation must be in (0, 1]"},
      {"/gpus", Json::array(), "field 'gpus' must be a non-empty list"},
  };
  for (const auto& c : cases) {
    Json j = minimal_catalog();
    j[Json::json_pointer(c.patch_path)] = c.value;
    auto r = parse_catalog(j, "mini.json");
    ASSERT_FALSE(r.ok()) << c.patch_path;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.patch_path << ": " << r.status().message();
  }
  Json j = minimal_catalog();
  j["gpus"][0].erase("tdp_w");
  auto r = parse_catalog(j, "mini.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpus[0] (X): field 'tdp_w' is missing"), std::string::npos);
  j = minimal_catalog();
  j["gpus"].push_back(j["gpus"][0]);
  r = parse_catalog(j, "mini.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate GPU name 'X'"), std::string::npos);
}

TEST(CatalogTest, LoadCatalogReportsMissingFile) {
  auto r = load_catalog("/nonexistent/catalog.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST(UtilCurveTest, InterpolatesInLogBytesAndClamps) {
  auto c = UtilCurve::make({{1024, 0.1}, {4096, 0.5}}, "curve");
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->at(100), 0.1);
  EXPECT_DOUBLE_EQ(c->at(1024), 0.1);
  EXPECT_DOUBLE_EQ(c->at(2048), 0.3);  // halfway in log2 between 2^10 and 2^12
  EXPECT_DOUBLE_EQ(c->at(4096), 0.5);
  EXPECT_DOUBLE_EQ(c->at(1e9), 0.5);
  EXPECT_FALSE(UtilCurve::make({}, "empty").ok());
  EXPECT_FALSE(UtilCurve::from_json(Json::parse("[[1, 2, 3]]"), "x").ok());
}

}  // namespace
}  // namespace msinfer::planner
