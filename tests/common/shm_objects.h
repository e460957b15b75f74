// The /dev/shm objects of one process (libfabric shm endpoints, direct-transport
// mailboxes and regions), which msinfer names msinfer-<pid>-<random>
// (comm/fabric_transport.h).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace msinfer::testing {

inline std::vector<std::string> shm_objects_of(pid_t pid) {
  std::vector<std::string> out;
  const std::string mine = "msinfer-" + std::to_string(pid) + "-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(mine, 0) == 0) out.push_back(name);
  }
  return out;
}

}  // namespace msinfer::testing
