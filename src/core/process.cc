#include "msinfer/core/process.h"

#include <sys/resource.h>

#include <fstream>
#include <sstream>
#include <string>

namespace msinfer {

ProcessMemory read_process_memory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string key;
    int64_t kb = 0;
    ss >> key >> kb;
    if (key == "VmRSS:") m.rss_bytes = kb * 1024;
    if (key == "VmHWM:") m.peak_rss_bytes = kb * 1024;
  }
  return m;
}

double process_cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace msinfer
