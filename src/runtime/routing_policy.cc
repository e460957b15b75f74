#include "msinfer/runtime/routing_policy.h"

namespace msinfer::runtime {

const char* routing_policy_name(RoutingPolicy p) {
  switch (p) {
    case RoutingPolicy::kCacheAware:
      return "cache-aware";
    case RoutingPolicy::kLeastLoaded:
      return "least-loaded";
    case RoutingPolicy::kRoundRobin:
      return "round-robin";
  }
  return "";
}

StatusOr<RoutingPolicy> parse_routing_policy(const std::string& s, const std::string& where) {
  for (RoutingPolicy p :
       {RoutingPolicy::kCacheAware, RoutingPolicy::kLeastLoaded, RoutingPolicy::kRoundRobin}) {
    if (s == routing_policy_name(p)) return p;
  }
  return invalid_argument(where + ": unknown routing policy '" + s +
                          "' (cache-aware, least-loaded, round-robin)");
}

int choose_attention_replica(RoutingPolicy policy, const std::vector<ReplicaView>& replicas,
                             int64_t load_slack, int* round_robin) {
  const int n = static_cast<int>(replicas.size());
  if (policy == RoutingPolicy::kRoundRobin) {
    const int from =
        round_robin != nullptr && *round_robin >= 0 && *round_robin < n ? *round_robin : 0;
    for (int k = 0; k < n; ++k) {
      const int a = (from + k) % n;
      if (!replicas[static_cast<size_t>(a)].live) continue;
      if (round_robin != nullptr) *round_robin = (a + 1) % n;
      return a;
    }
    return -1;
  }
  int least = -1;
  for (int a = 0; a < n; ++a) {
    const ReplicaView& r = replicas[static_cast<size_t>(a)];
    if (r.live && (least < 0 || r.load < replicas[static_cast<size_t>(least)].load)) least = a;
  }
  if (least < 0 || policy == RoutingPolicy::kLeastLoaded) return least;
  // Cache-aware: among the replicas within the slack of the least load, the
  // longest match, then the least load (the least-loaded one when none
  // matches), then the lowest index.
  const int64_t bound = replicas[static_cast<size_t>(least)].load + load_slack;
  int best = least;
  for (int a = 0; a < n; ++a) {
    const ReplicaView& r = replicas[static_cast<size_t>(a)];
    if (!r.live || r.load > bound) continue;
    const ReplicaView& b = replicas[static_cast<size_t>(best)];
    if (r.cached_blocks > b.cached_blocks ||
        (r.cached_blocks == b.cached_blocks && r.load < b.load)) {
      best = a;
    }
  }
  return best;
}

void PrefixIndex::apply(const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed) {
  for (uint64_t h : removed) {
    auto it = count_.find(h);
    if (it != count_.end() && --it->second <= 0) count_.erase(it);
  }
  for (uint64_t h : stored) ++count_[h];
}

int64_t PrefixIndex::match(const std::vector<uint64_t>& chain) const {
  int64_t k = 0;
  while (k < static_cast<int64_t>(chain.size()) && contains(chain[static_cast<size_t>(k)])) ++k;
  return k;
}

}  // namespace msinfer::runtime
