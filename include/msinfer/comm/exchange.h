// A full M2N + N2M exchange between M "attention" ranks and N "expert" ranks
// over one bootstrap: the traffic of the disaggregated runtime without the
// compute. Used by the multi-process tests (every byte verified) and by
// `msinfer bench m2n`. Ranks 0..M-1 send (dispatch) and receive (combine);
// ranks M..M+N-1 the reverse.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/fabric_transport.h"
#include "msinfer/comm/inproc_transport.h"
#include "msinfer/comm/m2n.h"

namespace msinfer::comm {

struct ExchangeOptions {
  int senders = 2, receivers = 2;
  int64_t bytes = 65536;      // per (sender, receiver) message when uniform
  int64_t row_bytes = 256;    // bytes is rounded to whole rows
  int iterations = 20;
  int warmup = 3;
  int slots = 2;
  double zipf = 0;            // > 0: receiver j gets rows proportional to 1/(j+1)^zipf
  bool empty_to_last = false; // every sender sends 0 rows to the last receiver
  bool checksum = false;
  bool verify = true;         // fill and check every byte
  TransportKind transport = TransportKind::kFabricShm;  // unless `inproc` is set
  InprocFabric* inproc = nullptr;  // ranks as threads of one process (unit tests)
  int timeout_ms = 5000;
  bool barrier_each_iteration = false;  // benchmarks: every round starts together, and ends
                                        // together before the byte checks
  int die_at_iteration = -1;  // test hook: this rank's process exits there
  int die_rank = -1;
};

struct ExchangeStats {
  std::vector<double> one_way_us;  // per timed iteration (round trip / 2), senders only
  int64_t bytes_per_sender = 0;    // per iteration, one direction
};

// Rows sender s sends to receiver r (the same on both sides).
int64_t exchange_rows(const ExchangeOptions& o, int s, int r);

// This rank's side of the exchange, one round at a time (`msinfer bench m2n`
// interleaves its rounds with the MPI baselines'). Errors name the peer that
// failed or is missing; after one, the endpoint is abandoned, not closed, so
// that a dead peer cannot block the destructor.
class Exchange {
 public:
  // Endpoint, buffers and peers; collective (every rank of `boot` calls it).
  static StatusOr<std::unique_ptr<Exchange>> open(Bootstrap& boot, const ExchangeOptions& o);
  ~Exchange();
  // Round `it` (counting warm-up rounds): dispatch, then combine, every byte
  // checked when o.verify. Senders get the one-way time (round trip / 2) in
  // microseconds, receivers 0.
  Status round(int it, double* one_way_us);
  // Waits for this rank's writes to complete, then meets every rank.
  Status close();
  int64_t bytes_per_sender() const;  // per round, one direction

 private:
  struct State;
  explicit Exchange(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// open, warm-up + timed rounds, close.
Status run_exchange(Bootstrap& boot, const ExchangeOptions& o, ExchangeStats* stats);

}  // namespace msinfer::comm
