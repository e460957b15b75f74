// libfabric is opened on the first call of its API (fabric_lazy.cc), not when
// a binary starts.
#pragma once

#include <string>

namespace msinfer::comm {

// Why libfabric could not be loaded ("" when it was, or was not tried yet).
std::string fabric_load_error();

}  // namespace msinfer::comm
