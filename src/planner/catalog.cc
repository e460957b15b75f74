#include "msinfer/planner/catalog.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "msinfer/embedded/catalog_json.h"

namespace msinfer::planner {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

StatusOr<Efficiency> parse_efficiency(const JsonFields& f, const Efficiency& base) {
  Efficiency e = base;
  MSI_ASSIGN_OR_RETURN(e.compute, f.number_or("compute", base.compute));
  MSI_ASSIGN_OR_RETURN(e.memory_bandwidth, f.number_or("memory_bandwidth", base.memory_bandwidth));
  MSI_ASSIGN_OR_RETURN(e.intra_node_link, f.number_or("intra_node_link", base.intra_node_link));
  MSI_ASSIGN_OR_RETURN(e.memory_usable, f.number_or("memory_usable", base.memory_usable));
  MSI_ASSIGN_OR_RETURN(double a_us, f.number_or("attention_layer_overhead_us",
                                                base.attention_layer_overhead_s * 1e6));
  MSI_ASSIGN_OR_RETURN(double e_us, f.number_or("expert_layer_overhead_us",
                                                base.expert_layer_overhead_s * 1e6));
  e.attention_layer_overhead_s = a_us * 1e-6;
  e.expert_layer_overhead_s = e_us * 1e-6;
  for (auto [key, v] : {std::pair{"compute", e.compute},
                        std::pair{"memory_bandwidth", e.memory_bandwidth},
                        std::pair{"intra_node_link", e.intra_node_link},
                        std::pair{"memory_usable", e.memory_usable}}) {
    if (!(v > 0 && v <= 1)) return f.field_error(key, "must be in (0, 1]");
  }
  if (!(a_us >= 0 && a_us <= 1e6)) {
    return f.field_error("attention_layer_overhead_us", "must be in [0, 1e6]");
  }
  if (!(e_us >= 0 && e_us <= 1e6))
    return f.field_error("expert_layer_overhead_us", "must be in [0, 1e6]");
  return e;
}

}  // namespace

StatusOr<GpuSpec> parse_gpu_spec(const JsonFields& f, const Efficiency& base) {
  MSI_RETURN_IF_ERROR(f.expect_object());
  GpuSpec g;
  MSI_ASSIGN_OR_RETURN(g.name, f.string("name"));
  if (g.name.empty()) return f.field_error("name", "must not be empty");
  JsonFields named(f.json(), f.where() + " (" + g.name + ")");
  if (named.has("aliases")) {
    const Json& a = f.json().at("aliases");
    if (!a.is_array()) return named.field_error("aliases", "must be a list of strings");
    for (const auto& s : a) {
      if (!s.is_string()) return named.field_error("aliases", "must be a list of strings");
      g.aliases.push_back(s.get<std::string>());
    }
  }
  // Valid ranges (docs/PLANNER.md, "Catalogue fields"): every figure > 0 and far
  // above any GPU on sale, so that products of them stay finite and integer
  // counts stay in range (gpus_per_node 1e9 used to plan "tp 536870912").
  MSI_ASSIGN_OR_RETURN(double tflops, named.number_in("bf16_tflops", 0, kMaxTflops, true));
  MSI_ASSIGN_OR_RETURN(double mem_gb, named.number_in("memory_gb", 0, kMaxMemoryGb, true));
  MSI_ASSIGN_OR_RETURN(double bw, named.number_in("memory_bandwidth_gb_s", 0, kMaxGbS, true));
  MSI_ASSIGN_OR_RETURN(double nic, named.number_in("nic_gbit_s", 0, kMaxGbS * 8, true));
  MSI_ASSIGN_OR_RETURN(int64_t per_node, named.integer_in("gpus_per_node", 1, kMaxGpusPerNode));
  MSI_ASSIGN_OR_RETURN(double link, named.number_in("intra_node_gb_s", 0, kMaxGbS, true));
  MSI_ASSIGN_OR_RETURN(g.price, named.number_in("price", 0, kMaxPrice, true));
  MSI_ASSIGN_OR_RETURN(g.tdp_w, named.number_in("tdp_w", 0, kMaxTdpW, true));
  MSI_ASSIGN_OR_RETURN(g.source, named.string_or("source", ""));
  g.bf16_flops = tflops * 1e12;
  g.memory_bytes = mem_gb * 1e9;
  g.memory_bandwidth = bw * 1e9;
  g.nic_bandwidth = nic * 1e9 / 8.0;
  g.gpus_per_node = static_cast<int>(per_node);
  g.intra_node_bandwidth = link * 1e9;
  g.efficiency = base;
  if (named.has("efficiency")) {
    MSI_ASSIGN_OR_RETURN(JsonFields ef, named.object("efficiency"));
    MSI_ASSIGN_OR_RETURN(g.efficiency, parse_efficiency(ef, base));
  }
  return g;
}

