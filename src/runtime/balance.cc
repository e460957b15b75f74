#include "msinfer/runtime/balance.h"

#include <algorithm>
#include <cmath>

namespace msinfer::runtime {
namespace {

constexpr int64_t kMaxLayers = 4096, kMaxExperts = 4096;

Json matrix(const std::vector<int64_t>& x, int rows, int cols) {
  Json m = Json::array();
  for (int r = 0; r < rows; ++r) {
    m.push_back(std::vector<int64_t>(x.begin() + static_cast<ptrdiff_t>(r) * cols,
                                     x.begin() + static_cast<ptrdiff_t>(r + 1) * cols));
  }
  return m;
}

Json ratio_json(const std::optional<double>& r) { return r ? Json(*r) : Json(nullptr); }

// balancedness over all layers and per layer, as JSON.
void add_balance(Json& j, const std::string& key, const std::vector<int64_t>& x, int layers,
                 int n) {
  const std::vector<double> d(x.begin(), x.end());
  j[key] = ratio_json(balancedness(d, layers, n));
  Json per = Json::array();
  for (int l = 0; l < layers; ++l) per.push_back(ratio_json(layer_balancedness(d, l, n)));
  j[key + "_per_layer"] = per;
}

// [rows][cols] non-negative integers.
StatusOr<std::vector<int64_t>> read_matrix(const JsonFields& f, const std::string& key, int rows,
                                           int cols) {
  const Json& j = f.json();
  if (!j.contains(key) || !j.at(key).is_array() || j.at(key).size() != static_cast<size_t>(rows)) {
    return f.field_error(key, "expected " + std::to_string(rows) + " rows (one per layer)");
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const Json& row = j.at(key)[r];
    if (!row.is_array() || row.size() != static_cast<size_t>(cols)) {
      return f.field_error(
          key, "row " + std::to_string(r) + ": expected " + std::to_string(cols) + " counts");
    }
    for (const Json& v : row) {
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
        return f.field_error(
            key, "row " + std::to_string(r) + ": expected non-negative integers, got " + v.dump());
      }
      out.push_back(v.get<int64_t>());
    }
  }
  return out;
}

}  // namespace

std::optional<double> layer_balancedness(const std::vector<double>& x, int layer, int n) {
  double mx = 0, sum = 0;
  for (int j = 0; j < n; ++j) {
    const double v = x[static_cast<size_t>(layer) * n + j];
    mx = std::max(mx, v);
    sum += v;
  }
  if (!(sum > 0)) return std::nullopt;
  return mx / (sum / n);
}

std::optional<double> balancedness(const std::vector<double>& x, int layers, int n) {
  double max_sum = 0, mean_sum = 0;
  for (int l = 0; l < layers; ++l) {
    double mx = 0, sum = 0;
    for (int j = 0; j < n; ++j) {
      const double v = x[static_cast<size_t>(l) * n + j];
      mx = std::max(mx, v);
      sum += v;
    }
    max_sum += mx;
    mean_sum += sum / n;
  }
  if (!(mean_sum > 0)) return std::nullopt;
  return max_sum / mean_sum;
}

int layers_with_rows(const std::vector<int64_t>& expert_tokens, int layers, int experts) {
  int n = 0;
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) {
      if (expert_tokens[static_cast<size_t>(l) * experts + e] > 0) {
        ++n;
        break;
      }
    }
  }
  return n;
}

std::vector<double> predicted_worker_loads(const std::vector<int64_t>& expert_tokens, int layers,
                                           const Placement& p, double fixed_per_replica) {
  const int experts = static_cast<int>(p.replicas.size());
  std::vector<double> w(static_cast<size_t>(layers) * p.workers, 0.0);
  for (int l = 0; l < layers; ++l) {
    const auto row = expert_tokens.begin() + static_cast<ptrdiff_t>(l) * experts;
    if (std::all_of(row, row + experts, [](int64_t n) { return n == 0; })) {
      continue;  // no expert work in this layer
    }
    for (int e = 0; e < experts; ++e) {
      for (auto [worker, share] : p.replicas[e]) {
        w[static_cast<size_t>(l) * p.workers + worker] +=
            fixed_per_replica +
            share * static_cast<double>(expert_tokens[static_cast<size_t>(l) * experts + e]);
      }
    }
  }
  return w;
}

RoutingStats RoutingStats::from_window(const RoutingWindow& w) {
  RoutingStats s;
  s.layers = w.layers();
  s.experts = w.experts();
  s.window_steps = RoutingWindow::kWindowSteps;
  s.steps = w.steps();
  s.expert_tokens = w.counts();
  return s;
}

