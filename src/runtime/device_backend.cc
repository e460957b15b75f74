#include "msinfer/runtime/device_backend.h"

#ifdef MSINFER_WITH_CUDA
#include "msinfer/kernels/cuda/cuda.h"
#include "msinfer/runtime/cuda_runner.h"
#endif

namespace msinfer::runtime {

bool is_cpu_device(const std::string& device) { return device.empty() || device == "cpu"; }

Status check_device_name(const std::string& device) {
  if (is_cpu_device(device)) return ok_status();
  // "cuda" or "cuda:N" with N a decimal index.
  bool ok = device == "cuda";
  if (!ok && device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 9) {
    ok = device.find_first_not_of("0123456789", 5) == std::string::npos;
  }
  if (!ok) return invalid_argument("device '" + device + "': expected cpu, cuda or cuda:N");
  return ok_status();
}

Status check_device(const std::string& device) {
  MSI_RETURN_IF_ERROR(check_device_name(device));
#ifdef MSINFER_WITH_CUDA
  return ok_status();
#else
  if (is_cpu_device(device)) return ok_status();
  return unimplemented("device '" + device +
                       "': this msinfer was built without the CUDA backend (configure with "
                       "-DMSINFER_CUDA=on where a CUDA toolkit is installed)");
#endif
}

model::LoadOptions host_load_options(model::LoadOptions lo, const std::string& device) {
  if (!is_cpu_device(device)) {
    lo.attention = false;
    lo.all_experts = false;
    lo.experts.clear();
  }
  return lo;
}

StatusOr<std::unique_ptr<AttentionCompute>> make_attention_compute(
    const std::string& device, const model::ModelWeights& w, const KvCache& kv) {
  MSI_RETURN_IF_ERROR(check_device(device));
  if (is_cpu_device(device)) return std::unique_ptr<AttentionCompute>(new AttentionRunner(w));
  if (w.config().architecture == "Glm4MoeForCausalLM") {  // biases, partial rotary, dense layers
    return unimplemented(w.config().architecture + " runs on the CPU engine only (--device cpu)");
  }
#ifdef MSINFER_WITH_CUDA
  MSI_ASSIGN_OR_RETURN(auto r, CudaAttentionRunner::create(device, w, kv));
  return std::unique_ptr<AttentionCompute>(std::move(r));
#else
  return unimplemented("unreachable");
#endif
}

StatusOr<std::unique_ptr<ExpertCompute>> make_expert_compute(const std::string& device,
                                                             const model::ModelWeights& w,
                                                             const std::vector<int>& experts) {
  MSI_RETURN_IF_ERROR(check_device(device));
  if (is_cpu_device(device)) return std::unique_ptr<ExpertCompute>(new ExpertRunner(w));
  // FP8 weights (DeepSeek), layers without routed experts (DeepSeek, GLM-4.5),
  // gpt-oss's biased, clamped experts.
  if (w.config().kv_lora_rank > 0 || w.config().moe_layers < w.config().layers ||
      w.config().swiglu_limit > 0) {
    return unimplemented("the experts of " + w.config().architecture +
                         " run on the CPU only (--expert-device cpu)");
  }
#ifdef MSINFER_WITH_CUDA
  MSI_ASSIGN_OR_RETURN(auto r, CudaExpertRunner::create(device, w, experts));
  return std::unique_ptr<ExpertCompute>(std::move(r));
#else
  return unimplemented("unreachable");
#endif
}

}  // namespace msinfer::runtime
