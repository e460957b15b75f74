#include "internal/rebalancer.h"

#include <cstdio>

#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/device_backend.h"

namespace msinfer::runtime {

Status check_rebalancing(const WorkerConfig& c, int experts) {
  if (c.rebalance_every <= 0) return ok_status();
  if (!is_cpu_device(c.expert_device)) {
    return unimplemented("online rebalancing (--rebalance-every) runs on CPU expert workers only");
  }
  if (!(c.rebalance_gain >= 1.0)) return invalid_argument("--rebalance-gain must be >= 1");
  if (!(c.rebalance_fixed_rows >= 0)) {
    return invalid_argument("--rebalance-fixed-rows must be >= 0");
  }
  if (c.rebalance_slots > 0 &&
      static_cast<int64_t>(c.rebalance_slots) * c.expert_workers < experts) {
    return invalid_argument("--rebalance-slots " + std::to_string(c.rebalance_slots) + " x " +
                            std::to_string(c.expert_workers) +
                            " expert workers hold fewer than the " + std::to_string(experts) +
                            " experts");
  }
  return ok_status();
}

namespace internal {

template <typename T>
StatusOr<T> Rebalancer::ask(WorkerProcess& w, const control::Command& c) {
  MSI_ASSIGN_OR_RETURN(control::Event e, ask_(w, c));
  return control::expect<T>(std::move(e), workers_.name_of(w));
}

Status Rebalancer::init() {
  if (c_.rebalance_every <= 0) return ok_status();
  MSI_ASSIGN_OR_RETURN(ModelConfig mc, load_model_config(c_.model_dir));
  MSI_RETURN_IF_ERROR(check_rebalancing(c_, static_cast<int>(mc.experts)));
  layers_ = static_cast<int>(mc.layers);
  moe_layers_ = static_cast<int>(mc.moe_layers);
  experts_ = static_cast<int>(mc.experts);
  slots_ = c_.rebalance_slots;
  for (int w = 0; w < c_.placement.workers; ++w) {
    slots_ = std::max(slots_, static_cast<int>(c_.placement.experts_on(w).size()));
  }
  return ok_status();
}

void Rebalancer::forget() {
  pending_.reset();
  steps_since_look_ = 0;
  routed_.clear();
  routed_steps_ = 0;
}

Status Rebalancer::tick(const std::function<int()>& experts_lost) {
  if (c_.rebalance_every <= 0) return ok_status();
  // A new placement would put experts on every worker, a dropped one too:
  // rebalancing stops once an expert worker was lost (docs/RUNTIME.md).
  const int lost = experts_lost();
  if (lost > 0) {
    if (pending_) abandon("an expert worker was lost; online rebalancing stops");
    return ok_status();
  }
  Status s = ok_status();
  if (pending_) {
    s = switch_when_loaded();
  } else if (++steps_since_look_ >= c_.rebalance_every) {
    steps_since_look_ = 0;
    s = consider();
  }
  if (!s.ok() && experts_lost() > lost) {  // a worker asked was dropped meanwhile
    if (pending_) abandon("an expert worker was lost; online rebalancing stops");
    return ok_status();
  }
  return s;
}

Status Rebalancer::consider() {
  const int L = layers_, E = experts_, N = c_.expert_workers;
  // Rows per (layer, expert) since the last look (shard 0 of each expert
  // worker counts its experts' rows), added to those since the last decision.
  std::vector<int64_t>& counts = routed_;
  counts.resize(static_cast<size_t>(L) * E, 0);
  routed_steps_ += c_.rebalance_every;
  for (WorkerProcess& w : workers_.all()) {
    if (w.role != WorkerRole::kExpert || w.tp_rank != 0) continue;
    MSI_ASSIGN_OR_RETURN(control::RoutedRows r, ask<control::RoutedRows>(w, control::GetRouted{}));
    if (r.rows.size() != counts.size()) {
      return internal_error(workers_.name_of(w) + ": expected " + std::to_string(counts.size()) +
                            " routed row counts, got " + std::to_string(r.rows.size()));
    }
    for (size_t i = 0; i < counts.size(); ++i) counts[i] += r.rows[i];
  }
  // Decide on enough rows only: a placement fitted to a handful of rows is
  // fitted to their noise (a window of 16 rows per layer moved experts back
  // and forth at every look).
  // Layers without routed experts (DeepSeek's dense ones) count for nothing.
  int64_t rows = 0;
  for (int64_t n : counts) rows += n;
  if (rows < kRebalanceMinRows * moe_layers_ * N) return ok_status();
  const std::vector<int64_t> window = std::move(counts);
  const int64_t window_steps = routed_steps_;
  counts.assign(window.size(), 0);
  routed_steps_ = 0;
  std::vector<double> totals(static_cast<size_t>(E), 0.0);
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) totals[e] += static_cast<double>(window[l * E + e]);
  }
  // A replica's fixed cost over the window: per layer, and over all layers.
  const double fixed = c_.rebalance_fixed_rows * static_cast<double>(window_steps);
  auto before = balancedness(predicted_worker_loads(window, L, c_.placement, fixed), L, N);
  if (!before) return ok_status();  // nothing routed
  auto candidate = balance_placement(totals, N, slots_, fixed * moe_layers_);
  if (!candidate.ok()) return ok_status();  // e.g. a worker would be left without an expert
  Placement next = std::move(candidate).value();
  next.tp_expert = c_.placement.tp_expert;
  next.tp_expert_reduce = c_.placement.tp_expert_reduce;
  next.tp_attention = c_.placement.tp_attention;
  auto after = balancedness(predicted_worker_loads(window, L, next, fixed), L, N);
  if (!after || *before < *after * c_.rebalance_gain) return ok_status();
  const control::Prepare prepare{next};
  int64_t loading = 0;
  for (WorkerProcess& w : workers_.all()) {
    if (w.role != WorkerRole::kExpert) continue;
    MSI_ASSIGN_OR_RETURN(control::Event e, ask_(w, prepare));
    auto p = control::expect<control::Preparing>(std::move(e), workers_.name_of(w));
    if (!p.ok()) {
      abandon(p.status().message());
      return ok_status();
    }
    loading += p->experts;
  }
  std::fprintf(stderr,
               "msinfer: router: rebalancing: max/mean expert-worker load %.3f -> %.3f "
               "(predicted over the last %lld steps); the expert processes load the %lld expert "
               "slice(s) they lack while serving\n",
               *before, *after, static_cast<long long>(window_steps),
               static_cast<long long>(loading));
  pending_ = std::move(next);
  return ok_status();
}

