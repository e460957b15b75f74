// Which attention replica the router sends a request to (docs/RUNTIME.md,
// "Cache-aware routing"; --routing, --routing-load-slack).
//
// Each attention replica has its own prefix cache. The router keeps, per
// replica, a PrefixIndex of the chain hashes (prefix_hash.h) of the blocks
// that replica's cache has registered, fed by the registrations and
// evictions each step's answer carries (control::Stepped), and under
// kCacheAware sends a request to the replica whose index holds the longest
// prefix of the request's chain, among the replicas whose load is within
// `load_slack` tokens of the least-loaded one's.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer::runtime {

//  kCacheAware: the longest cached prefix within the load slack (ties: the
//    least load, then the lowest index); least-loaded when no replica holds
//    any block of it, with one replica, or without prefix caching.
//  kLeastLoaded: the least outstanding tokens (prompt + n x max_tokens of
//    the requests in flight; ties: the lowest index).
//  kRoundRobin: the next live replica after the last one chosen.
enum class RoutingPolicy { kCacheAware, kLeastLoaded, kRoundRobin };
const char* routing_policy_name(RoutingPolicy p);  // "cache-aware", "least-loaded", "round-robin"
StatusOr<RoutingPolicy> parse_routing_policy(const std::string& s, const std::string& where);

// What the router knows of one attention replica when it routes a request.
struct ReplicaView {
  bool live = false;
  int64_t load = 0;           // outstanding tokens (Router: prompt + n x max_tokens)
  int64_t cached_blocks = 0;  // leading blocks of the request's chain in its index
};

// The replica `policy` picks among `replicas`, or -1 when none is live.
// `round_robin` is the round-robin cursor (the replica after the last one
// chosen); kRoundRobin moves it. Pure: no I/O.
int choose_attention_replica(RoutingPolicy policy, const std::vector<ReplicaView>& replicas,
                             int64_t load_slack, int* round_robin);

// The chain hashes a replica's prefix cache holds, as the router last heard
// (registrations minus evictions; a hash counts once per layer group that
// registered it). 8 bytes of key and 4 of count per block: an index of a
// replica whose cache holds 100k blocks (12.8M tokens at 128) is a few MB.
// Not thread-safe: the router's thread only.
class PrefixIndex {
 public:
  // Applies one step's events: `removed` first, then `stored` (the order the
  // worker took them; a removal of a hash it does not hold is ignored).
  void apply(const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed);
  // Leading hashes of `chain` (prefix_chain_hashes) held here.
  int64_t match(const std::vector<uint64_t>& chain) const;
  bool contains(uint64_t h) const { return count_.count(h) > 0; }
  int64_t size() const { return static_cast<int64_t>(count_.size()); }
  void clear() { count_.clear(); }

 private:
  std::unordered_map<uint64_t, int32_t> count_;
};

}  // namespace msinfer::runtime
