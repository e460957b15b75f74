// One-time exchange of addresses and region keys between the ranks of a
// deployment; never carries data. Two implementations:
// - TcpBootstrap: ranks connect to a BootstrapServer (run by the launcher on one
//   host, or by rank 0's host) at host:port; the single-host default.
// - MpiBootstrap: MPI_Allgather, when the processes were started by mpirun or
//   srun (PMIx). Only the exchange goes through MPI.
// make_bootstrap_from_env() picks: MSINFER_BOOTSTRAP=host:port with
// MSINFER_RANK / MSINFER_WORLD_SIZE / MSINFER_JOB_SECRET -> TCP; else an MPI
// launch -> MPI.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer::comm {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's blob, by rank. Blocks until all ranks called it (or times out).
  virtual StatusOr<std::vector<std::string>> allgather(const std::string& blob) = 0;
  Status barrier();
};

// 32 hex digits from the kernel's random source (getrandom): a job's secret.
std::string new_job_secret();
// Whether `presented` is `secret`, compared in time that does not depend on
// where they differ.
bool is_job_secret(const std::string& presented, const std::string& secret);

// Serves allgather rounds for `world` ranks on 127.0.0.1 (or `host`: the
// interface the deployment uses, never all of them), port 0 = any free port.
// Runs on its own thread until destroyed. Every client must present the
// job's secret (`secret`, or a new one when empty: see secret()) in its
// first message; a connection that does not is dropped. Clients are read
// without blocking, all at once: a silent one delays nobody, and is dropped
// after 30 s. Out of fds at accept (EMFILE), the oldest client that has not
// sent its blob is closed to make room (bootstrap.cc); the server goes on.
class BootstrapServer {
 public:
  static StatusOr<std::unique_ptr<BootstrapServer>> start(int world,
                                                          const std::string& host = "127.0.0.1",
                                                          int port = 0,
                                                          const std::string& secret = "");
  ~BootstrapServer();
  std::string address() const;  // "host:port"
  // For the ranks (MSINFER_JOB_SECRET): the launcher passes it as NCCL passes
  // its unique id.
  const std::string& secret() const { return secret_; }

 private:
  BootstrapServer() = default;
  void serve();
  bool parse_hello(const std::string& hello, int* rank, int* round) const;
  int listen_fd_ = -1;
  int world_ = 0;
  std::string host_, secret_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};  // set by the destructor, read by the serving thread
};

// A rank of a TcpBootstrap: `secret` is the server's (BootstrapServer::secret).
StatusOr<std::unique_ptr<Bootstrap>> make_tcp_bootstrap(
    int rank, int world, const std::string& server, const std::string& secret,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

// True when this process was started by mpirun / srun with PMIx.
bool launched_by_mpi();

// How many processes of this job run on this host: the launcher's count
// (OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE) when there is one, else
// `world` (a local deployment or benchmark: every process is here).
int local_process_count(int world);

// More processes on this host than cores: a process with nothing to do should
// give its core away (sched_yield) rather than spin for its next message.
bool oversubscribed(int local_processes);

// The IPv4 address other hosts reach this one by: MSINFER_ADDRESS if set, else
// the first interface that is up and not loopback, else 127.0.0.1.
std::string local_address();
#ifdef MSINFER_HAVE_MPI
// Calls MPI_Init if needed; MPI_Finalize at exit.
StatusOr<std::unique_ptr<Bootstrap>> make_mpi_bootstrap();
#endif
StatusOr<std::unique_ptr<Bootstrap>> make_bootstrap_from_env();

}  // namespace msinfer::comm
