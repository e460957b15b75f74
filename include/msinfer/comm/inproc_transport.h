// In-process transport: endpoints of one InprocFabric copy straight into each
// other's registered memory. For unit tests of everything above the transport
// (the LevelDB in-memory Env idea). Thread-safe across endpoints: each endpoint
// may be driven by its own thread.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "msinfer/comm/transport.h"

namespace msinfer::comm {

class InprocFabric {
 public:
  std::unique_ptr<Transport> endpoint();

 private:
  friend class InprocTransport;
  struct Region {
    uint8_t* base;
    size_t len;
  };
  struct Endpoint {
    std::deque<Completion> completions;
    std::map<uint64_t, Region> regions;  // by key
    bool closed = false;
  };
  std::mutex mu_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  uint64_t next_key_ = 1;
};

}  // namespace msinfer::comm
