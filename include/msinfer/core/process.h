// This process's memory (/proc/self/status) and CPU time as the kernel reports them.
#pragma once

#include <cstdint>

namespace msinfer {

struct ProcessMemory {
  int64_t rss_bytes = 0;       // VmRSS: resident now
  int64_t peak_rss_bytes = 0;  // VmHWM: highest resident so far
};

// Zeros when /proc is unavailable.
ProcessMemory read_process_memory();

// User + system CPU seconds of every thread of this process so far.
double process_cpu_seconds();

}  // namespace msinfer
