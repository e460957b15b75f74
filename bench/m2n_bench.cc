#include "msinfer/bench/m2n_bench.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/core/stats.h"
#include "msinfer/comm/exchange.h"
#include "msinfer/comm/fabric_transport.h"

#ifdef MSINFER_HAVE_MPI
#include <mpi.h>
#endif

namespace msinfer::bench {
namespace {


#ifdef MSINFER_HAVE_MPI
uint8_t pat(int from, int to, int it, int64_t i) {
  return static_cast<uint8_t>((from * 31 + to * 17 + it * 7 + i * 13) & 0xff);
}

// The same traffic as the M2N exchange with MPI, a round (dispatch then
// combine) at a time: Isend/Irecv per peer, or one MPI_Alltoallv per phase.
class MpiRounds {
 public:
  MpiRounds(const comm::ExchangeOptions& o, bool alltoallv) : o_(o), alltoallv_(alltoallv) {
    MPI_Comm_rank(MPI_COMM_WORLD, &me_);
    MPI_Comm_size(MPI_COMM_WORLD, &n_);
    attention_ = me_ < o.senders;
    sendbufs_.resize(n_);
    recvbufs_.resize(n_);
    for (int p = 0; p < n_; ++p) {
      sendbufs_[p].resize(static_cast<size_t>(std::max<int64_t>(bytes_to(me_, p), 1)));
      recvbufs_[p].resize(static_cast<size_t>(std::max<int64_t>(bytes_to(p, me_), 1)));
    }
    scount_.resize(n_);
    sdispl_.resize(n_);
    rcount_.resize(n_);
    rdispl_.resize(n_);
  }

