#include "msinfer/comm/cuda_stream_gate.h"

#ifdef MSINFER_CUDA
#include <dlfcn.h>

#include <atomic>

#include "msinfer/comm/cuda_driver.h"
#endif

namespace msinfer::comm {

#ifndef MSINFER_CUDA
bool cuda_device_available() { return false; }
#else
const CudaDriver* cuda_driver() {
  static const CudaDriver* d = []() -> const CudaDriver* {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return nullptr;
    auto* t = new CudaDriver();
    bool ok = true;
    auto load = [&](auto& fn, const char* name) {
      void* p = ::dlsym(h, name);
      ok = ok && p != nullptr;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    load(t->cuInit, "cuInit");
    load(t->cuDeviceGetCount, "cuDeviceGetCount");
    load(t->cuDeviceGet, "cuDeviceGet");
    load(t->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    load(t->cuCtxSetCurrent, "cuCtxSetCurrent");
    load(t->cuCtxGetCurrent, "cuCtxGetCurrent");
    load(t->cuMemHostAlloc, "cuMemHostAlloc");
    load(t->cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    load(t->cuMemFreeHost, "cuMemFreeHost");
    load(t->cuStreamWaitValue32, "cuStreamWaitValue32_v2");
    load(t->cuGetErrorString, "cuGetErrorString");
    load(t->cuStreamCreate, "cuStreamCreate");
    load(t->cuStreamDestroy, "cuStreamDestroy_v2");
    load(t->cuStreamQuery, "cuStreamQuery");
    load(t->cuStreamSynchronize, "cuStreamSynchronize");
    load(t->cuMemAlloc, "cuMemAlloc_v2");
    load(t->cuMemFree, "cuMemFree_v2");
    load(t->cuMemsetD32, "cuMemsetD32_v2");
    load(t->cuMemsetD32Async, "cuMemsetD32Async");
    load(t->cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    if (!ok) {
      delete t;
      return nullptr;
    }
    return t;
  }();
  return d;
}

namespace {
std::string cu_error(CUresult r, const char* what) {
  const char* s = nullptr;
  cuda_driver()->cuGetErrorString(r, &s);
  return std::string(what) + ": " + (s ? s : "unknown CUDA error");
}
}  // namespace

bool cuda_device_available() {
  const CudaDriver* d = cuda_driver();
  if (d == nullptr || d->cuInit(0) != CUDA_SUCCESS) return false;
  int n = 0;
  return d->cuDeviceGetCount(&n) == CUDA_SUCCESS && n > 0;
}

StatusOr<StreamGate> StreamGate::create() {
  if (!cuda_device_available()) return Status(StatusCode::kUnavailable, "no CUDA device");
  CUcontext ctx = nullptr;
  cuda_driver()->cuCtxGetCurrent(&ctx);
  if (ctx == nullptr) {
    CUdevice dev;
    CUresult r = cuda_driver()->cuDeviceGet(&dev, 0);
    if (r != CUDA_SUCCESS) return internal_error(cu_error(r, "cuDeviceGet"));
    r = cuda_driver()->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r != CUDA_SUCCESS) return internal_error(cu_error(r, "cuDevicePrimaryCtxRetain"));
    cuda_driver()->cuCtxSetCurrent(ctx);
  }
  void* host = nullptr;
  CUresult r = cuda_driver()->cuMemHostAlloc(&host, sizeof(uint32_t), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
  if (r != CUDA_SUCCESS) return internal_error(cu_error(r, "cuMemHostAlloc"));
  StreamGate g;
  g.host_ = static_cast<volatile uint32_t*>(host);
  *g.host_ = 0;
  CUdeviceptr d = 0;
  r = cuda_driver()->cuMemHostGetDevicePointer(&d, host, 0);
  if (r != CUDA_SUCCESS) return internal_error(cu_error(r, "cuMemHostGetDevicePointer"));
  g.device_ = d;
  return g;
}

StreamGate::StreamGate(StreamGate&& o) noexcept : host_(o.host_), device_(o.device_) {
  o.host_ = nullptr;
}

StreamGate::~StreamGate() {
  if (host_ != nullptr) cuda_driver()->cuMemFreeHost(const_cast<uint32_t*>(host_));
}

Status StreamGate::block(void* stream, uint32_t value) {
  CUresult r = cuda_driver()->cuStreamWaitValue32(static_cast<CUstream>(stream), device_, value,
                                   CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) return internal_error(cu_error(r, "cuStreamWaitValue32"));
  return ok_status();
}

void StreamGate::open(uint32_t value) {
  std::atomic_thread_fence(std::memory_order_release);
  *host_ = value;
}

uint32_t StreamGate::value() const { return *host_; }
#endif

}  // namespace msinfer::comm
