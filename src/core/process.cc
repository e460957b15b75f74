#include "msinfer/core/process.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

StatusOr<ProcessStats> read_process_stats() {
  ProcessStats p;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  std::string stat;
  {
    std::ifstream in("/proc/self/stat");
    std::getline(in, stat);
  }
  // The fields after the command name, which is in parentheses and may hold
  // anything: split at the last ')'. parts[0] is field 3 (state) of proc(5).
  const size_t close = stat.rfind(')');
  if (ticks <= 0 || page <= 0 || close == std::string::npos) {
    return unavailable("/proc/self/stat: cannot be read");
  }
  std::istringstream fields(stat.substr(close + 1));
  std::vector<std::string> parts;
  for (std::string f; fields >> f;) parts.push_back(f);
  if (parts.size() < 22)
    return unavailable("/proc/self/stat: " + std::to_string(parts.size()) +
                       " fields after the name, expected at least 22");
  auto num = [&](size_t i) { return std::strtod(parts[i].c_str(), nullptr); };
  p.cpu_seconds = (num(11) + num(12)) / ticks;  // utime + stime
  p.virtual_bytes = static_cast<int64_t>(num(20));
  p.resident_bytes = static_cast<int64_t>(num(21)) * page;
  double btime = 0;
  {
    std::ifstream in("/proc/stat");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("btime ", 0) == 0) btime = std::strtod(line.c_str() + 6, nullptr);
    }
  }
  if (btime <= 0) return unavailable("/proc/stat: no btime");
  p.start_time_seconds = btime + num(19) / ticks;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++p.open_fds;
    }
    ::closedir(d);
  }
  {
    std::ifstream in("/proc/self/limits");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Max open files", 0) != 0) continue;
      std::istringstream ss(line.substr(14));
      std::string soft;
      ss >> soft;
      p.max_fds = soft == "unlimited" ? -1 : std::atoll(soft.c_str());
    }
  }
  return p;
}

}  // namespace msinfer
