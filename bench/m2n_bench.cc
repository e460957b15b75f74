#include "msinfer/bench/m2n_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/core/stats.h"
#include "msinfer/comm/exchange.h"

#ifdef MSINFER_HAVE_MPI
#include <mpi.h>
#endif

namespace msinfer::bench {
namespace {


#ifdef MSINFER_HAVE_MPI
uint8_t pat(int from, int to, int it, int64_t i) {
  return static_cast<uint8_t>((from * 31 + to * 17 + it * 7 + i * 13) & 0xff);
}

// The same traffic as the M2N exchange with MPI: dispatch then combine, per iteration.
Status mpi_rounds(const comm::ExchangeOptions& o, bool alltoallv, std::vector<double>* one_way) {
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int M = o.senders;
  const bool attention = me < M;
  auto bytes_to = [&](int from, int to) -> int64_t {
    // Rows follow exchange_rows for (attention sender, expert receiver) in both directions.
    const int s = from < M ? from : to, r = from < M ? to - M : from - M;
    if ((from < M) == (to < M)) return 0;
    return comm::exchange_rows(o, s, r) * o.row_bytes;
  };
  std::vector<std::vector<uint8_t>> sendbufs(n), recvbufs(n);
  for (int p = 0; p < n; ++p) {
    sendbufs[p].resize(static_cast<size_t>(std::max<int64_t>(bytes_to(me, p), 1)));
    recvbufs[p].resize(static_cast<size_t>(std::max<int64_t>(bytes_to(p, me), 1)));
  }
  std::vector<int> scount(n), sdispl(n), rcount(n), rdispl(n);
  std::vector<uint8_t> sflat, rflat;
  const int total = o.warmup + o.iterations;
  for (int it = 0; it < total; ++it) {
    for (int p = 0; p < n; ++p) {
      const int64_t b = bytes_to(me, p);
      for (int64_t i = 0; i < b; ++i) sendbufs[p][i] = pat(me, p, it, i);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    for (int phase = 0; phase < 2; ++phase) {
      // phase 0: attention -> experts; phase 1: experts -> attention.
      const bool sending = (phase == 0) == attention;
      if (alltoallv) {
        int so = 0, ro = 0;
        for (int p = 0; p < n; ++p) {
          scount[p] = sending ? static_cast<int>(bytes_to(me, p)) : 0;
          rcount[p] = !sending ? static_cast<int>(bytes_to(p, me)) : 0;
          sdispl[p] = so;
          rdispl[p] = ro;
          so += scount[p];
          ro += rcount[p];
        }
        sflat.resize(std::max(so, 1));
        rflat.resize(std::max(ro, 1));
        for (int p = 0; p < n; ++p) {
          if (scount[p]) std::memcpy(sflat.data() + sdispl[p], sendbufs[p].data(), scount[p]);
        }
        MPI_Alltoallv(sflat.data(), scount.data(), sdispl.data(), MPI_BYTE, rflat.data(),
                      rcount.data(), rdispl.data(), MPI_BYTE, MPI_COMM_WORLD);
        for (int p = 0; p < n; ++p) {
          if (rcount[p]) std::memcpy(recvbufs[p].data(), rflat.data() + rdispl[p], rcount[p]);
        }
      } else {
        std::vector<MPI_Request> reqs;
        for (int p = 0; p < n; ++p) {
          if (sending && bytes_to(me, p) >= 0 && (p < M) != attention) {
            reqs.emplace_back();
            MPI_Isend(sendbufs[p].data(), static_cast<int>(bytes_to(me, p)), MPI_BYTE, p, it,
                      MPI_COMM_WORLD, &reqs.back());
          }
          if (!sending && (p < M) != attention) {
            reqs.emplace_back();
            MPI_Irecv(recvbufs[p].data(), static_cast<int>(bytes_to(p, me)), MPI_BYTE, p, it,
                      MPI_COMM_WORLD, &reqs.back());
          }
        }
        MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (attention && it >= o.warmup) {
      one_way->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
    }
    for (int p = 0; o.verify && p < n; ++p) {
      const int64_t b = bytes_to(p, me);
      for (int64_t i = 0; i < b; ++i) {
        if (recvbufs[p][i] != pat(p, me, it, i)) {
          return internal_error("MPI baseline: byte " + std::to_string(i) + " from rank " +
                                std::to_string(p) + " is wrong");
        }
      }
    }
  }
  return ok_status();
}
#endif

}  // namespace

Json m2n_rows_to_json(const std::vector<M2NBenchRow>& rows) {
  Json out = Json::array();
  for (const auto& r : rows) {
    out.push_back({{"name", r.name},
                   {"provider", r.provider},
                   {"size", r.size},
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
  if (o.provider == "shm" && std::getenv("FI_SHM_DISABLE_CMA") == nullptr) {
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
    e.row_bytes = std::min<int64_t>(size, 2048);
    e.bytes = size;
    e.iterations = o.iterations;
    e.warmup = std::max(3, o.iterations / 10);
    e.provider = o.provider;
    e.zipf = o.zipf;
    e.verify = o.verify;
    e.timeout_ms = 30000;
    e.barrier_each_iteration = true;  // as the MPI baselines: every round starts together
    struct Variant {
      std::string name;
      int kind;  // 0 fabric, 1 p2p, 2 alltoallv
    };
    std::vector<Variant> variants = {{"msinfer", 0}};
    if (o.baseline_mpi) {
      variants.push_back({"mpi-p2p", 1});
      variants.push_back({"mpi-alltoallv", 2});
    }
    for (const auto& v : variants) {
      std::vector<double> lat;
      comm::ExchangeStats stats;
      if (v.kind == 0) {
        MSI_RETURN_IF_ERROR(comm::run_exchange(*boot, e, &stats));
        lat = stats.one_way_us;
      } else {
        MSI_RETURN_IF_ERROR(mpi_rounds(e, v.kind == 2, &lat));
      }
      // Gather every sender's latencies at rank 0.
      int count = static_cast<int>(lat.size());
      std::vector<int> counts(boot->size());
      MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
      std::vector<int> displs(boot->size());
      int total = 0;
      for (int r = 0; r < boot->size(); ++r) {
        displs[r] = total;
        total += counts[r];
      }
      std::vector<double> all(std::max(total, 1));
      MPI_Gatherv(lat.data(), count, MPI_DOUBLE, all.data(), counts.data(), displs.data(),
                  MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (boot->rank() == 0) {
        all.resize(total);
        int64_t per_sender = 0;
        for (int r = 0; r < o.receivers; ++r) per_sender += comm::exchange_rows(e, 0, r) * e.row_bytes;
        M2NBenchRow row;
        row.name = v.name;
        row.provider = o.provider;
        row.size = size;
        row.senders = o.senders;
        row.receivers = o.receivers;
        row.p50_us = percentile(all, 0.5);
        row.p99_us = percentile(all, 0.99);
        row.gbps = row.p50_us > 0 ? per_sender / (row.p50_us * 1e-6) / 1e9 : 0;
        rows.push_back(row);
      }
      (void)attention;
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
