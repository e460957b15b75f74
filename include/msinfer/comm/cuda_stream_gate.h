// Stream-compatible M2N on GPUs (the paper's sender/receiver), behind MSINFER_CUDA.
//
// A StreamGate is a 32-bit flag in pinned host memory mapped into the device.
// block(stream, v) enqueues cuStreamWaitValue32(flag >= v): work queued after it
// on that stream waits; open(v) stores v from the CPU and releases it.
//  - Sender: the CPU waits for the producing kernel's event, blocks the stream
//    (the NIC is reading the registered device buffer), posts the writes, and
//    opens the gate when their local completions arrived, so the next kernel
//    cannot overwrite the buffer mid-transfer.
//  - Receiver: the consumer stream is blocked before its kernels are queued;
//    the CPU opens the gate when M2NReceiver::wait() saw every immediate.
// Sequence values only grow, so one gate serves every round (wait >= seq).
#pragma once

#include <cstdint>

#include "msinfer/core/status.h"

namespace msinfer::comm {

// True when the CUDA driver finds a device (false without one, or without the driver).
bool cuda_device_available();

#ifdef MSINFER_CUDA
class StreamGate {
 public:
  static StatusOr<StreamGate> create();
  StreamGate(StreamGate&&) noexcept;
  StreamGate& operator=(StreamGate&&) = delete;
  ~StreamGate();
  // Work queued on `stream` after this waits until the flag reaches `value`.
  Status block(void* stream, uint32_t value);
  // Releases every block(value' <= value).
  void open(uint32_t value);
  uint32_t value() const;

 private:
  StreamGate() = default;
  volatile uint32_t* host_ = nullptr;
  uint64_t device_ = 0;
};
#endif

}  // namespace msinfer::comm
