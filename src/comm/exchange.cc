#include "msinfer/comm/exchange.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>

namespace msinfer::comm {
namespace {

uint8_t pattern(int channel, int from, int to, int iter, int64_t i) {
  return static_cast<uint8_t>((channel * 131 + from * 31 + to * 17 + iter * 7 + i * 13) & 0xff);
}

void fill(uint8_t* p, int64_t n, int channel, int from, int to, int iter) {
  for (int64_t i = 0; i < n; ++i) p[i] = pattern(channel, from, to, iter, i);
}

Status check(const uint8_t* p, int64_t n, int channel, int from, int to, int iter) {
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != pattern(channel, from, to, iter, i)) {
      return internal_error("exchange: byte " + std::to_string(i) + " of the message from rank " +
                            std::to_string(from) + " to " + std::to_string(to) + " (iteration " +
                            std::to_string(iter) + ", channel " + std::to_string(channel) +
                            ") is wrong");
    }
  }
  return ok_status();
}

}  // namespace

int64_t exchange_rows(const ExchangeOptions& o, int s, int r) {
  const int64_t uniform = std::max<int64_t>(0, o.bytes / o.row_bytes);
  if (o.empty_to_last && r == o.receivers - 1) return 0;
  if (o.zipf <= 0) return uniform;
  // Same total per sender as uniform, skewed towards low receiver indices.
  double z = 0;
  for (int j = 0; j < o.receivers; ++j) z += 1.0 / std::pow(j + 1.0, o.zipf);
  const double share = (1.0 / std::pow(r + 1.0, o.zipf)) / z;
  return static_cast<int64_t>(std::llround(share * uniform * o.receivers));
}

Status run_exchange(Bootstrap& boot, const ExchangeOptions& o, ExchangeStats* stats) {
  const int M = o.senders, N = o.receivers, me = boot.rank();
  if (boot.size() != M + N) {
    return invalid_argument("exchange: " + std::to_string(M) + " senders + " + std::to_string(N) +
                            " receivers need " + std::to_string(M + N) + " ranks, have " +
                            std::to_string(boot.size()));
  }
  const bool attention = me < M;
  int64_t max_rows = 0;
  for (int s = 0; s < M; ++s) {
    for (int r = 0; r < N; ++r) max_rows = std::max(max_rows, exchange_rows(o, s, r));
  }
  M2NShape dispatch{M, N, o.slots, max_rows, o.row_bytes, o.checksum, 0};
  M2NShape combine{N, M, o.slots, max_rows, o.row_bytes, o.checksum, 1};
  std::unique_ptr<Transport> transport;
  if (o.inproc != nullptr) {
    transport = o.inproc->endpoint();
  } else {
    FabricOptions fo;
    fo.provider = o.provider;
    MSI_ASSIGN_OR_RETURN(transport, make_fabric_transport(fo));
  }
  M2NEndpoint ep(std::move(transport), std::chrono::milliseconds(o.timeout_ms));
  // Attention ranks send dispatch and receive combine; expert ranks the reverse.
  const int my_index = attention ? me : me - M;
  M2NSender sender(attention ? dispatch : combine, my_index);
  M2NReceiver receiver(attention ? combine : dispatch, my_index);
  MSI_RETURN_IF_ERROR(sender.attach(ep));
  MSI_ASSIGN_OR_RETURN(RemoteRegion region, receiver.attach(ep));
  MSI_ASSIGN_OR_RETURN(std::vector<std::string> blobs,
                       boot.allgather(ep.transport().address() + region.encode()));
  // Peers: the other side's ranks.
  const int peers = attention ? N : M;
  const int first = attention ? M : 0;
  for (int p = 0; p < peers; ++p) {
    const std::string& b = blobs[first + p];
    if (b.size() < 24) return internal_error("exchange: bad bootstrap blob from rank " + std::to_string(first + p));
    MSI_ASSIGN_OR_RETURN(int handle, ep.transport().connect(b.substr(0, b.size() - 24)));
    MSI_ASSIGN_OR_RETURN(RemoteRegion rr, RemoteRegion::decode(b.substr(b.size() - 24)));
    sender.set_receiver(p, handle, rr);
  }
  MSI_RETURN_IF_ERROR(boot.barrier());

  const int total = o.warmup + o.iterations;
  if (stats != nullptr) {
    stats->one_way_us.clear();
    stats->bytes_per_sender = 0;
    for (int r = 0; r < N; ++r) stats->bytes_per_sender += exchange_rows(o, attention ? me : 0, r) * o.row_bytes;
  }
  for (int it = 0; it < total; ++it) {
    if (it == o.die_at_iteration && me == o.die_rank) ::_exit(3);
    const int slot = it % o.slots;
    const uint32_t seq = static_cast<uint32_t>(it / o.slots);
    if (attention) {
      std::vector<int64_t> rows(N);
      for (int r = 0; r < N; ++r) {
        rows[r] = exchange_rows(o, me, r);
        if (o.verify) fill(sender.buffer(slot, r), rows[r] * o.row_bytes, 0, me, M + r, it);
      }
      MSI_RETURN_IF_ERROR(sender.wait_sent(slot));
      const auto t0 = std::chrono::steady_clock::now();
      MSI_RETURN_IF_ERROR(sender.send(slot, seq, rows));
      MSI_RETURN_IF_ERROR(receiver.wait(slot, seq));
      const auto t1 = std::chrono::steady_clock::now();
      for (int r = 0; r < N; ++r) {
        if (receiver.rows(slot, r) != exchange_rows(o, me, r)) {
          return internal_error("exchange: expert rank " + std::to_string(M + r) + " answered " +
                                std::to_string(receiver.rows(slot, r)) + " rows, expected " +
                                std::to_string(exchange_rows(o, me, r)));
        }
        if (o.verify) {
          MSI_RETURN_IF_ERROR(check(receiver.data(slot, r), receiver.rows(slot, r) * o.row_bytes, 1,
                                    M + r, me, it));
        }
      }
      receiver.release(slot);
      if (stats != nullptr && it >= o.warmup) {
        stats->one_way_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
      }
    } else {
      MSI_RETURN_IF_ERROR(receiver.wait(slot, seq));
      std::vector<int64_t> rows(M);
      MSI_RETURN_IF_ERROR(sender.wait_sent(slot));
      for (int s = 0; s < M; ++s) {
        rows[s] = receiver.rows(slot, s);
        if (rows[s] != exchange_rows(o, s, my_index)) {
          return internal_error("exchange: attention rank " + std::to_string(s) + " sent " +
                                std::to_string(rows[s]) + " rows, expected " +
                                std::to_string(exchange_rows(o, s, my_index)));
        }
        if (o.verify) {
          MSI_RETURN_IF_ERROR(check(receiver.data(slot, s), rows[s] * o.row_bytes, 0, s, me, it));
          fill(sender.buffer(slot, s), rows[s] * o.row_bytes, 1, me, s, it);
        }
      }
      MSI_RETURN_IF_ERROR(sender.send(slot, seq, rows));
      receiver.release(slot);
    }
  }
  // Drain: our last writes must complete before the process may exit.
  for (int s = 0; s < o.slots; ++s) MSI_RETURN_IF_ERROR(sender.wait_sent(s));
  return boot.barrier();
}

}  // namespace msinfer::comm
