// libFuzzer target for the routing statistics reader (`msinfer balance
// --stats`) and the placement it computes. Run by fuzz/run.
#include "json_fuzz.h"
#include "msinfer/runtime/balance.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int workers = 1 + data[0] % 16;  // first bytes: --expert-workers, --slots-per-worker
  const int slots = 1 + data[1] % 16;
  auto j = msinfer::fuzz::parse(data + 2, size - 2);
  if (!j) return 0;
  auto st = msinfer::runtime::RoutingStats::from_json(*j, "stats.json");
  if (!st.ok()) return 0;
  (void)st->to_json().dump();
  const double fixed = (data[0] >> 4) * 8.0;  // --expert-fixed-rows, as a load
  auto p = msinfer::runtime::balance_placement(st->expert_totals(), workers, slots, fixed);
  if (p.ok()) {
    if (!p->validate(st->experts).ok())
      __builtin_trap();  // the placement must be one the runtime takes
    (void)msinfer::runtime::predicted_worker_loads(st->expert_tokens, st->layers, *p);
  }
  return 0;
}
