// Run by ctest under mpirun: MPI bootstraps (address exchange only); the data
// goes over libfabric shm. Rank 0 prints "exchange ok: N ranks" on success.
#include <cstdio>

#include "msinfer/comm/exchange.h"

int main() {
  using namespace msinfer::comm;
  if (!launched_by_mpi()) {
    std::fprintf(stderr, "run me under mpirun\n");
    return 2;
  }
  auto boot = make_bootstrap_from_env();
  if (!boot.ok()) {
    std::fprintf(stderr, "%s\n", boot.status().to_string().c_str());
    return 1;
  }
  ExchangeOptions o;
  o.senders = (*boot)->size() / 2;
  o.receivers = (*boot)->size() - o.senders;
  o.bytes = 32 * 1024;
  o.iterations = 30;
  o.checksum = true;
  auto s = run_exchange(**boot, o, nullptr);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", (*boot)->rank(), s.to_string().c_str());
    return 1;
  }
  if ((*boot)->rank() == 0) std::printf("exchange ok: %d ranks\n", (*boot)->size());
  return 0;
}
