// `msinfer bench m2n`: M2N then N2M rounds between M attention and N expert
// processes, per message size, with one-way latency (round trip / 2) p50/p99 and
// throughput per sender; every byte verified. The MPI baseline runs the same
// traffic in the same processes: Isend/Irecv per step, and MPI_Alltoallv.
// Runs under mpirun (it re-launches itself there when started directly).
#pragma once

#include <string>
#include <vector>

#include "msinfer/comm/fabric_transport.h"
#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::bench {

struct M2NBenchOptions {
  int senders = 4, receivers = 4;
  std::vector<int64_t> sizes = {262144};  // bytes per (sender, receiver) message
  int iterations = 50;
  comm::TransportKind transport = comm::TransportKind::kDirect;  // direct | socket | shm | tcp
  bool baseline_mpi = true;
  double zipf = 0;
  bool verify = true;
};

struct M2NBenchRow {
  std::string name;      // msinfer | mpi-p2p | mpi-alltoallv
  std::string provider;  // msinfer: the transport; MPI: the btl (vader | tcp)
  int64_t size = 0;      // bytes each sender sends to each receiver per round
  int64_t row_bytes = 0;  // in rows of this many bytes (size is a whole number of them)
  int senders = 0, receivers = 0;
  double p50_us = 0, p99_us = 0, gbps = 0;  // one-way; GB/s per sender
};

// The Open MPI btl that carries the same traffic as msinfer's transport:
// vader (shared memory) beside a transport within the host, tcp beside the
// others.
std::string mpi_btl_for(comm::TransportKind transport);

// Under MPI (every rank calls it); rank 0 gets the rows, others an empty list.
StatusOr<std::vector<M2NBenchRow>> run_m2n_bench(const M2NBenchOptions& o);
Json m2n_rows_to_json(const std::vector<M2NBenchRow>& rows);

// The planner's transfer model from msinfer's rows: nic_gb_s = the best
// one-way GB/s per sender over the sizes, nic_util_curve = each size's GB/s
// as a fraction of it, keyed by the bytes one sender sends per round (size x
// receivers), so bytes / (nic_gb_s * util(bytes)) reproduces the measured
// one-way p50 (latency included) at every measured size. Merged
// into `profile` (a `msinfer profile` document, or an empty object).
StatusOr<Json> add_transfer_model(Json profile, const std::vector<M2NBenchRow>& rows);

}  // namespace msinfer::bench
