// Router::Joining: a replacement worker (expert, attention or prefill) on
// its way into a running deployment (router_join.cc). Private to runtime/.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "msinfer/runtime/router.h"
#include "worker_set.h"

namespace msinfer::runtime {

struct Router::Joining {
  internal::WorkerProcess w;
  int stage = 0;  // allgathers answered
  std::vector<std::pair<int, double>> shares;
  std::string card;  // its M2N card
  std::chrono::steady_clock::time_point since;
};

}  // namespace msinfer::runtime
