#include "msinfer/comm/exchange.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>

namespace msinfer::comm {
namespace {

// Message contents: a pattern fixed per (channel, from, to) and an 8-byte stamp
// with the iteration at the start, so a message that was not rewritten shows.
// Filling and checking are memcpy/memcmp against a prepared copy: cheap enough
// not to disturb the timing on a machine with fewer cores than processes.
std::vector<uint8_t> make_pattern(int channel, int from, int to, int64_t n) {
  std::vector<uint8_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<uint8_t>((channel * 131 + from * 31 + to * 17 + i * 13 + (i >> 8)) & 0xff);
  }
  return p;
}

void fill(uint8_t* p, const std::vector<uint8_t>& pat, int64_t n, int iter) {
  if (n <= 0) return;  // an empty message: pat.data() may be null (memcpy's UB)
  std::memcpy(p, pat.data(), static_cast<size_t>(n));
  if (n >= 8) {
    const int64_t stamp = iter;
    std::memcpy(p, &stamp, 8);
  }
}

Status check(const uint8_t* p, const std::vector<uint8_t>& pat, int64_t n, int channel, int from,
             int to, int iter) {
  int64_t stamp = iter;
  const bool stamp_ok = n < 8 || std::memcmp(p, &stamp, 8) == 0;
  const int64_t skip = n >= 8 ? 8 : 0;
  if (!stamp_ok ||
      (n > skip && std::memcmp(p + skip, pat.data() + skip, static_cast<size_t>(n - skip)) != 0)) {
    int64_t i = skip;
    while (i < n && p[i] == pat[i]) ++i;
    return internal_error("exchange: the message from rank " + std::to_string(from) + " to " +
                          std::to_string(to) + " (iteration " + std::to_string(iter) +
                          ", channel " + std::to_string(channel) + ") is wrong" +
                          (stamp_ok ? " at byte " + std::to_string(i) : " (stale: old iteration)"));
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

struct Exchange::State {
  ExchangeOptions o;
  Bootstrap* boot = nullptr;
  bool attention = false;
  int me = 0, my_index = 0, peers = 0, first = 0;
  std::unique_ptr<M2NEndpoint> ep;
  std::unique_ptr<M2NSender> sender;
  std::unique_ptr<M2NReceiver> receiver;
  // Prepared contents: what this rank sends to each peer and expects from it.
  std::vector<std::vector<uint8_t>> out_pat, in_pat;
  std::vector<int64_t> out_rows, in_rows;
  int64_t bytes_per_sender = 0;
  bool failed = false;
};

Exchange::Exchange(std::unique_ptr<State> s) : s_(std::move(s)) {}

Exchange::~Exchange() {
  // A failed exchange does not block closing a dead peer's link.
  if (s_ != nullptr && s_->failed && s_->ep != nullptr) s_->ep->abandon();
}

int64_t Exchange::bytes_per_sender() const { return s_->bytes_per_sender; }

StatusOr<std::unique_ptr<Exchange>> Exchange::open(Bootstrap& boot, const ExchangeOptions& o) {
  const int M = o.senders, N = o.receivers, me = boot.rank();
  if (boot.size() != M + N) {
    return invalid_argument("exchange: " + std::to_string(M) + " senders + " + std::to_string(N) +
                            " receivers need " + std::to_string(M + N) + " ranks, have " +
                            std::to_string(boot.size()));
  }
  auto st = std::make_unique<State>();
  State& x = *st;
  x.o = o;
  x.boot = &boot;
  x.me = me;
  x.attention = me < M;
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
    fo.transport = o.transport;
    fo.max_message_bytes = max_rows * o.row_bytes;
    fo.write_timeout_ms = o.timeout_ms;
    MSI_ASSIGN_OR_RETURN(transport, make_transport(fo));
  }
  x.ep = std::make_unique<M2NEndpoint>(std::move(transport), std::chrono::milliseconds(o.timeout_ms));
  x.ep->set_yield_when_idle(oversubscribed(local_process_count(boot.size())));
  x.ep->set_spins_before_yield(0);  // nothing but communication here (m2n.h)
  std::unique_ptr<Exchange> ex(new Exchange(std::move(st)));
  x.failed = true;  // until set up
  // Attention ranks send dispatch and receive combine; expert ranks the reverse.
  x.my_index = x.attention ? me : me - M;
  x.sender = std::make_unique<M2NSender>(x.attention ? dispatch : combine, x.my_index);
  x.receiver = std::make_unique<M2NReceiver>(x.attention ? combine : dispatch, x.my_index);
  MSI_RETURN_IF_ERROR(x.sender->attach(*x.ep));
  MSI_ASSIGN_OR_RETURN(RemoteRegion region, x.receiver->attach(*x.ep));
  MSI_ASSIGN_OR_RETURN(std::vector<std::string> blobs,
                       boot.allgather(PeerCard{x.ep->transport().address(), region}.encode()));
  // Peers: the other side's ranks.
  x.peers = x.attention ? N : M;
  x.first = x.attention ? M : 0;
  for (int p = 0; p < x.peers; ++p) {
    MSI_ASSIGN_OR_RETURN(
        PeerCard card, PeerCard::decode(blobs[x.first + p], "rank " + std::to_string(x.first + p)));
    MSI_ASSIGN_OR_RETURN(int handle, x.ep->transport().connect(card.address));
    x.sender->set_receiver(p, handle, card.region);
  }
  MSI_RETURN_IF_ERROR(boot.barrier());
  for (int r = 0; r < N; ++r) {
    x.bytes_per_sender += exchange_rows(o, x.attention ? me : 0, r) * o.row_bytes;
  }
  x.out_pat.resize(x.peers);
  x.in_pat.resize(x.peers);
  x.out_rows.resize(x.peers);
  x.in_rows.resize(x.peers);
  for (int p = 0; p < x.peers; ++p) {
    const int peer_rank = x.first + p;
    x.out_rows[p] = x.attention ? exchange_rows(o, me, p) : exchange_rows(o, p, x.my_index);
    x.in_rows[p] = x.out_rows[p];  // replies mirror the dispatch
    if (o.verify) {
      x.out_pat[p] = make_pattern(x.attention ? 0 : 1, me, peer_rank, x.out_rows[p] * o.row_bytes);
      x.in_pat[p] = make_pattern(x.attention ? 1 : 0, peer_rank, me, x.in_rows[p] * o.row_bytes);
    }
  }
  x.failed = false;
  return ex;
}

Status Exchange::round(int it, double* one_way_us) {
  State& x = *s_;
  x.failed = true;  // until this round completes
  const ExchangeOptions& o = x.o;
  M2NSender& sender = *x.sender;
  M2NReceiver& receiver = *x.receiver;
  if (one_way_us != nullptr) *one_way_us = 0;
  if (it == o.die_at_iteration && x.me == o.die_rank) ::_exit(3);
  const int slot = it % o.slots;
  const uint32_t seq = static_cast<uint32_t>(it / o.slots);
  // Prepare the outgoing rows (the buffer is free once its last writes completed).
  MSI_RETURN_IF_ERROR(sender.wait_sent(slot));
  if (o.verify) {
    for (int p = 0; p < x.peers; ++p) {
      fill(sender.buffer(slot, p), x.out_pat[p], x.out_rows[p] * o.row_bytes, it);
    }
  }
  if (o.barrier_each_iteration) MSI_RETURN_IF_ERROR(x.boot->barrier());
  if (x.attention) {
    const auto t0 = std::chrono::steady_clock::now();
    MSI_RETURN_IF_ERROR(sender.send(slot, seq, x.out_rows));
    MSI_RETURN_IF_ERROR(receiver.wait(slot, seq));
    const auto t1 = std::chrono::steady_clock::now();
    if (one_way_us != nullptr) {
      *one_way_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / 2;
    }
  } else {
    // Answer as soon as the dispatch is in; verification comes after.
    MSI_RETURN_IF_ERROR(receiver.wait(slot, seq));
    MSI_RETURN_IF_ERROR(sender.send(slot, seq, x.out_rows));
    // Keep progressing until the answer left: some providers move large
    // messages in segments that need the sender's progress (shm without CMA).
    MSI_RETURN_IF_ERROR(sender.wait_sent(slot));
  }
  // Benchmarks: nobody verifies (or starts the next round's work) while
  // another rank is still timing this one; on a host with fewer cores than
  // ranks that work would take the core from a rank that is waiting.
  if (o.barrier_each_iteration) MSI_RETURN_IF_ERROR(x.boot->barrier());
  for (int p = 0; p < x.peers; ++p) {
    if (receiver.rows(slot, p) != x.in_rows[p]) {
      return internal_error("exchange: rank " + std::to_string(x.first + p) + " sent " +
                            std::to_string(receiver.rows(slot, p)) + " rows to rank " +
                            std::to_string(x.me) + ", expected " + std::to_string(x.in_rows[p]));
    }
    if (o.verify) {
      MSI_RETURN_IF_ERROR(check(receiver.data(slot, p), x.in_pat[p], x.in_rows[p] * o.row_bytes,
                                x.attention ? 1 : 0, x.first + p, x.me, it));
    }
  }
  receiver.release(slot);
  x.failed = false;
  return ok_status();
}

Status Exchange::close() {
  State& x = *s_;
  x.failed = true;
  // Drain: our last writes must complete before the process may exit.
  for (int s = 0; s < x.o.slots; ++s) MSI_RETURN_IF_ERROR(x.sender->wait_sent(s));
  MSI_RETURN_IF_ERROR(x.boot->barrier());
  x.failed = false;
  return ok_status();
}

Status run_exchange(Bootstrap& boot, const ExchangeOptions& o, ExchangeStats* stats) {
  MSI_ASSIGN_OR_RETURN(std::unique_ptr<Exchange> ex, Exchange::open(boot, o));
  if (stats != nullptr) {
    stats->one_way_us.clear();
    stats->bytes_per_sender = ex->bytes_per_sender();
  }
  const int total = o.warmup + o.iterations;
  for (int it = 0; it < total; ++it) {
    double us = 0;
    MSI_RETURN_IF_ERROR(ex->round(it, &us));
    if (stats != nullptr && it >= o.warmup && boot.rank() < o.senders) stats->one_way_us.push_back(us);
  }
  return ex->close();
}

}  // namespace msinfer::comm
