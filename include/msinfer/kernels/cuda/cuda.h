// The CUDA backend's kernels (built with MSINFER_WITH_CUDA; docs/CUDA.md).
// Free functions over device pointers, each enqueued on the given stream, the
// counterparts of kernels/cpu/ with the same layouts: activations fp32, weights
// and the paged KV cache bf16, accumulation fp32. GEMMs go through cuBLASLt
// (bf16 x bf16 -> fp32, the activation rounded to bf16 first, as the CPU's bf16
// levels do); the experts' SwiGLU FFN is one grouped GEMM over all local
// experts (cublasGemmGroupedBatchedEx) per projection.
//
// Errors: the launch functions do not fail on their own; check() turns the
// stream's first error into a Status (INTERNAL, naming the call), and the
// allocation and handle functions return Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "msinfer/core/bf16.h"
#include "msinfer/core/status.h"

namespace msinfer::kernels::cuda {

// ---- devices and memory ----

struct DeviceInfo {
  int index = 0;
  std::string name;
  int multiprocessors = 0;
  int cc_major = 0, cc_minor = 0;
  size_t memory_bytes = 0;
  int memory_clock_khz = 0, memory_bus_bits = 0;  // for the datasheet bandwidth
};

// Number of usable CUDA devices; 0 (and `why` says why) without a driver or GPU.
int device_count(std::string* why = nullptr);
// Makes device `index` current for this thread. UNAVAILABLE without one.
StatusOr<DeviceInfo> open_device(int index);
// "cuda" -> 0, "cuda:1" -> 1; INVALID_ARGUMENT otherwise.
StatusOr<int> parse_device(const std::string& name);
// The stream's (or the last launch's) error as a Status naming `what`.
Status check(const char* what);

// Owning device allocation (cudaMalloc), moved, never copied.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // RESOURCE_EXHAUSTED when the device lacks the memory. Keeps the old
  // allocation when it is already large enough.
  Status reserve(size_t bytes);
  Status upload(const void* host, size_t bytes, cudaStream_t s = nullptr);
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// ---- elementwise and row kernels (ops.cu) ----

// out[t, :] = float(table[ids[t], :]).
void embed(const bf16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float* out,
           cudaStream_t s);
// y = x / rms(x) * w per row of `dim`; y may be x.
void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
              cudaStream_t s);
// Rotary embedding in place (the rotate-half form HF Mixtral/Qwen3 use), x [tokens, heads, hd].
void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          double theta, cudaStream_t s);
// q/k/v [tokens, n] from qkv [tokens, qn + 2 kn].
void split_qkv(const float* qkv, int64_t tokens, int64_t qn, int64_t kn, float* q, float* k,
               float* v, cudaStream_t s);
void to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t s);
void to_float(const bf16* x, int64_t n, float* y, cudaStream_t s);
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t s);
// out[r, :F] = silu(gu[r, :F]) * gu[r, F:2F], gu bf16 [rows, 2F] (a grouped GEMM's output).
void silu_mul(const bf16* gate_up, int64_t rows, int64_t f, bf16* out, cudaStream_t s);
// out[r] = argmax of logits[r, :vocab] (ties to the lower id, as the CPU sampler).
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t s);

// ---- paged attention (attention.cu) ----

// One layer's pools, the layout of kernels/cpu/attention.h:
// [num_blocks][kv_heads][block_size][head_dim], bf16.
struct PagedKvLayer {
  bf16* k = nullptr;
  bf16* v = nullptr;
  int64_t block_size = 16, kv_heads = 0, head_dim = 0;
};
// Block tables of a batch: token t's request table is tables[t * max_blocks ...].
void write_kv(const PagedKvLayer& kv, const float* k, const float* v, int64_t tokens,
              const int32_t* positions, const int32_t* tables, int64_t max_blocks, cudaStream_t s);
// Scratch floats paged_attention needs for a batch whose longest context is max_context.
int64_t attention_workspace_floats(int64_t tokens, int64_t heads, int64_t head_dim,
                                   int64_t max_context);
// out[t, h] = softmax(scale q[t, h] . K[0..p_t]) V[0..p_t] (GQA): prefill and
// decode alike, split over the context in chunks (flash-decoding) and merged.
void paged_attention(const float* q, int64_t tokens, int64_t heads, const PagedKvLayer& kv,
                     const int32_t* positions, const int32_t* tables, int64_t max_blocks,
                     int64_t max_context, float scale, float* workspace, float* out,
                     cudaStream_t s);

// ---- MoE (moe.cu) ----

// Softmax over E router logits per token, top-K (ties to the lower id), weights
// renormalised over the K when `normalize`: topk_expert/topk_weight [T*K].
void gate_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
               bool normalize, int32_t* topk_expert, float* topk_weight, cudaStream_t s);
// send[r, :] = x[row_token[r], :] for r < rows.
void gather_rows(const float* x, const int32_t* row_token, int64_t rows, int64_t hidden,
                 float* send, cudaStream_t s);
// x[t] += sum_k topk_weight[t*K+k] * results[slot_row[t*K+k]].
void moe_combine(const float* results, const int32_t* slot_row, const float* topk_weight,
                 int64_t tokens, int64_t top_k, int64_t hidden, float* x, cudaStream_t s);

// ---- GEMMs (blas.cc): cuBLASLt and cuBLAS's grouped GEMM ----

// A bf16 weight matrix [n, k] in device memory.
struct DeviceMatrix {
  const bf16* w = nullptr;
  int64_t n = 0, k = 0;
};

// One expert's SwiGLU weights: w13 [2F, h] (gate rows then up rows), w2 [h, F].
struct ExpertMatrices {
  DeviceMatrix w13, w2;
};

class Blas {
 public:
  static StatusOr<std::unique_ptr<Blas>> create(cudaStream_t s);
  ~Blas();
  cudaStream_t stream() const { return stream_; }
  // y[m, n] = x[m, k] W^T (x rounded to bf16; fp32 accumulate and output).
  Status linear(const float* x, int64_t m, const DeviceMatrix& w, float* y);
  // The same with a bf16 input already on the device.
  Status linear_bf16(const bf16* x, int64_t m, const DeviceMatrix& w, float* y);
  // SwiGLU FFN of several experts at once: rows[offset[i] .. offset[i+1]) of x
  // go through experts[i]; y [offset.back(), h]. Each projection is one grouped
  // GEMM over the experts with rows (bf16 in and out, fp32 accumulate).
  Status expert_ffn(const std::vector<ExpertMatrices>& experts,
                    const std::vector<int64_t>& offset, const float* x, float* y);
  // Scratch in use (bytes), for the memory report.
  size_t scratch_bytes() const;
  // False once cuBLAS refused the grouped GEMM and expert_ffn fell back to one
  // GEMM per expert.
  bool grouped() const;

 private:
  explicit Blas(cudaStream_t s);
  struct Impl;
  cudaStream_t stream_;
  std::unique_ptr<Impl> impl_;
};

// ---- measurement (bench kernels --device cuda) ----

// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
StatusOr<double> measure_copy_bandwidth(size_t bytes, int reps);

}  // namespace msinfer::kernels::cuda
