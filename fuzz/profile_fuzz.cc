// libFuzzer target for the profile reader (`msinfer plan --profile`). Run by fuzz/run.
#include "json_fuzz.h"
#include "msinfer/planner/perf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = msinfer::fuzz::parse(data, size);
  if (!j) return 0;
  auto p = msinfer::planner::parse_profile(*j, "profile.json");
  if (p.ok() && p->nic_util) (void)p->nic_util->at(65536);
  return 0;
}
