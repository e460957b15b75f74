#include "msinfer/comm/m2n.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "msinfer/comm/exchange.h"
#include "msinfer/comm/inproc_transport.h"

namespace msinfer::comm {
namespace {

// Bootstrap for ranks that are threads of this process.
class LocalBoard {
 public:
  explicit LocalBoard(int n) : n_(n) {}
  StatusOr<std::vector<std::string>> allgather(int rank, const std::string& blob) {
    std::unique_lock<std::mutex> lock(mu_);
    const int round = rounds_[rank]++;
    auto& r = data_[round];
    r.resize(n_);
    r[rank] = blob;
    if (++count_[round] == n_) cv_.notify_all();
    cv_.wait(lock, [&] { return count_[round] == n_; });
    return r;
  }

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::vector<std::string>> data_;
  std::map<int, int> count_;
  std::map<int, int> rounds_;
};

class LocalBootstrap : public Bootstrap {
 public:
  LocalBootstrap(LocalBoard* b, int rank, int size) : b_(b), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  StatusOr<std::vector<std::string>> allgather(const std::string& blob) override {
    return b_->allgather(rank_, blob);
  }

 private:
  LocalBoard* b_;
  int rank_, size_;
};

std::vector<Status> run_threads(const ExchangeOptions& o) {
  InprocFabric fabric;
  ExchangeOptions opt = o;
  opt.inproc = &fabric;
  const int n = o.senders + o.receivers;
  LocalBoard board(n);
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      LocalBootstrap b(&board, r, n);
      st[r] = run_exchange(b, opt, nullptr);
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

TEST(ImmediateTest, PacksEveryField) {
  Immediate i{1, 127, 15, 9, 65535};
  Immediate u = Immediate::unpack(i.pack());
  EXPECT_EQ(u.channel, 1);
  EXPECT_EQ(u.sender, 127);
  EXPECT_EQ(u.slot, 15);
  EXPECT_EQ(u.seq, 9u);
  EXPECT_EQ(u.rows, 65535u);
  EXPECT_EQ(Immediate::unpack(Immediate{0, 3, 2, 17, 0}.pack()).seq, 1u);  // mod 16
}

// Every byte of every message checked, M x N up to 4 x 4, with checksums, many
// layers (slot reuse), skewed and empty messages.
TEST(M2NInprocTest, EveryByteArrivesForManyShapes) {
  for (auto [m, n] : {std::pair{1, 1}, {2, 3}, {4, 4}, {3, 1}}) {
    ExchangeOptions o;
    o.senders = m;
    o.receivers = n;
    o.bytes = 3000;
    o.row_bytes = 100;
    o.iterations = 40;
    o.slots = 3;
    o.checksum = true;
    o.empty_to_last = n > 1;
    for (const Status& s : run_threads(o)) EXPECT_TRUE(s.ok()) << s.to_string();
    o.empty_to_last = false;
    o.zipf = 1.2;
    for (const Status& s : run_threads(o)) EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

TEST(M2NInprocTest, BadSendsAreRefusedBeforeAnythingIsSent) {
  InprocFabric fabric;
  M2NEndpoint a(fabric.endpoint()), b(fabric.endpoint());
  M2NShape shape{1, 1, 2, 4, 16, false, 0};
  M2NSender s(shape, 0);
  M2NReceiver r(shape, 0);
  ASSERT_TRUE(s.attach(a).ok());
  auto region = r.attach(b);
  ASSERT_TRUE(region.ok());
  auto peer = a.transport().connect(b.transport().address());
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(s.send(0, 0, {1}).code(), StatusCode::kInvalidArgument);  // receiver not connected
  s.set_receiver(0, *peer, *region);
  Status too_many = s.send(0, 0, {5});
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("exceed the slot's capacity of 4"), std::string::npos);
  EXPECT_EQ(s.send(2, 0, {1}).code(), StatusCode::kInvalidArgument);     // slot out of range
  EXPECT_EQ(s.send(0, 0, {1, 1}).code(), StatusCode::kInvalidArgument);  // one receiver only
  EXPECT_EQ(M2NShape({200, 1, 2, 4, 16, false, 0}).validate().code(), StatusCode::kInvalidArgument);
  // Nothing reached the receiver: waiting times out naming sender 0.
  b.set_timeout(std::chrono::milliseconds(50));
  Status w = r.wait(0, 0);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("waiting for sender(s) 0"), std::string::npos) << w.message();
  // A valid send, an empty one, then a stale sequence number.
  ASSERT_TRUE(s.send(0, 0, {0}).ok());
  ASSERT_TRUE(r.wait(0, 0).ok());
  EXPECT_EQ(r.rows(0, 0), 0);
  r.release(0);
  ASSERT_TRUE(s.wait_sent(0).ok());
  ASSERT_TRUE(s.send(0, 7, {1}).ok());
  Status stale = r.wait(0, 8);
  EXPECT_NE(stale.message().find("stale write"), std::string::npos) << stale.message();
}

// A transport that flips one bit of every payload: checksums must catch it.
class CorruptingTransport : public Transport {
 public:
  explicit CorruptingTransport(std::unique_ptr<Transport> t) : t_(std::move(t)) {}
  std::string name() const override { return "corrupting"; }
  std::string address() const override { return t_->address(); }
  StatusOr<RemoteRegion> register_memory(void* b, size_t l) override {
    return t_->register_memory(b, l);
  }
  StatusOr<int> connect(const std::string& a) override { return t_->connect(a); }
  Status write(int peer, const void* src, size_t len, const RemoteRegion& dst, uint64_t off,
               uint32_t imm, uint64_t ctx) override {
    std::vector<uint8_t> copy(static_cast<const uint8_t*>(src),
                              static_cast<const uint8_t*>(src) + len);
    if (len > 9) copy[3] ^= 0x10;
    return t_->write(peer, copy.data(), len, dst, off, imm, ctx);
  }
  Status poll(std::vector<Completion>* out, size_t max) override { return t_->poll(out, max); }

 private:
  std::unique_ptr<Transport> t_;
};

TEST(M2NInprocTest, ChecksumsCatchCorruption) {
  InprocFabric fabric;
  M2NEndpoint a(std::make_unique<CorruptingTransport>(fabric.endpoint())), b(fabric.endpoint());
  M2NShape shape{1, 1, 1, 8, 16, /*checksum=*/true, 0};
  M2NSender s(shape, 0);
  M2NReceiver r(shape, 0);
  ASSERT_TRUE(s.attach(a).ok());
  auto region = r.attach(b);
  s.set_receiver(0, *a.transport().connect(b.transport().address()), *region);
  std::memset(s.buffer(0, 0), 7, 32);
  ASSERT_TRUE(s.send(0, 0, {2}).ok());
  Status w = r.wait(0, 0);
  EXPECT_NE(w.message().find("checksum mismatch in slot 0 from sender 0"), std::string::npos)
      << w.message();
}

// A dropped sender (a dead attention worker) is waited for no more and its
// late writes are ignored; a dropped receiver gets no more writes. The other
// pair keeps exchanging, sequence numbers checked.
TEST(M2NInprocTest, DroppedPeersAreNeitherWaitedForNorWrittenTo) {
  InprocFabric fabric;
  M2NEndpoint e0(fabric.endpoint()), e1(fabric.endpoint()), er(fabric.endpoint());
  const M2NShape shape{2, 2, 2, 4, 16, /*checksum=*/true, 0};
  M2NSender s0(shape, 0), s1(shape, 1);
  M2NReceiver r0(shape, 0), r1(shape, 1);
  ASSERT_TRUE(s0.attach(e0).ok());
  ASSERT_TRUE(s1.attach(e1).ok());
  auto reg0 = r0.attach(er);
  // r1 lives on its own endpoint (a process may receive one channel only).
  M2NEndpoint er1(fabric.endpoint());
  auto reg1 = r1.attach(er1);
  ASSERT_TRUE(reg0.ok() && reg1.ok());
  for (M2NSender* s : {&s0, &s1}) {
    M2NEndpoint& from = s == &s0 ? e0 : e1;
    s->set_receiver(0, *from.transport().connect(er.transport().address()), *reg0);
    s->set_receiver(1, *from.transport().connect(er1.transport().address()), *reg1);
  }
  er.set_timeout(std::chrono::milliseconds(50));
  // Round 0: only sender 0 writes; the slot waits for sender 1 until it is dropped.
  std::memset(s0.buffer(0, 0), 3, 16);
  ASSERT_TRUE(s0.send(0, 0, {1, 0}).ok());
  Status w = r0.wait(0, 0);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("waiting for sender(s) 1"), std::string::npos) << w.message();
  r0.drop_sender(1);
  EXPECT_TRUE(r0.dropped(1));
  ASSERT_TRUE(r0.wait(0, 0).ok());
  EXPECT_EQ(r0.rows(0, 0), 1);
  EXPECT_EQ(r0.rows(0, 1), 0);
  EXPECT_EQ(r0.data(0, 0)[15], 3);
  r0.release(0);
  // Receiver 1 takes its writes of each round and frees the slot.
  auto drain_r1 = [&] {
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(er1.progress().ok());
    r1.release(0);
  };
  drain_r1();
  // A write from the dropped sender, with a sequence number that would be
  // stale, changes nothing.
  ASSERT_TRUE(s1.send(0, 5, {2, 0}).ok());
  ASSERT_TRUE(s0.wait_sent(0).ok());
  ASSERT_TRUE(s0.send(0, 1, {0, 0}).ok());
  ASSERT_TRUE(r0.wait(0, 1).ok());
  EXPECT_EQ(r0.rows(0, 1), 0);
  EXPECT_EQ(r0.missing(1), std::vector<int>{0});  // slot 1: sender 0 has not written it
  r0.release(0);
  drain_r1();
  // Sender 0 drops receiver 1: its writes go to receiver 0 only.
  s0.drop_receiver(1);
  EXPECT_TRUE(s0.dropped(1));
  ASSERT_TRUE(s0.wait_sent(0).ok());
  ASSERT_TRUE(s0.send(0, 2, {1, 3}).ok());
  ASSERT_TRUE(r0.wait(0, 2).ok());
  EXPECT_EQ(r0.rows(0, 0), 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(er1.progress().ok());
  EXPECT_EQ(r1.missing(0), (std::vector<int>{0, 1}));
  // Restored (a replacement took their places): waited for and written to again.
  r0.release(0);
  r0.restore_sender(1);
  EXPECT_FALSE(r0.dropped(1));
  s0.restore_receiver(1);
  EXPECT_FALSE(s0.dropped(1));
  ASSERT_TRUE(s0.wait_sent(0).ok());
  std::memset(s0.buffer(0, 1), 9, 16);
  ASSERT_TRUE(s0.send(0, 3, {0, 1}).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(er1.progress().ok());
  EXPECT_EQ(r1.rows(0, 0), 1);
  EXPECT_EQ(r1.data(0, 0)[15], 9);
  ASSERT_TRUE(s1.wait_sent(0).ok());
  ASSERT_TRUE(s1.send(0, 3, {2, 0}).ok());
  ASSERT_TRUE(r0.wait(0, 3).ok());
  EXPECT_EQ(r0.rows(0, 1), 2);
}

// A wait's hook runs while the slot is incomplete: here it drops the sender
// that never writes (as an attention worker does when the router says an
// expert worker died), and the wait ends without the timeout. A hook's error
// ends the wait with that error.
TEST(M2NInprocTest, AHookBetweenPollsCanDropTheMissingSender) {
  InprocFabric fabric;
  M2NEndpoint e0(fabric.endpoint()), er(fabric.endpoint());
  const M2NShape shape{2, 1, 1, 4, 16, false, 0};
  M2NSender s0(shape, 0);
  M2NReceiver r(shape, 0);
  ASSERT_TRUE(s0.attach(e0).ok());
  auto reg = r.attach(er);
  ASSERT_TRUE(reg.ok());
  s0.set_receiver(0, *e0.transport().connect(er.transport().address()), *reg);
  er.set_timeout(std::chrono::milliseconds(60000));
  ASSERT_TRUE(s0.send(0, 0, {2}).ok());
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Status w = r.wait(0, 0, [&] {
    if (++calls == 3) r.drop_sender(1);
    return ok_status();
  });
  EXPECT_TRUE(w.ok()) << w.to_string();
  EXPECT_EQ(calls, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(r.rows(0, 0), 2);
  r.release(0);
  // Nothing is missing: the hook is not called.
  ASSERT_TRUE(s0.wait_sent(0).ok());
  ASSERT_TRUE(s0.send(0, 1, {1}).ok());
  ASSERT_TRUE(er.progress().ok());
  EXPECT_TRUE(r.wait(0, 1, [&] { return internal_error("called"); }).ok());
  r.release(0);
  M2NReceiver r2(shape, 0);
  M2NEndpoint er2(fabric.endpoint());
  ASSERT_TRUE(r2.attach(er2).ok());
  Status failed = r2.wait(0, 0, [&] { return unavailable("the router is gone"); });
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_EQ(failed.message(), "the router is gone");
}

}  // namespace
}  // namespace msinfer::comm