  Status round(int it, double* one_way_us) {
    *one_way_us = 0;
    for (int p = 0; p < n_; ++p) {
      const int64_t b = bytes_to(me_, p);
      for (int64_t i = 0; i < b; ++i) sendbufs_[p][i] = pat(me_, p, it, i);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    for (int phase = 0; phase < 2; ++phase) {
      // phase 0: attention -> experts; phase 1: experts -> attention.
      const bool sending = (phase == 0) == attention_;
      if (alltoallv_) {
        alltoallv(sending);
      } else {
        p2p(sending, it);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (attention_) *one_way_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / 2;
    MPI_Barrier(MPI_COMM_WORLD);  // as the exchange: the checks start when every rank is done
    for (int p = 0; o_.verify && p < n_; ++p) {
      const int64_t b = bytes_to(p, me_);
      for (int64_t i = 0; i < b; ++i) {
        if (recvbufs_[p][i] != pat(p, me_, it, i)) {
          return internal_error("MPI baseline: byte " + std::to_string(i) + " from rank " +
                                std::to_string(p) + " is wrong");
        }
      }
    }
    return ok_status();
  }

 private:
  // Rows follow exchange_rows for (attention sender, expert receiver) in both directions.
  int64_t bytes_to(int from, int to) const {
    const int M = o_.senders;
    if ((from < M) == (to < M)) return 0;
    const int s = from < M ? from : to, r = from < M ? to - M : from - M;
    return comm::exchange_rows(o_, s, r) * o_.row_bytes;
  }

  void alltoallv(bool sending) {
    int so = 0, ro = 0;
    for (int p = 0; p < n_; ++p) {
      scount_[p] = sending ? static_cast<int>(bytes_to(me_, p)) : 0;
      rcount_[p] = !sending ? static_cast<int>(bytes_to(p, me_)) : 0;
      sdispl_[p] = so;
      rdispl_[p] = ro;
      so += scount_[p];
      ro += rcount_[p];
    }
    sflat_.resize(std::max(so, 1));
    rflat_.resize(std::max(ro, 1));
    for (int p = 0; p < n_; ++p) {
      if (scount_[p]) std::memcpy(sflat_.data() + sdispl_[p], sendbufs_[p].data(), scount_[p]);
    }
    MPI_Alltoallv(sflat_.data(), scount_.data(), sdispl_.data(), MPI_BYTE, rflat_.data(),
                  rcount_.data(), rdispl_.data(), MPI_BYTE, MPI_COMM_WORLD);
    for (int p = 0; p < n_; ++p) {
      if (rcount_[p]) std::memcpy(recvbufs_[p].data(), rflat_.data() + rdispl_[p], rcount_[p]);
    }
  }

  void p2p(bool sending, int it) {
    reqs_.clear();
    for (int p = 0; p < n_; ++p) {
      if ((p < o_.senders) == attention_) continue;  // same side: no traffic
      reqs_.emplace_back();
      if (sending) {
        MPI_Isend(sendbufs_[p].data(), static_cast<int>(bytes_to(me_, p)), MPI_BYTE, p, it,
                  MPI_COMM_WORLD, &reqs_.back());
      } else {
        MPI_Irecv(recvbufs_[p].data(), static_cast<int>(bytes_to(p, me_)), MPI_BYTE, p, it,
                  MPI_COMM_WORLD, &reqs_.back());
      }
    }
    MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
  }

  comm::ExchangeOptions o_;
  bool alltoallv_ = false, attention_ = false;
  int me_ = 0, n_ = 0;
  std::vector<std::vector<uint8_t>> sendbufs_, recvbufs_;
  std::vector<int> scount_, sdispl_, rcount_, rdispl_;
  std::vector<uint8_t> sflat_, rflat_;
  std::vector<MPI_Request> reqs_;
};

// Rank 0 gets every sender's latencies.
std::vector<double> gather_at_root(const std::vector<double>& lat, int world) {
  int count = static_cast<int>(lat.size());
  std::vector<int> counts(world);
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> displs(world);
  int total = 0;
  for (int r = 0; r < world; ++r) {
    displs[r] = total;
    total += counts[r];
  }
  std::vector<double> all(std::max(total, 1));
  MPI_Gatherv(lat.data(), count, MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE,
              0, MPI_COMM_WORLD);
  all.resize(total);
  return all;
}
#endif

}  // namespace

std::string mpi_btl_for(comm::TransportKind transport) {
  return comm::transport_within_host(transport) ? "vader" : "tcp";
}

Json m2n_rows_to_json(const std::vector<M2NBenchRow>& rows) {
  Json out = Json::array();
  for (const auto& r : rows) {
    out.push_back({{"name", r.name},
                   {"provider", r.provider},
                   {"size", r.size},
                   {"row_bytes", r.row_bytes},
                   {"senders", r.senders},
                   {"receivers", r.receivers},
                   {"p50_us", r.p50_us},
                   {"p99_us", r.p99_us},
                   {"gbps", r.gbps}});
  }
  return out;
}

StatusOr<std::vector<M2NBenchRow>> run_m2n_bench(const M2NBenchOptions& o) {
#ifndef MSINFER_HAVE_MPI
  return unimplemented("bench m2n needs Open MPI (libopenmpi-dev) at build time");
#else
  // libfabric's shm reads FI_SHM_DISABLE_CMA once per process: choose for the
  // largest size of this run (FabricOptions::max_message_bytes explains why).
  if (o.transport == comm::TransportKind::kFabricShm &&
      std::getenv("FI_SHM_DISABLE_CMA") == nullptr) {
    const int64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
    ::setenv("FI_SHM_DISABLE_CMA", largest >= (1 << 20) ? "0" : "1", 1);
  }
  MSI_ASSIGN_OR_RETURN(auto boot, comm::make_mpi_bootstrap());
  if (boot->size() != o.senders + o.receivers) {
    return invalid_argument("bench m2n: launched with " + std::to_string(boot->size()) +
                            " ranks for " + std::to_string(o.senders) + " senders + " +
                            std::to_string(o.receivers) + " receivers");
  }
  const bool attention = boot->rank() < o.senders;
  std::vector<M2NBenchRow> rows;
  for (int64_t size : o.sizes) {
    comm::ExchangeOptions e;
    e.senders = o.senders;
    e.receivers = o.receivers;
    // Rows of 2048 bytes (a 512-float activation) where the size allows;
    // else the largest row under that which makes up the size exactly (the
    // bytes labelled are the bytes sent).
    e.row_bytes = std::min<int64_t>(size, 2048);
    while (size % e.row_bytes != 0) --e.row_bytes;
    if (size / e.row_bytes > 65535) {
      return invalid_argument("bench m2n: --size " + std::to_string(size) +
                              " is not a whole number of at most 65535 rows of up to 2048 bytes; "
                              "take a multiple of 2048");
    }
    e.bytes = size;
    e.iterations = o.iterations;
    e.warmup = std::max(3, o.iterations / 10);
    e.transport = o.transport;
    e.zipf = o.zipf;
    e.verify = o.verify;
    e.timeout_ms = 30000;
    e.barrier_each_iteration = true;  // as the MPI baselines: rounds start and end together
    // The variants take turns round by round (the first one rotating), so a
    // burst of noise on this shared host hits them alike.
    std::vector<std::string> names = {"msinfer"};
    MSI_ASSIGN_OR_RETURN(std::unique_ptr<comm::Exchange> ex, comm::Exchange::open(*boot, e));
    std::vector<std::unique_ptr<MpiRounds>> mpi;
    if (o.baseline_mpi) {
      names.push_back("mpi-p2p");
      mpi.push_back(std::make_unique<MpiRounds>(e, false));
      names.push_back("mpi-alltoallv");
      mpi.push_back(std::make_unique<MpiRounds>(e, true));
    }
    const int nv = static_cast<int>(names.size());
    std::vector<std::vector<double>> lat(nv);
    for (int it = 0; it < e.warmup + e.iterations; ++it) {
      for (int k = 0; k < nv; ++k) {
        const int v = (it + k) % nv;
        double us = 0;
        if (v == 0) {
          MSI_RETURN_IF_ERROR(ex->round(it, &us));
        } else {
          MSI_RETURN_IF_ERROR(mpi[v - 1]->round(it, &us));
        }
        if (attention && it >= e.warmup) lat[v].push_back(us);
      }
    }
    MSI_RETURN_IF_ERROR(ex->close());
    for (int v = 0; v < nv; ++v) {
      std::vector<double> all = gather_at_root(lat[v], boot->size());
      if (boot->rank() == 0) {
        M2NBenchRow row;
        row.name = names[v];
        row.provider =
            v == 0 ? comm::transport_name(o.transport) : mpi_btl_for(o.transport);  // MPI: its btl
        row.size = size;
        row.row_bytes = e.row_bytes;
        row.senders = o.senders;
        row.receivers = o.receivers;
        row.p50_us = percentile(all, 0.5);
        row.p99_us = percentile(all, 0.99);
        row.gbps = row.p50_us > 0 ? ex->bytes_per_sender() / (row.p50_us * 1e-6) / 1e9 : 0;
        // Progress on stderr (rank 0; mpirun forwards it): a run takes minutes.
        std::fprintf(stderr, "  %s %lld bytes: p50 %.1f us, p99 %.1f us\n", row.name.c_str(),
                     static_cast<long long>(size), row.p50_us, row.p99_us);
        rows.push_back(row);
      }
    }
  }
  return rows;
#endif
}

StatusOr<Json> add_transfer_model(Json profile, const std::vector<M2NBenchRow>& rows) {
  if (!profile.is_object()) return invalid_argument("profile: expected a JSON object");
  double peak = 0;
  for (const auto& r : rows) {
    if (r.name == "msinfer") peak = std::max(peak, r.gbps);
  }
  if (!(peak > 0)) return invalid_argument("no msinfer rows to fit a transfer model to");
  Json curve = Json::array();
  for (const auto& r : rows) {
    // Keyed by the bytes one sender sends in a round, as the planner asks.
    if (r.name == "msinfer") {
      curve.push_back({static_cast<double>(r.size) * r.receivers, r.gbps / peak});
    }
  }
  profile["nic_gb_s"] = peak;
  profile["nic_util_curve"] = curve;
  profile["nic_source"] = "msinfer bench m2n, " + rows.front().provider + ", " +
                          std::to_string(rows.front().senders) + "x" +
                          std::to_string(rows.front().receivers);
  return profile;
}

}  // namespace msinfer::bench
