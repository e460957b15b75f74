// Helper for direct_transport_test: opens a direct transport (its mailbox, a
// region and their lock in /dev/shm), prints its address, then follows
// commands on stdin: "exit" closes it cleanly, "die" exits at once and leaves
// its objects behind, as a crash would.
#include <unistd.h>

#include <iostream>
#include <string>

#include "msinfer/comm/fabric_transport.h"

int main() {
  msinfer::comm::FabricOptions o;
  o.transport = msinfer::comm::TransportKind::kDirect;
  auto t = msinfer::comm::make_transport(o);
  if (!t.ok()) {
    std::cerr << t.status().to_string() << "\n";
    return 1;
  }
  auto mem = (*t)->allocate(4096);
  if (!mem.ok()) return 1;
  std::cout << (*t)->address() << std::endl;
  std::string cmd;
  while (std::getline(std::cin, cmd)) {
    if (cmd == "die") ::_exit(0);
    if (cmd == "exit") break;
  }
  return 0;
}
