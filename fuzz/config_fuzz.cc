// libFuzzer target for the HF config.json reader (ModelConfig). Run by fuzz/run.
#include "json_fuzz.h"
#include "msinfer/core/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = msinfer::fuzz::parse(data, size);
  if (!j) return 0;
  auto m = msinfer::parse_hf_config(*j, "config.json");
  if (m.ok()) {
    // Derived sizes of an accepted config are finite (UBSan checks the arithmetic).
    volatile double sink = m->total_params() + m->kv_bytes_per_token_per_layer() +
                           m->attention_side_flops_per_token_per_moe_layer();
    (void)sink;
    (void)m->check_executable();
    (void)m->to_json().dump();
  }
  return 0;
}
