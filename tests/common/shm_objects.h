// The /dev/shm objects of one process (libfabric shm endpoints, direct-transport
// mailboxes and regions), which msinfer names msinfer-<pid>-<random>
// (comm/fabric_transport.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
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

// Whether the dead process `pid`'s objects are gone within `limit`, after
// something that removes them (a new endpoint). Every new endpoint on the
// machine runs the same cleaner, so under ctest -j2 another test's cleaner
// may hold the dead owner's lock while it removes the objects (the lock
// last); ours then sees the lock held and leaves them to it. Only a cleaner
// removes them, so waiting a moment tells a slow removal from none.
inline bool shm_objects_removed(pid_t pid,
                                std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!shm_objects_of(pid).empty()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace msinfer::testing
