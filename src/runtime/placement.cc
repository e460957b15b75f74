// Placement of experts over expert workers, and its JSON form. Apart from
// disaggregated.cc so that its reader builds alone (fuzz/run).
#include "msinfer/runtime/placement.h"

#include <cmath>
#include <string>

namespace msinfer::runtime {

const char* expert_reduce_name(ExpertReduce r) {
  return r == ExpertReduce::kAllReduce ? "allreduce" : "attention-sum";
}

StatusOr<ExpertReduce> parse_expert_reduce(const std::string& s, const std::string& where) {
  if (s == "attention-sum") return ExpertReduce::kAttentionSum;
  if (s == "allreduce") return ExpertReduce::kAllReduce;
  return invalid_argument(where + ": expected attention-sum or allreduce, got '" + s + "'");
}

const char* shared_experts_name(SharedExpertsOn s) {
  return s == SharedExpertsOn::kExpert ? "expert" : "attention";
}

StatusOr<SharedExpertsOn> parse_shared_experts(const std::string& s, const std::string& where) {
  if (s == "attention") return SharedExpertsOn::kAttention;
  if (s == "expert") return SharedExpertsOn::kExpert;
  return invalid_argument(where + ": expected attention or expert, got '" + s + "'");
}

Placement Placement::round_robin(int experts, int workers) {
  Placement p;
  p.workers = workers;
  p.replicas.resize(experts);
  for (int e = 0; e < experts; ++e) p.replicas[e] = {{e % workers, 1.0}};
  return p;
}

StatusOr<Placement> Placement::from_json(const Json& j, int experts, const std::string& source) {
  // Valid ranges (docs/RUNTIME.md): expert_workers 1..kMaxExpertWorkers; each
  // expert a worker index in 0..expert_workers-1 or [[worker, share], ...] with
  // distinct workers and finite shares > 0 that sum to 1.
  JsonFields f(j, source);
  MSI_RETURN_IF_ERROR(f.expect_object());
  Placement p;
  MSI_ASSIGN_OR_RETURN(int64_t n, f.integer_in("expert_workers", 1, kMaxExpertWorkers));
  p.workers = static_cast<int>(n);
  if (f.has("tp_expert")) {
    MSI_ASSIGN_OR_RETURN(int64_t tp, f.integer_in("tp_expert", 1, kMaxTp));
    p.tp_expert = static_cast<int>(tp);
  }
  if (f.has("tp_attention")) {
    MSI_ASSIGN_OR_RETURN(int64_t tp, f.integer_in("tp_attention", 1, kMaxTp));
    p.tp_attention = static_cast<int>(tp);
  }
  if (f.has("tp_expert_reduce")) {
    MSI_ASSIGN_OR_RETURN(std::string red, f.string("tp_expert_reduce"));
    MSI_ASSIGN_OR_RETURN(p.tp_expert_reduce,
                         parse_expert_reduce(red, source + ": tp_expert_reduce"));
  }
  if (!f.has("experts") || !j.at("experts").is_array() ||
      j.at("experts").size() != static_cast<size_t>(experts)) {
    return f.field_error("experts",
                         "must list one entry per expert (" + std::to_string(experts) + ")");
  }
  // A worker index read as 64 bits and range-checked before narrowing
  // (4294967296 must not become worker 0).
  auto worker_index = [&](const Json& w, int64_t* out) {
    if (!w.is_number_integer()) return false;
    if (w.is_number_unsigned() && w.get<uint64_t>() > static_cast<uint64_t>(n)) return false;
    *out = w.get<int64_t>();
    return *out >= 0 && *out < n;
  };
  for (int e = 0; e < experts; ++e) {
    const Json& x = j.at("experts")[e];
    std::vector<std::pair<int, double>> reps;
    const std::string where = source + ": experts[" + std::to_string(e) + "]";
    const std::string range = "a worker index in 0.." + std::to_string(n - 1);
    int64_t w = 0;
    if (x.is_number()) {
      if (!worker_index(x, &w))
        return invalid_argument(where + ": expected " + range + ", got " + x.dump());
      reps.emplace_back(static_cast<int>(w), 1.0);
    } else if (x.is_array() && !x.empty() && x.size() <= static_cast<size_t>(n)) {
      for (const auto& r : x) {
        if (!r.is_array() || r.size() != 2 || !r[1].is_number()) {
          return invalid_argument(where + ": expected [worker, share] pairs");
        }
        if (!worker_index(r[0], &w)) {
          return invalid_argument(where + ": expected " + range + ", got " + r[0].dump());
        }
        for (const auto& [other, share] : reps) {
          if (other == w)
            return invalid_argument(where + ": worker " + std::to_string(w) + " listed twice");
        }
        reps.emplace_back(static_cast<int>(w), r[1].get<double>());
      }
    } else {
      return invalid_argument(where +
                              ": expected a worker index or [[worker, share], ...] (at most one "
                              "pair per expert worker)");
    }
    p.replicas.push_back(reps);
  }
  Status s = p.validate(experts);
  if (!s.ok()) return s.with_context(source);
  return p;
}

Status Placement::validate(int experts) const {
  if (static_cast<int>(replicas.size()) != experts)
    return invalid_argument("placement: wrong expert count");
  std::vector<bool> used(workers, false);
  for (int e = 0; e < experts; ++e) {
    double sum = 0;
    for (auto [w, share] : replicas[e]) {
      if (w < 0 || w >= workers) {
        return invalid_argument("placement: expert " + std::to_string(e) + " on worker " +
                                std::to_string(w) + ", outside 0.." + std::to_string(workers - 1));
      }
      if (!(share > 0) || !std::isfinite(share)) {
        return invalid_argument("placement: expert " + std::to_string(e) + " has a share <= 0");
      }
      sum += share;
      used[w] = true;
    }
    if (std::fabs(sum - 1.0) > 1e-6) {
      return invalid_argument("placement: shares of expert " + std::to_string(e) + " sum to " +
                              std::to_string(sum) + ", not 1");
    }
  }
  for (int w = 0; w < workers; ++w) {
    if (!used[w])
      return invalid_argument("placement: expert worker " + std::to_string(w) + " holds no expert");
  }
  return ok_status();
}

StatusOr<Placement> Placement::emptied(int worker) const {
  if (worker < 0 || worker >= workers) {
    return invalid_argument("placement: no expert worker " + std::to_string(worker));
  }
  Placement p = *this;
  std::string orphans;
  for (size_t e = 0; e < replicas.size(); ++e) {
    std::vector<std::pair<int, double>> kept;
    double total = 0;
    for (const auto& [w, share] : replicas[e]) {
      if (w == worker) continue;
      kept.emplace_back(w, share);
      total += share;
    }
    if (kept.empty() || !(total > 0)) {
      orphans += (orphans.empty() ? "" : ", ") + std::to_string(e);
      continue;
    }
    for (auto& r : kept) r.second /= total;
    p.replicas[e] = std::move(kept);
  }
  if (!orphans.empty()) {
    return failed_precondition("expert(s) " + orphans + " have no replica outside expert worker " +
                               std::to_string(worker));
  }
  return p;
}

StatusOr<Placement> Placement::without(int worker) const {
  MSI_ASSIGN_OR_RETURN(Placement p, emptied(worker));
  p.workers = workers - 1;
  for (auto& reps : p.replicas) {
    for (auto& r : reps) r.first -= r.first > worker ? 1 : 0;
  }
  return p;
}

std::vector<std::pair<int, double>> Placement::shares_on(int worker) const {
  std::vector<std::pair<int, double>> out;
  for (int e = 0; e < static_cast<int>(replicas.size()); ++e) {
    for (auto [w, share] : replicas[e]) {
      if (w == worker) out.emplace_back(e, share);
    }
  }
  return out;
}

StatusOr<Placement> Placement::with_worker(
    int worker, const std::vector<std::pair<int, double>>& shares) const {
  if (worker < 0 || worker >= workers) {
    return invalid_argument("placement: no expert worker " + std::to_string(worker));
  }
  Placement p = *this;
  for (auto [e, share] : shares) {
    if (e < 0 || e >= static_cast<int>(replicas.size()) || !(share > 0) || !(share <= 1)) {
      return invalid_argument("placement: expert " + std::to_string(e) + " with share " +
                              std::to_string(share) + " for expert worker " +
                              std::to_string(worker));
    }
    auto& reps = p.replicas[static_cast<size_t>(e)];
    std::vector<std::pair<int, double>> kept;
    double total = 0;
    for (const auto& r : reps) {
      if (r.first == worker) continue;
      kept.push_back(r);
      total += r.second;
    }
    if (kept.empty() || !(total > 0) || share >= 1) {
      reps = {{worker, 1.0}};
      continue;
    }
    for (auto& r : kept) r.second *= (1 - share) / total;
    kept.emplace_back(worker, share);
    reps = std::move(kept);
  }
  return p;
}

std::vector<int> Placement::experts_on(int worker) const {
  std::vector<int> out;
  for (auto [e, share] : shares_on(worker)) out.push_back(e);
  return out;
}

Json Placement::to_json() const {
  Json ex = Json::array();
  for (const auto& reps : replicas) {
    Json r = Json::array();
    for (auto [w, share] : reps) r.push_back({w, share});
    ex.push_back(r);
  }
  Json j{{"expert_workers", workers}, {"experts", ex}};
  if (tp_expert > 1) j["tp_expert"] = tp_expert;
  if (tp_attention > 1) j["tp_attention"] = tp_attention;
  if (tp_expert_reduce) j["tp_expert_reduce"] = expert_reduce_name(*tp_expert_reduce);
  return j;
}

std::string Placement::describe() const {
  std::string s;
  for (int w = 0; w < workers; ++w) {
    s += "expert worker " + std::to_string(w) + ": experts";
    for (int e : experts_on(w)) {
      s += " " + std::to_string(e);
      for (auto [ww, share] : replicas[e]) {
        if (ww == w && share < 1.0) s += "(x" + std::to_string(share).substr(0, 4) + ")";
      }
    }
    s += "\n";
  }
  return s;
}

}  // namespace msinfer::runtime
