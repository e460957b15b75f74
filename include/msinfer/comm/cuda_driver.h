// The few CUDA driver functions the GPU path uses, loaded at run time with
// dlopen("libcuda.so.1"), so binaries built with MSINFER_CUDA start (and their
// GPU tests skip) on machines without an NVIDIA driver. Types from <cuda.h>.
#pragma once

#ifdef MSINFER_CUDA
#include <cuda.h>

namespace msinfer::comm {

struct CudaDriver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned int);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned int);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
};

// nullptr when libcuda.so.1 (the driver) is not installed or lacks a symbol.
const CudaDriver* cuda_driver();

}  // namespace msinfer::comm
#endif
