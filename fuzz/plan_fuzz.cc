// libFuzzer target for the plan document reader (`simulate --plan`, `generate
// --plan`). Run by fuzz/run.
#include <cmath>

#include "json_fuzz.h"
#include "msinfer/planner/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = msinfer::fuzz::parse(data, size);
  if (!j) return 0;
  auto d = msinfer::planner::deployment_from_plan_document(*j, "plan.json");
  if (d.ok()) {
    // An accepted plan's counts are positive.
    if (d->gpus() <= 0 || d->global_batch() <= 0) __builtin_trap();
    // What simulate prints for it: every figure finite and >= 0 (issue 12 item 3).
    const msinfer::Json p = msinfer::planner::predict(*d).to_json();
    for (const auto& [k, v] : p.items()) {
      if (v.is_number() && !(std::isfinite(v.get<double>()) && v.get<double>() >= 0)) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
