#include <cuda_runtime_api.h>

#include <charconv>

#include "msinfer/kernels/cuda/cuda.h"

namespace msinfer::kernels::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    cudaGetLastError();  // not sticky: clear it
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

StatusOr<DeviceInfo> open_device(int index) {
  std::string why;
  const int n = device_count(&why);
  if (n == 0) return unavailable("CUDA: " + why);
  if (index < 0 || index >= n) {
    return invalid_argument("CUDA device " + std::to_string(index) + " does not exist (" +
                            std::to_string(n) + " present)");
  }
  cudaError_t e = cudaSetDevice(index);
  if (e != cudaSuccess) return unavailable(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  cudaDeviceProp p{};
  e = cudaGetDeviceProperties(&p, index);
  if (e != cudaSuccess) {
    return unavailable(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e));
  }
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.multiprocessors = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.memory_bytes = p.totalGlobalMem;
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, index) == cudaSuccess) {
    d.memory_clock_khz = v;
  }
  if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess) {
    d.memory_bus_bits = v;
  }
  cudaGetLastError();
  return d;
}

StatusOr<int> parse_device(const std::string& name) {
  if (name == "cuda") return 0;
  if (name.rfind("cuda:", 0) == 0 && name.size() > 5) {
    int i = -1;
    const char* b = name.data() + 5;
    const char* end = name.data() + name.size();
    auto [p, ec] = std::from_chars(b, end, i);
    if (ec == std::errc() && p == end && i >= 0) return i;
  }
  return invalid_argument("device '" + name + "': expected cpu, cuda or cuda:N");
}

Status check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Status DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_ && p_) return ok_status();
  if (p_) {
    cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  const cudaError_t e = cudaMalloc(&p_, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p_ = nullptr;
    return resource_exhausted("cudaMalloc of " + std::to_string(bytes) + " bytes: " +
                              cudaGetErrorString(e));
  }
  bytes_ = bytes;
  return ok_status();
}

Status DeviceBuffer::upload(const void* host, size_t bytes, cudaStream_t s) {
  MSI_RETURN_IF_ERROR(reserve(bytes));
  if (bytes == 0) return ok_status();
  const cudaError_t e = s ? cudaMemcpyAsync(p_, host, bytes, cudaMemcpyHostToDevice, s)
                          : cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return internal_error(std::string("upload: ") + cudaGetErrorString(e));
  return ok_status();
}

}  // namespace msinfer::kernels::cuda