StatusOr<UtilCurve> UtilCurve::make(std::vector<std::pair<double, double>> points,
                                    const std::string& where) {
  if (points.empty()) return invalid_argument(where + ": needs at least one (bytes, util) point");
  for (size_t i = 0; i < points.size(); ++i) {
    auto [b, u] = points[i];
    if (!(b > 0) || !(b <= 1e15)) {
      return invalid_argument(where + "[" + std::to_string(i) + "]: bytes must be in (0, 1e15]");
    }
    if (!(u > 0 && u <= 1)) {
      return invalid_argument(where + "[" + std::to_string(i) + "]: utilisation must be in (0, 1]");
    }
    if (i > 0 && !(b > points[i - 1].first)) {
      return invalid_argument(where + "[" + std::to_string(i) +
                              "]: bytes must increase from point to point");
    }
  }
  UtilCurve c;
  c.points_ = std::move(points);
  return c;
}

StatusOr<UtilCurve> UtilCurve::from_json(const Json& j, const std::string& where) {
  if (!j.is_array()) return invalid_argument(where + ": must be a list of [bytes, util] pairs");
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& p = j[i];
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number()) {
      return invalid_argument(where + "[" + std::to_string(i) + "]: must be [bytes, util]");
    }
    pts.emplace_back(p[0].get<double>(), p[1].get<double>());
  }
  return make(std::move(pts), where);
}

double UtilCurve::at(double bytes) const {
  MSI_CHECK(!points_.empty()) << "UtilCurve used before initialisation";
  if (bytes <= points_.front().first) return points_.front().second;
  if (bytes >= points_.back().first) return points_.back().second;
  auto it = std::upper_bound(points_.begin(), points_.end(), bytes,
                             [](double b, const auto& p) { return b < p.first; });
  const auto& hi = *it;
  const auto& lo = *(it - 1);
  double t = (std::log2(bytes) - std::log2(lo.first)) / (std::log2(hi.first) - std::log2(lo.first));
  return lo.second + t * (hi.second - lo.second);
}

Json UtilCurve::to_json() const {
  Json j = Json::array();
  for (auto [b, u] : points_) j.push_back({b, u});
  return j;
}

Json GpuSpec::to_json() const {
  return Json{{"name", name},
              {"bf16_tflops", bf16_flops / 1e12},
              {"memory_gb", memory_bytes / 1e9},
              {"memory_bandwidth_gb_s", memory_bandwidth / 1e9},
              {"nic_gbit_s", nic_bandwidth * 8 / 1e9},
              {"gpus_per_node", gpus_per_node},
              {"intra_node_gb_s", intra_node_bandwidth / 1e9},
              {"price", price},
              {"tdp_w", tdp_w}};
}

StatusOr<GpuSpec> Catalog::find(const std::string& name) const {
  std::string want = lower(name);
  for (const auto& g : gpus) {
    if (lower(g.name) == want) return g;
    for (const auto& a : g.aliases) {
      if (lower(a) == want) return g;
    }
  }
  std::string known;
  for (const auto& g : gpus) known += (known.empty() ? "" : ", ") + g.name;
  return not_found("GPU '" + name + "' is not in the catalogue (" + source + "); known: " + known);
}

StatusOr<Catalog> parse_catalog(const Json& j, const std::string& source) {
  JsonFields top(j, source);
  MSI_RETURN_IF_ERROR(top.expect_object());
  Catalog c;
  c.source = source;
  Efficiency eff;
  std::vector<std::pair<double, double>> curve;
  if (top.has("defaults")) {
    MSI_ASSIGN_OR_RETURN(JsonFields d, top.object("defaults"));
    if (d.has("efficiency")) {
      MSI_ASSIGN_OR_RETURN(JsonFields ef, d.object("efficiency"));
      MSI_ASSIGN_OR_RETURN(eff, parse_efficiency(ef, eff));
    }
    if (d.has("nic_util_curve")) {
      MSI_ASSIGN_OR_RETURN(c.nic_util, UtilCurve::from_json(d.json().at("nic_util_curve"),
                                                            source + ": defaults.nic_util_curve"));
    }
  }
  if (c.nic_util.points().empty()) {
    return invalid_argument(source + ": defaults.nic_util_curve is missing");
  }
  if (!top.has("gpus") || !j.at("gpus").is_array() || j.at("gpus").empty()) {
    return invalid_argument(source + ": field 'gpus' must be a non-empty list");
  }
  const Json& gpus = j.at("gpus");
  for (size_t i = 0; i < gpus.size(); ++i) {
    JsonFields f(gpus[i], source + ": gpus[" + std::to_string(i) + "]");
    MSI_ASSIGN_OR_RETURN(GpuSpec g, parse_gpu_spec(f, eff));
    for (const auto& other : c.gpus) {
      if (lower(other.name) == lower(g.name)) {
        return invalid_argument(f.where() + ": duplicate GPU name '" + g.name + "'");
      }
    }
    c.gpus.push_back(std::move(g));
  }
  return c;
}

StatusOr<Catalog> load_catalog(const std::string& path) {
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  return parse_catalog(j, path);
}

const Catalog& default_catalog() {
  static const Catalog* c = [] {
    auto j = parse_json(embedded::kCatalogJson, "data/catalog.json");
    MSI_CHECK(j.ok()) << j.status().to_string();
    auto cat = parse_catalog(*j, "embedded data/catalog.json");
    MSI_CHECK(cat.ok()) << cat.status().to_string();
    return new Catalog(std::move(cat).value());
  }();
  return *c;
}

}  // namespace msinfer::planner