StatusOr<RoutingStats> RoutingStats::from_workers(const std::vector<Json>& workers,
                                                  const Placement& placement, int layers,
                                                  int experts) {
  RoutingStats s;
  s.layers = layers;
  s.experts = experts;
  s.window_steps = RoutingWindow::kWindowSteps;
  s.workers = placement.workers;
  s.placement = placement;
  s.expert_tokens.assign(static_cast<size_t>(layers) * experts, 0);
  s.worker_tokens.assign(static_cast<size_t>(layers) * s.workers, 0);
  for (const Json& w : workers) {
    if (w.value("role", std::string()) != "expert") continue;
    const int index = w.value("index", -1);
    const std::string who = "expert worker " + std::to_string(index);
    if (index < 0 || index >= s.workers || !w.contains("routed")) {
      return internal_error(who + ": no routing window in its stats");
    }
    JsonFields f(w.at("routed"), who + " stats: routed");
    MSI_ASSIGN_OR_RETURN(int64_t steps, f.integer_at_least("steps", 0));
    s.steps = std::max(s.steps, steps);
    MSI_ASSIGN_OR_RETURN(std::vector<int64_t> m,
                         read_matrix(f, "layer_expert_tokens", layers, experts));
    for (int l = 0; l < layers; ++l) {
      for (int e = 0; e < experts; ++e) {
        const int64_t n = m[static_cast<size_t>(l) * experts + e];
        s.expert_tokens[static_cast<size_t>(l) * experts + e] += n;
        s.worker_tokens[static_cast<size_t>(l) * s.workers + index] += n;
      }
    }
  }
  return s;
}

StatusOr<RoutingStats> RoutingStats::from_json(const Json& doc, const std::string& source) {
  const Json& j = doc.is_object() && doc.contains("routing") ? doc.at("routing") : doc;
  JsonFields f(j, doc.is_object() && doc.contains("routing") ? source + ": routing" : source);
  MSI_RETURN_IF_ERROR(f.expect_object());
  RoutingStats s;
  MSI_ASSIGN_OR_RETURN(int64_t layers, f.integer_in("layers", 1, kMaxLayers));
  MSI_ASSIGN_OR_RETURN(int64_t experts, f.integer_in("experts", 1, kMaxExperts));
  s.layers = static_cast<int>(layers);
  s.experts = static_cast<int>(experts);
  MSI_ASSIGN_OR_RETURN(s.window_steps, f.integer_or("window_steps", 0));
  MSI_ASSIGN_OR_RETURN(s.steps, f.integer_or("steps", 0));
  MSI_ASSIGN_OR_RETURN(s.expert_tokens, read_matrix(f, "expert_tokens", s.layers, s.experts));
  if (f.has("expert_workers")) {
    MSI_ASSIGN_OR_RETURN(int64_t n,
                         f.integer_in("expert_workers", 1, Placement::kMaxExpertWorkers));
    s.workers = static_cast<int>(n);
    MSI_ASSIGN_OR_RETURN(s.worker_tokens, read_matrix(f, "worker_tokens", s.layers, s.workers));
  }
  return s;
}

std::vector<double> RoutingStats::expert_totals() const {
  std::vector<double> t(experts, 0.0);
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) {
      t[e] += static_cast<double>(expert_tokens[static_cast<size_t>(l) * experts + e]);
    }
  }
  return t;
}

Json RoutingStats::to_json() const {
  Json j{{"window_steps", window_steps},
         {"steps", steps},
         {"layers", layers},
         {"experts", experts},
         {"expert_tokens", matrix(expert_tokens, layers, experts)}};
  add_balance(j, "expert_balance", expert_tokens, layers, experts);
  if (workers > 0) {
    j["expert_workers"] = workers;
    j["worker_tokens"] = matrix(worker_tokens, layers, workers);
    add_balance(j, "worker_balance", worker_tokens, layers, workers);
  }
  if (placement) j["placement"] = placement->to_json();
  if (placement_switches >= 0) j["placement_switches"] = placement_switches;
  return j;
}

std::vector<std::vector<int64_t>> split_rows(const Placement& p,
                                             const std::vector<int64_t>& expert_rows) {
  const int E = static_cast<int>(p.replicas.size());
  std::vector<std::vector<int64_t>> take(E);
  std::vector<int64_t> load(p.workers, 0);
  std::vector<int> replicated;
  for (int e = 0; e < E; ++e) {
    take[e].assign(p.replicas[e].size(), 0);
    if (p.replicas[e].size() == 1) {
      take[e][0] = expert_rows[e];
      load[p.replicas[e][0].first] += expert_rows[e];
    } else {
      replicated.push_back(e);
    }
  }
  std::stable_sort(replicated.begin(), replicated.end(),
                   [&](int a, int b) { return expert_rows[a] > expert_rows[b]; });
  for (int e : replicated) {
    const auto& reps = p.replicas[e];
    for (int64_t row = 0; row < expert_rows[e]; ++row) {
      size_t best = 0;
      for (size_t j = 1; j < reps.size(); ++j) {
        if (load[reps[j].first] < load[reps[best].first]) best = j;
      }
      ++take[e][best];
      ++load[reps[best].first];
    }
  }
  return take;
}

