// Where the forward pass runs: "cpu" (kernels/cpu, the default) or "cuda[:N]"
// (kernels/cuda, in builds with MSINFER_WITH_CUDA). The engine and the workers
// ask here for their AttentionCompute / ExpertCompute; nothing else in the
// runtime knows which backend runs (docs/CUDA.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "msinfer/core/status.h"
#include "msinfer/model/weights.h"
#include "msinfer/runtime/kv_cache.h"
#include "msinfer/runtime/model_runner.h"

namespace msinfer::runtime {

// OK for "cpu", "cuda", "cuda:N"; INVALID_ARGUMENT for anything else. The
// same in every build.
Status check_device_name(const std::string& device);
// check_device_name, then UNIMPLEMENTED for a CUDA device in a build without
// the CUDA backend.
Status check_device(const std::string& device);
bool is_cpu_device(const std::string& device);

// What to pack into host memory for a process whose compute runs on `device`:
// everything for the CPU, nothing (the config only) for a GPU, which loads its
// own bf16 copies from the checkpoint.
model::LoadOptions host_load_options(model::LoadOptions lo, const std::string& device);

// The attention side on `device`. A GPU implementation keeps the KV pools in
// device memory with the geometry of `kv` (whose host pools are then unused).
StatusOr<std::unique_ptr<AttentionCompute>> make_attention_compute(
    const std::string& device, const model::ModelWeights& w, const KvCache& kv);
// The experts `experts` (all when empty) on `device`.
StatusOr<std::unique_ptr<ExpertCompute>> make_expert_compute(const std::string& device,
                                                             const model::ModelWeights& w,
                                                             const std::vector<int>& experts);

}  // namespace msinfer::runtime
