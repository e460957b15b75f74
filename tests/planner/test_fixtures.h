// A tiny model and an idealised GPU whose stage times can be computed by hand:
// efficiencies 1, no per-layer overheads, NIC utilisation a constant 0.5.
#pragma once

#include "msinfer/planner/catalog.h"
#include "msinfer/core/model_config.h"

namespace msinfer::planner::testing {

inline ModelConfig tiny_model() {
  ModelConfig m;
  m.name = "tiny";
  m.architecture = "builtin";
  m.layers = m.moe_layers = 2;
  m.hidden = 64;
  m.expert_ffn = 128;
  m.experts = 4;
  m.top_k = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.vocab = 100;
  return m;
}

inline UtilCurve half_util() {
  auto c = UtilCurve::make({{1.0, 0.5}}, "test curve");
  return *c;
}

// F = 1e12 FLOP/s, W = 1e11 B/s, 1e9 B/s NIC, 1e10 B/s link, 1e6 B of memory.
inline GpuSpec ideal_gpu(const std::string& name = "T1", double price = 1.0) {
  GpuSpec g;
  g.name = name;
  g.bf16_flops = 1e12;
  g.memory_bytes = 1e6;
  g.memory_bandwidth = 1e11;
  g.nic_bandwidth = 1e9;
  g.gpus_per_node = 4;
  g.intra_node_bandwidth = 1e10;
  g.price = price;
  g.tdp_w = 100;
  g.efficiency.compute = 1.0;
  g.efficiency.memory_bandwidth = 1.0;
  g.efficiency.intra_node_link = 1.0;
  g.efficiency.memory_usable = 1.0;
  g.efficiency.attention_layer_overhead_s = 0;
  g.efficiency.expert_layer_overhead_s = 0;
  return g;
}

}  // namespace msinfer::planner::testing
