// The forward pass on a GPU (builds with MSINFER_WITH_CUDA): the same steps as
// AttentionRunner / ExpertRunner with kernels/cuda. Weights are bf16 copies in
// device memory, loaded from the checkpoint (not from the host's packed
// copies); the KV pools live in device memory; the hidden states cross the
// AttentionCompute interface in host memory (copied in and out per layer),
// which keeps the engine, the micro-batch ping-pong and the M2N path unchanged.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "msinfer/kernels/cuda/cuda.h"
#include "msinfer/model/safetensors.h"
#include "msinfer/runtime/model_runner.h"

namespace msinfer::runtime {

// A device, a stream on it and cuBLAS handles, shared by a runner's calls.
struct CudaContext {
  kernels::cuda::DeviceInfo device;
  cudaStream_t stream = nullptr;
  std::unique_ptr<kernels::cuda::Blas> blas;
  ~CudaContext();
  static StatusOr<std::unique_ptr<CudaContext>> create(const std::string& device);
  Status sync(const char* what);
};

class CudaAttentionRunner : public AttentionCompute {
 public:
  static StatusOr<std::unique_ptr<CudaAttentionRunner>> create(const std::string& device,
                                                               const model::ModelWeights& w,
                                                               const KvCache& kv);
  Status embed(const TokenBatch& b, float* x) override;
  Status attention_and_gate(int l, const TokenBatch& b, KvCache& kv, float* x,
                            kernels::cpu::RoutedBatch* routed, const int32_t* expert_dest = nullptr,
                            int64_t destinations = 0) override;
  Status logits(const std::vector<const float*>& rows, float* out) override;
  // Device memory held for weights and the KV cache.
  size_t device_bytes() const { return device_bytes_; }

 private:
  struct Layer {
    kernels::cuda::DeviceBuffer input_norm, post_norm, q_norm, k_norm, qkv, o, router;
  };
  explicit CudaAttentionRunner(const ModelConfig& c) : c_(c) {}
  ModelConfig c_;
  std::unique_ptr<CudaContext> ctx_;
  kernels::cuda::DeviceBuffer embed_, final_norm_, lm_head_;
  bool tied_ = false;
  std::vector<Layer> layers_;
  std::vector<kernels::cuda::DeviceBuffer> kpool_, vpool_;
  int64_t block_size_ = 16;
  size_t device_bytes_ = 0;
  // Scratch.
  kernels::cuda::DeviceBuffer x_, h_, qkv_, q_, k_, v_, attn_, o_, router_, ids_, pos_, tables_,
      ws_, topk_id_, topk_w_, rows_, logits_;
  std::vector<int32_t> host_tables_;
  std::vector<float> host_h_;
};

class CudaExpertRunner : public ExpertCompute {
 public:
  static StatusOr<std::unique_ptr<CudaExpertRunner>> create(const std::string& device,
                                                            const model::ModelWeights& w,
                                                            const std::vector<int>& experts);
  Status forward_group(int l, const std::vector<int>& experts, const std::vector<int64_t>& offset,
                       const float* rows, float* out) override;
  size_t device_bytes() const { return device_bytes_; }

 private:
  explicit CudaExpertRunner(const ModelConfig& c) : c_(c) {}
  ModelConfig c_;
  std::unique_ptr<CudaContext> ctx_;
  // [layer][expert]; empty buffers for experts not loaded here.
  std::vector<std::vector<kernels::cuda::DeviceBuffer>> w13_, w2_;
  size_t device_bytes_ = 0;
  kernels::cuda::DeviceBuffer in_, out_;
};

}  // namespace msinfer::runtime