StatusOr<Placement> balance_placement(const std::vector<double>& load, int workers,
                                      int slots_per_worker, double fixed_cost) {
  const int E = static_cast<int>(load.size());
  if (E < 1) return invalid_argument("balance: no experts");
  for (int e = 0; e < E; ++e) {
    if (!(load[e] >= 0) || !std::isfinite(load[e])) {
      return invalid_argument("balance: expert " + std::to_string(e) + " has load " +
                              std::to_string(load[e]) + " (must be finite and >= 0)");
    }
  }
  if (workers < 1 || workers > Placement::kMaxExpertWorkers) {
    return invalid_argument("balance: expert workers must be in 1.." +
                            std::to_string(Placement::kMaxExpertWorkers));
  }
  if (slots_per_worker < 1) return invalid_argument("balance: slots per worker must be >= 1");
  if (!(fixed_cost >= 0) || !std::isfinite(fixed_cost)) {
    return invalid_argument("balance: the fixed cost per replica must be finite and >= 0");
  }
  const int64_t slots = static_cast<int64_t>(workers) * slots_per_worker;
  if (slots < E) {
    return invalid_argument("balance: " + std::to_string(workers) + " expert workers x " +
                            std::to_string(slots_per_worker) + " slots = " + std::to_string(slots) +
                            " slots for " + std::to_string(E) + " experts: every expert needs one");
  }
  // 2. LPT: replicas largest first to the least-loaded eligible worker. Each
  // replica costs fixed_cost + its expert's load / its replicas.
  struct Lpt {
    double max_load = 0;
    std::vector<int> held;
    std::vector<std::vector<int>> on;  // workers holding a replica of e
  };
  auto lpt = [&](const std::vector<int>& replicas) {
    struct Item {
      double load;
      int expert;
    };
    std::vector<Item> items;
    for (int e = 0; e < E; ++e) {
      for (int r = 0; r < replicas[e]; ++r) items.push_back({fixed_cost + load[e] / replicas[e], e});
    }
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.load > b.load || (a.load == b.load && a.expert < b.expert);
    });
    Lpt out;
    std::vector<double> worker_load(workers, 0.0);
    out.held.assign(workers, 0);
    out.on.assign(E, {});
    for (const Item& it : items) {
      int best = -1;
      const auto& on = out.on[it.expert];
      for (int w = 0; w < workers; ++w) {
        if (out.held[w] >= slots_per_worker) continue;
        if (std::find(on.begin(), on.end(), w) != on.end()) continue;
        if (best < 0 || worker_load[w] < worker_load[best] ||
            (worker_load[w] == worker_load[best] && out.held[w] < out.held[best])) {
          best = w;
        }
      }
      // None: only workers holding this expert have room; the replica is
      // dropped (an expert's first replica always finds a slot: slots >= E).
      if (best < 0) continue;
      out.on[it.expert].push_back(best);
      out.held[best] += 1;
      worker_load[best] += it.load;
    }
    out.max_load = *std::max_element(worker_load.begin(), worker_load.end());
    return out;
  };
  // 1. Replica counts: spare slots to the highest load per replica. With a
  // fixed cost per replica, a slot is given only while the predicted max load
  // falls (or some worker would hold nothing).
  std::vector<int> replicas(E, 1);
  int64_t placed = E;
  Lpt current = lpt(replicas);
  for (int64_t spare = slots - E; spare > 0; --spare) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (replicas[e] >= workers) continue;
      if (best < 0 || load[e] / replicas[e] > load[best] / replicas[best]) best = e;
    }
    if (best < 0) break;  // every expert on every worker already
    ++replicas[best];
    if (fixed_cost > 0) {
      Lpt next = lpt(replicas);
      if (next.max_load >= current.max_load && placed >= workers) {
        --replicas[best];
        break;
      }
      current = std::move(next);
    }
    ++placed;
  }
  if (fixed_cost == 0) current = lpt(replicas);
  const std::vector<int>& held = current.held;
  std::vector<std::vector<int>>& on = current.on;
  Placement p;
  p.workers = workers;
  p.replicas.resize(E);
  for (int e = 0; e < E; ++e) {
    if (on[e].empty()) return internal_error("balance: expert " + std::to_string(e) + " unplaced");
    std::sort(on[e].begin(), on[e].end());
    for (int w : on[e]) p.replicas[e].emplace_back(w, 1.0 / static_cast<double>(on[e].size()));
  }
  for (int w = 0; w < workers; ++w) {
    if (held[w] == 0) {
      return invalid_argument("balance: expert worker " + std::to_string(w) +
                              " would hold no expert (" + std::to_string(E) + " experts, " +
                              std::to_string(slots_per_worker) +
                              " slots per worker: use fewer workers or more slots)");
    }
  }
  return p;
}

}  // namespace msinfer::runtime
