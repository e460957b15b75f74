// Hardware catalogue: GPUs (spec-sheet numbers), achievable-efficiency factors
// and the NIC utilisation curve the performance model uses. The default is
// data/catalog.json, embedded at build time; --catalog FILE replaces it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::planner {

// Fraction of the NIC's line rate reached by one message of `bytes` bytes,
// interpolated linearly in log2(bytes) between measured points; clamped to the
// first/last point outside them.
class UtilCurve {
 public:
  UtilCurve() = default;
  // points: (bytes, utilisation in (0, 1]), strictly increasing bytes.
  static StatusOr<UtilCurve> make(std::vector<std::pair<double, double>> points,
                                  const std::string& where);
  static StatusOr<UtilCurve> from_json(const Json& j, const std::string& where);
  double at(double bytes) const;
  Json to_json() const;
  const std::vector<std::pair<double, double>>& points() const { return points_; }

 private:
  std::vector<std::pair<double, double>> points_;
};

struct Efficiency {
  double compute = 0.75;           // fraction of peak bf16 FLOP/s in large GEMMs
  double memory_bandwidth = 0.85;  // fraction of HBM bandwidth when streaming
  double intra_node_link = 0.70;   // fraction of NVLink/PCIe bandwidth in all-reduce
  double memory_usable = 0.90;     // fraction of HBM usable for weights + KV cache
  double attention_layer_overhead_s = 25e-6;  // fixed cost per layer and micro-batch
  double expert_layer_overhead_s = 15e-6;
};

struct GpuSpec {
  std::string name;
  std::vector<std::string> aliases;
  double bf16_flops = 0;         // FLOP/s, dense
  double memory_bytes = 0;       // HBM bytes
  double memory_bandwidth = 0;   // bytes/s
  double nic_bandwidth = 0;      // bytes/s per GPU (inter-node)
  int gpus_per_node = 8;
  double intra_node_bandwidth = 0;  // bytes/s per GPU (NVLink or PCIe)
  double price = 0;              // normalised, L20 = 1
  double tdp_w = 0;
  std::string source;
  Efficiency efficiency;         // catalogue default unless the entry overrides it

  Json to_json() const;
};

struct Catalog {
  std::vector<GpuSpec> gpus;
  UtilCurve nic_util;
  std::string source;  // file name or "embedded data/catalog.json"

  // Finds a GPU by name or alias, case-insensitively. NOT_FOUND lists the names.
  StatusOr<GpuSpec> find(const std::string& name) const;
};

// Upper bounds of a GPU entry's fields (all must also be > 0); see docs/PLANNER.md.
inline constexpr double kMaxTflops = 1e5;    // bf16_tflops
inline constexpr double kMaxMemoryGb = 1e5;  // memory_gb
inline constexpr double kMaxGbS = 1e6;  // memory_bandwidth_gb_s, intra_node_gb_s (nic_gbit_s: x8)
inline constexpr int64_t kMaxGpusPerNode = 128;
inline constexpr double kMaxPrice = 1e6;
inline constexpr double kMaxTdpW = 1e5;

// Parses one GPU entry (the fields of data/catalog.json's gpus[i]); efficiency
// factors the entry does not override come from `base`.
StatusOr<GpuSpec> parse_gpu_spec(const JsonFields& f, const Efficiency& base);

// Parses a catalogue document; `source` names it in errors
// ("catalog.json: gpus[2] (A800): field 'memory_gb' must be > 0, got 0").
StatusOr<Catalog> parse_catalog(const Json& j, const std::string& source);
StatusOr<Catalog> load_catalog(const std::string& path);
// The catalogue shipped with msinfer (data/catalog.json).
const Catalog& default_catalog();

}  // namespace msinfer::planner
