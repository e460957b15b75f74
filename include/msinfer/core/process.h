// This process's memory (/proc/self/status) and CPU time as the kernel reports them.
#pragma once

#include <cstdint>

#include "msinfer/core/status.h"

namespace msinfer {

struct ProcessMemory {
  int64_t rss_bytes = 0;       // VmRSS: resident now
  int64_t peak_rss_bytes = 0;  // VmHWM: highest resident so far
};

// Zeros when /proc is unavailable.
ProcessMemory read_process_memory();

// User + system CPU seconds of every thread of this process so far.
double process_cpu_seconds();

// The standard Prometheus process_* figures of this process, read from /proc
// as the Prometheus client libraries read them (prometheus_client's
// ProcessCollector): /proc/self/stat (utime + stime and starttime in clock
// ticks, vsize in bytes, rss in pages), /proc/stat's btime, the entries of
// /proc/self/fd, and the soft "Max open files" of /proc/self/limits.
struct ProcessStats {
  double cpu_seconds = 0;
  int64_t resident_bytes = 0, virtual_bytes = 0;
  int64_t open_fds = 0;
  int64_t max_fds = -1;           // -1: unlimited
  double start_time_seconds = 0;  // since the Unix epoch
};
// UNAVAILABLE naming the file when /proc cannot be read.
StatusOr<ProcessStats> read_process_stats();

}  // namespace msinfer
