// GPU test: skips without a CUDA device.
#include "msinfer/comm/cuda_stream_gate.h"

#include <gtest/gtest.h>

#ifdef MSINFER_CUDA
#include "msinfer/comm/cuda_driver.h"

#include <chrono>
#include <thread>
#endif

namespace msinfer::comm {
namespace {

TEST(StreamGateTest, WorkAfterTheGateWaitsForOpen) {
#ifndef MSINFER_CUDA
  GTEST_SKIP() << "built without MSINFER_CUDA";
#else
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const CudaDriver& cu = *cuda_driver();
  auto gate = StreamGate::create();
  ASSERT_TRUE(gate.ok()) << gate.status().to_string();
  CUstream stream;
  ASSERT_EQ(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr buf;
  ASSERT_EQ(cu.cuMemAlloc(&buf, 4), CUDA_SUCCESS);
  ASSERT_EQ(cu.cuMemsetD32(buf, 0, 1), CUDA_SUCCESS);
  for (uint32_t round = 1; round <= 3; ++round) {
    ASSERT_TRUE(gate->block(stream, round).ok());
    ASSERT_EQ(cu.cuMemsetD32Async(buf, round, 1, stream), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(cu.cuStreamQuery(stream), CUDA_ERROR_NOT_READY) << "the stream ran past a closed gate";
    gate->open(round);
    ASSERT_EQ(cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
    uint32_t v = 0;
    ASSERT_EQ(cu.cuMemcpyDtoH(&v, buf, 4), CUDA_SUCCESS);
    EXPECT_EQ(v, round);
  }
  cu.cuMemFree(buf);
  cu.cuStreamDestroy(stream);
#endif
}

}  // namespace
}  // namespace msinfer::comm