Status Rebalancer::switch_when_loaded() {
  for (WorkerProcess& w : workers_.all()) {
    if (w.role != WorkerRole::kExpert) continue;
    MSI_ASSIGN_OR_RETURN(control::Event e, ask_(w, control::GetPrepared{}));
    auto p = control::expect<control::PreparedState>(std::move(e), workers_.name_of(w));
    if (!p.ok()) {
      abandon(p.status().message());
      return ok_status();
    }
    if (!p->ready) return ok_status();  // look again after the next step
  }
  // Every expert process holds its new experts: switch them all, then the
  // attention workers, before the next step sends a row. A death meanwhile
  // is not dropped in place: the workers would hold two placements.
  switching_ = true;
  struct Done {
    bool& b;
    ~Done() { b = false; }
  } done{switching_};
  for (WorkerProcess& w : workers_.all()) {
    if (w.role != WorkerRole::kExpert) continue;
    MSI_ASSIGN_OR_RETURN(control::Switched s, ask<control::Switched>(w, control::Switch{}));
    w.rss_mb = s.rss_mb;
  }
  const control::SetPlacement set{*pending_};
  for (int a = 0; a < c_.attention_workers; ++a) {
    WorkerProcess& lead = workers_.lead(a);
    if (lead.dead) continue;
    auto e = ask_(lead, set);
    if (!e.ok() && lead.dead) continue;  // dropped meanwhile
    MSI_RETURN_IF_ERROR(e.status());
    MSI_RETURN_IF_ERROR(
        control::expect<control::PlacementSet>(std::move(e).value(), workers_.name_of(lead))
            .status());
  }
  c_.placement = std::move(*pending_);
  pending_.reset();
  ++rebalances_;
  std::fprintf(stderr, "msinfer: router: rebalanced (%d so far):\n%s", rebalances_,
               c_.placement.describe().c_str());
  return ok_status();
}

void Rebalancer::abandon(const std::string& why) {
  std::fprintf(stderr, "msinfer: router: rebalancing abandoned: %s\n", why.c_str());
  for (WorkerProcess& w : workers_.all()) {
    if (w.role != WorkerRole::kExpert || w.dead) continue;
    (void)ask_(w, control::Abandon{});  // a death is reported at the next step
  }
  pending_.reset();
}

}  // namespace internal
}  // namespace msinfer::runtime
