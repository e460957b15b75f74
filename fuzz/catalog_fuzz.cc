// libFuzzer target for the hardware catalogue reader. Run by fuzz/run.
#include "json_fuzz.h"
#include "msinfer/planner/catalog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = msinfer::fuzz::parse(data, size);
  if (!j) return 0;
  auto c = msinfer::planner::parse_catalog(*j, "catalog.json");
  if (c.ok()) {
    for (const auto& g : c->gpus) (void)g.to_json().dump();
    for (double b : {1.0, 4096.0, 1e6, 1e12}) (void)c->nic_util.at(b);
    (void)c->find("A100");
  }
  return 0;
}
