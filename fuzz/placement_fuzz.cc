// libFuzzer target for the expert placement reader (`--placement`). Run by fuzz/run.
#include "json_fuzz.h"
#include "msinfer/runtime/placement.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int experts = 1 + data[0] % 64;  // first byte: the model's expert count
  auto j = msinfer::fuzz::parse(data + 1, size - 1);
  if (!j) return 0;
  auto p = msinfer::runtime::Placement::from_json(*j, experts, "placement.json");
  if (p.ok()) {
    for (int w = 0; w < p->workers; ++w) (void)p->experts_on(w);
    (void)p->describe();
    (void)p->to_json().dump();
  }
  return 0;
}
