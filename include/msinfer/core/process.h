// This process's memory as the kernel reports it (/proc/self/status).
#pragma once

#include <cstdint>

namespace msinfer {

struct ProcessMemory {
  int64_t rss_bytes = 0;       // VmRSS: resident now
  int64_t peak_rss_bytes = 0;  // VmHWM: highest resident so far
};

// Zeros when /proc is unavailable.
ProcessMemory read_process_memory();

}  // namespace msinfer
