// What every transport under M2N promises (transport.h), checked on each one
// with two endpoints in this process: msinfer's direct and socket transports
// and libfabric's shm and tcp providers. The target is polled by a thread of
// its own (a Pump) while the writer's thread writes: libfabric's writes need
// the target's progress to go out at all.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "msinfer/comm/fabric_transport.h"

namespace msinfer::comm {
namespace {

// Polls a transport on a thread of its own until stopped; the transport must
// not be used by anyone else meanwhile.
class Pump {
 public:
  explicit Pump(Transport& t) : t_(t), thread_([this] { run(); }) {}
  ~Pump() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  size_t count() {
    std::lock_guard<std::mutex> l(mu_);
    return got_.size();
  }
  std::vector<Completion> completions() {
    std::lock_guard<std::mutex> l(mu_);
    return got_;
  }
  bool ok() {
    std::lock_guard<std::mutex> l(mu_);
    return status_.ok();
  }

 private:
  void run() {
    std::vector<Completion> batch;
    while (!stop_) {
      batch.clear();
      Status s = t_.poll(&batch, 64);
      std::lock_guard<std::mutex> l(mu_);
      if (!s.ok()) status_ = s;
      got_.insert(got_.end(), batch.begin(), batch.end());
    }
  }
  Transport& t_;
  std::mutex mu_;
  std::vector<Completion> got_;
  Status status_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Transports are named on the command line and in a worker's configuration;
// each name stands for one kind, and each kind knows what it can do.
TEST(TransportKindTest, NamesRoundTripAndUnknownNamesAreRefused) {
  int msinfer_own = 0, within_host = 0;
  for (TransportKind k :
       {TransportKind::kDirect, TransportKind::kSocket, TransportKind::kFabricShm,
        TransportKind::kFabricTcp, TransportKind::kFabricVerbs, TransportKind::kFabricEfa}) {
    auto back = parse_transport(transport_name(k));
    ASSERT_TRUE(back.ok()) << transport_name(k);
    EXPECT_EQ(*back, k);
    msinfer_own += transport_is_msinfer(k);
    within_host += transport_within_host(k);
  }
  EXPECT_EQ(msinfer_own, 2);
  EXPECT_TRUE(transport_is_msinfer(TransportKind::kDirect) &&
              transport_is_msinfer(TransportKind::kSocket));
  EXPECT_EQ(within_host, 2);
  EXPECT_TRUE(transport_within_host(TransportKind::kDirect) &&
              transport_within_host(TransportKind::kFabricShm));
  for (const char* bad : {"", "ib", "TCP", "tcp;ofi_rxm", "fabric:shm"}) {
    auto t = parse_transport(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().message(),
              std::string("unknown provider '") + bad + "' (direct, socket, shm, tcp, verbs, efa)");
  }
  // libfabric's constructor takes only libfabric's providers.
  FabricOptions o;
  o.transport = TransportKind::kDirect;
  auto f = make_fabric_transport(o);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("'direct' is not a libfabric provider"), std::string::npos);
}

// libfabric is opened when a libfabric transport is made, not when the
// binary starts (fabric_lazy.cc); msinfer's own transports never open it.
TEST(FabricLibraryTest, LoadsOnlyForALibfabricTransport) {
  auto loaded = [] {
    void* h = ::dlopen("libfabric.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h != nullptr) ::dlclose(h);
    return h != nullptr;
  };
  EXPECT_FALSE(loaded()) << "libfabric.so.1 loaded at start";
  FabricOptions o;
  o.transport = TransportKind::kSocket;
  ASSERT_TRUE(make_transport(o).ok());
  EXPECT_FALSE(loaded()) << "the socket transport opened libfabric";
  o.transport = TransportKind::kFabricTcp;
  auto t = make_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(loaded());
}

// A socket peer that is gone (its endpoint closed, as when its process
// dies): with tolerate_peer_loss the writer forgets it, so every write still
// completes locally and poll() stays ok; without, the writer gets an error
// naming the connection.
TEST(SocketPeerLossTest, AGonePeerIsForgottenOnlyWhenTolerated) {
  for (bool tolerate : {true, false}) {
    SCOPED_TRACE(tolerate ? "tolerated" : "not tolerated");
    FabricOptions o;
    o.transport = TransportKind::kSocket;
    o.tolerate_peer_loss = tolerate;
    auto a = make_transport(o);
    o.tolerate_peer_loss = false;
    auto b = make_transport(o);
    ASSERT_TRUE(a.ok() && b.ok());
    auto ma = (*a)->allocate(4096), mb = (*b)->allocate(4096);
    ASSERT_TRUE(ma.ok() && mb.ok());
    ASSERT_TRUE((*a)->register_memory((*ma)->data(), 4096).ok());
    auto rb = (*b)->register_memory((*mb)->data(), 4096);
    ASSERT_TRUE(rb.ok());
    auto to_b = (*a)->connect((*b)->address());
    ASSERT_TRUE(to_b.ok());
    {
      Pump pump(**b);
      ASSERT_TRUE((*a)->write(*to_b, (*ma)->data(), 100, *rb, 0, 1, 0).ok());
      std::vector<Completion> got;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while ((got.empty() || pump.count() < 1) && std::chrono::steady_clock::now() < deadline) {
        ASSERT_TRUE((*a)->poll(&got, 8).ok());
      }
      pump.stop();
      ASSERT_EQ(pump.count(), 1u);
    }
    b->reset();  // the peer is gone: its sockets close
    Status failed = ok_status();
    int completed = 0;
    for (int i = 0; i < 200 && failed.ok(); ++i) {
      failed = (*a)->write(*to_b, (*ma)->data(), 2048, *rb, 0, 2, 7);
      std::vector<Completion> got;
      if (failed.ok()) failed = (*a)->poll(&got, 64);
      for (const Completion& c : got) completed += c.kind == Completion::Kind::kLocalWrite;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (tolerate) {
      EXPECT_TRUE(failed.ok()) << failed.to_string();
      for (int i = 0; i < 500 && completed < 200; ++i) {  // writes the kernel had queued
        std::vector<Completion> got;
        ASSERT_TRUE((*a)->poll(&got, 64).ok());
        for (const Completion& c : got) completed += c.kind == Completion::Kind::kLocalWrite;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      EXPECT_EQ(completed, 200);
    } else {
      EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
      EXPECT_NE(failed.message().find("peer 0"), std::string::npos) << failed.message();
    }
  }
}

class TransportContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Transport> open() {
    FabricOptions o;
    o.transport = *parse_transport(GetParam());
    auto t = make_transport(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }

  // Polls the writer until `local` local completions came and the target's
  // pump until it saw `remote` completions (or 10 s passed); stops the pump
  // and returns what it saw.
  std::vector<Completion> settle(Transport& writer, Pump& target, size_t local, size_t remote,
                                 std::vector<Completion>* locals = nullptr) {
    std::vector<Completion> got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((got.size() < local || target.count() < remote) &&
           std::chrono::steady_clock::now() < deadline) {
      EXPECT_TRUE(writer.poll(&got, 64).ok());
    }
    target.stop();
    EXPECT_TRUE(target.ok());
    EXPECT_EQ(got.size(), local);
    EXPECT_EQ(target.count(), remote);
    if (locals != nullptr) *locals = got;
    return target.completions();
  }
};

TEST_P(TransportContractTest, WritesArriveWholeInOrderAndBeforeTheirImmediates) {
  auto a = open(), b = open();
  ASSERT_TRUE(a && b);
  auto mem = b->allocate(1 << 20);
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  auto region = b->register_memory((*mem)->data(), (*mem)->size());
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  std::vector<uint8_t> src(300000);
  std::iota(src.begin(), src.end(), 7);
  auto src_region = a->register_memory(src.data(), src.size());  // libfabric: FI_MR_LOCAL
  ASSERT_TRUE(src_region.ok());
  auto peer = a->connect(b->address());
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();

  Pump pump(*b);
  for (uint32_t k = 0; k < 3; ++k) {
    Status s = a->write(*peer, src.data(), src.size(), *region, 1000 + k * 300000, 0xabc00 + k, 40 + k);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  ASSERT_TRUE(a->write(*peer, src.data(), 0, *region, 0, 0xabcff, 99).ok());  // empty still signals
  std::vector<Completion> local;
  auto remote = settle(*a, pump, 4, 4, &local);
  ASSERT_EQ(local.size(), 4u);
  ASSERT_EQ(remote.size(), 4u);
  std::vector<uint64_t> contexts;
  for (const auto& c : local) {
    EXPECT_EQ(c.kind, Completion::Kind::kLocalWrite);
    contexts.push_back(c.context);
  }
  std::sort(contexts.begin(), contexts.end());
  EXPECT_EQ(contexts, (std::vector<uint64_t>{40, 41, 42, 99}));
  for (uint32_t k = 0; k < 4; ++k) {
    EXPECT_EQ(remote[k].kind, Completion::Kind::kRemoteWrite);
    EXPECT_EQ(remote[k].imm, k < 3 ? 0xabc00 + k : 0xabcffu) << "immediates arrive in order";
  }
  for (uint32_t k = 0; k < 3; ++k) {
    EXPECT_EQ(std::memcmp((*mem)->data() + 1000 + k * 300000, src.data(), src.size()), 0) << k;
  }
}

TEST_P(TransportContractTest, ALargeWriteNeedsOnlyPollingOnBothSides) {
  auto a = open(), b = open();
  ASSERT_TRUE(a && b);
  const size_t n = 8 << 20;
  auto mem = b->allocate(n);
  ASSERT_TRUE(mem.ok());
  auto region = b->register_memory((*mem)->data(), n);
  std::vector<uint8_t> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  ASSERT_TRUE(a->register_memory(src.data(), n).ok());
  auto peer = a->connect(b->address());
  ASSERT_TRUE(region.ok() && peer.ok());
  Pump pump(*b);
  ASSERT_TRUE(a->write(*peer, src.data(), n, *region, 0, 7, 1).ok());
  auto remote = settle(*a, pump, 1, 1);
  ASSERT_EQ(remote.size(), 1u);
  EXPECT_EQ(remote[0].imm, 7u);
  EXPECT_EQ(std::memcmp((*mem)->data(), src.data(), n), 0);
}

TEST_P(TransportContractTest, BothDirectionsWork) {
  auto a = open(), b = open();
  ASSERT_TRUE(a && b);
  auto ma = a->allocate(4096), mb = b->allocate(4096);
  ASSERT_TRUE(ma.ok() && mb.ok());
  auto ra = a->register_memory((*ma)->data(), 4096), rb = b->register_memory((*mb)->data(), 4096);
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto to_b = a->connect(b->address());
  ASSERT_TRUE(to_b.ok());
  std::memset((*ma)->data(), 0x11, 100);
  {
    Pump pump(*b);
    ASSERT_TRUE(a->write(*to_b, (*ma)->data(), 100, *rb, 0, 1, 0).ok());
    ASSERT_EQ(settle(*a, pump, 1, 1).size(), 1u);
  }
  auto to_a = b->connect(a->address());  // after a wrote: may share its connection
  ASSERT_TRUE(to_a.ok());
  std::memset((*mb)->data() + 200, 0x22, 100);
  Pump pump(*a);
  ASSERT_TRUE(b->write(*to_a, (*mb)->data() + 200, 100, *ra, 300, 2, 0).ok());
  auto back = settle(*b, pump, 1, 1);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].imm, 2u);
  EXPECT_EQ((*ma)->data()[300], 0x22);
  EXPECT_EQ((*ma)->data()[399], 0x22);
  EXPECT_EQ((*mb)->data()[0], 0x11);
}

TEST_P(TransportContractTest, BadWritesAreRefusedBeforeAnythingMoves) {
  auto a = open(), b = open();
  ASSERT_TRUE(a && b);
  auto mem = b->allocate(4096);
  ASSERT_TRUE(mem.ok());
  auto region = b->register_memory((*mem)->data(), 4096);
  auto peer = a->connect(b->address());
  ASSERT_TRUE(region.ok() && peer.ok());
  std::vector<uint8_t> src(8192, 1);
  ASSERT_TRUE(a->register_memory(src.data(), src.size()).ok());
  Pump pump(*b);
  Status s = a->write(*peer, src.data(), 4096, *region, 1, 0, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  s = a->write(*peer + 1, src.data(), 16, *region, 0, 0, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  std::vector<Completion> got;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(a->poll(&got, 64).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pump.stop();
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(pump.count(), 0u);
  EXPECT_EQ((*mem)->data()[1], 0) << "nothing was written";
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportContractTest,
                         ::testing::Values("direct", "socket", "shm", "tcp"));

}  // namespace
}  // namespace msinfer::comm
