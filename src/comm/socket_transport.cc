#include "msinfer/comm/socket_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>

#include "internal/socket_wire.h"
#include "msinfer/comm/bootstrap.h"
#include "msinfer/comm/tcp.h"
#include "msinfer/core/logging.h"

namespace msinfer::comm {
namespace {

using Header = internal::WireHeader;
using In = internal::WireReader;

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// An address is "socket:<ip>:<port>:<secret>"; messages show it without the
// secret.
std::string shown(const std::string& address) { return address.substr(0, address.rfind(':')); }

class SocketTransport : public Transport {
 public:
  ~SocketTransport() override {
    // Every connection is watched (it may carry the peer's writes), so
    // incoming_ has them all.
    for (auto& [fd, in] : incoming_) ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  Status init(const FabricOptions& o) {
    connect_timeout_ = std::chrono::milliseconds(o.write_timeout_ms);
    tolerate_ = o.tolerate_peer_loss;
    if (o.hello_timeout_ms <= 0) {
      return invalid_argument("socket transport: hello_timeout_ms must be > 0, got " +
                              std::to_string(o.hello_timeout_ms));
    }
    hello_timeout_ = std::chrono::milliseconds(o.hello_timeout_ms);
    const std::string host = o.address.empty() ? "127.0.0.1" : o.address;
    int port = 0;
    MSI_ASSIGN_OR_RETURN(listen_fd_, tcp_listen(host, 0, &port));
    set_nonblocking(listen_fd_);
    // A secret of this endpoint's own, handed to peers only inside its
    // address (through the job's bootstrap): a connection must present it.
    secret_ = new_job_secret();
    address_ = "socket:" + host + ":" + std::to_string(port) + ":" + secret_;
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return internal_error("socket transport: epoll_create1: " + errno_text(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
      return internal_error("socket transport: epoll_ctl: " + errno_text(errno));
    }
    return ok_status();
  }

  std::string name() const override { return "socket"; }
  std::string address() const override { return address_; }

  StatusOr<RemoteRegion> register_memory(void* base, size_t len) override {
    RemoteRegion r;
    r.key = ++next_key_;
    r.base = 0;  // offsets into the region
    r.length = len;
    regions_[r.key] = {static_cast<uint8_t*>(base), len};
    return r;
  }

  // Connections are made at the first write, one per pair of endpoints: if
  // the peer already connected to us (it wrote first), its connection carries
  // our writes too, so the acknowledgements of one direction ride on the
  // other's data instead of going as packets of their own.
  StatusOr<int> connect(const std::string& address) override {
    const size_t secret_at = address.rfind(':') + 1;
    if (address.rfind("socket:", 0) != 0 || address.size() - secret_at != internal::kSecretChars ||
        address.find(':', 7) == secret_at - 1) {
      return invalid_argument("socket transport: '" + shown(address) +
                              "' is not a socket address (socket:<ip>:<port>:<secret>)");
    }
    peers_.push_back({kNotYet, address, {}});
    return static_cast<int>(peers_.size()) - 1;
  }

  Status write(int peer, const void* src, size_t len, const RemoteRegion& dst, uint64_t offset,
               uint32_t imm, uint64_t context) override {
    MSI_RETURN_IF_ERROR(check_write("socket transport", peer, peers_.size(), len, dst, offset));
    Peer& p = peers_[peer];
    if (p.fd == kNotYet) {
      Status s = open_connection(peer);
      if (!s.ok() && !tolerate_) return s;
      if (!s.ok()) p.fd = kClosed;  // forgotten: the write completes below
    }
    p.queue.push_back({{dst.key, dst.base + offset, len, imm, 0}, static_cast<const uint8_t*>(src), 0, context});
    if (p.queue.size() == 1) return flush(peer);
    return ok_status();
  }

  Status poll(std::vector<Completion>* out, size_t max) override {
    for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
      if (!peers_[i].queue.empty()) MSI_RETURN_IF_ERROR(flush(i));
    }
    MSI_RETURN_IF_ERROR(pump());
    while (max > 0 && !done_.empty()) {
      out->push_back(done_.front());
      done_.pop_front();
      --max;
    }
    return ok_status();
  }

 private:
  struct Out {
    Header h;
    const uint8_t* src;
    size_t sent;  // header and payload bytes handed to the kernel
    uint64_t context;
  };
  static constexpr int kNotYet = -1, kClosed = -2;
  struct Peer {
    int fd;  // kNotYet until the first write
    std::string address;
    std::deque<Out> queue;
  };

  // "peer N (address)" when we write to the connection's owner too.
  std::string name_of(const In& in) const {
    if (in.who.empty()) return "a peer";
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (peers_[i].address == in.who)
        return "peer " + std::to_string(i) + " (" + shown(in.who) + ")";
    }
    return shown(in.who);
  }

  Status open_connection(int peer) {
    Peer& p = peers_[peer];
    MSI_RETURN_IF_ERROR(pump());  // take in connections (and hellos) that arrived
    for (auto& [fd, in] : incoming_) {
      if (in.hello_done() && in.who == p.address) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        p.fd = fd;
        return ok_status();
      }
    }
    const size_t secret_at = p.address.rfind(':') + 1;
    MSI_ASSIGN_OR_RETURN(int fd, tcp_connect(p.address.substr(7, secret_at - 8), connect_timeout_));
    // Hello: the target's secret, then who is writing, so that the target
    // can name us, and answer on this connection (socket_wire.h).
    const std::string body = p.address.substr(secret_at) + address_;
    const uint32_t n = static_cast<uint32_t>(body.size());
    std::string hello(reinterpret_cast<const char*>(&n), 4);
    hello += body;
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
      const int e = errno;
      ::close(fd);
      return Status(StatusCode::kUnavailable, "socket transport: hello to peer " +
                                                  std::to_string(peer) + " (" + shown(p.address) +
                                                  "): " + errno_text(e));
    }
    set_nonblocking(fd);
    In in;
    in.who = p.address;
    in.part = In::Part::kHeader;  // the peer answers without a hello
    MSI_RETURN_IF_ERROR(watch(fd, std::move(in)));
    p.fd = fd;
    return ok_status();
  }

  // Reads from every connection epoll says has data; accepts new ones
  // (unless accepting is paused: no fd to spare); closes pending connections
  // whose hello is late.
  Status pump() {
    epoll_event ev[32];
    const int n = ::epoll_wait(epoll_fd_, ev, 32, 0);
    if (n < 0 && errno != EINTR) return internal_error("socket transport: epoll_wait: " + errno_text(errno));
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.fd == listen_fd_) {
        if (Clock::now() >= accept_paused_until_) MSI_RETURN_IF_ERROR(accept_all());
      } else if (incoming_.count(ev[i].data.fd) != 0) {  // not closed by this round
        MSI_RETURN_IF_ERROR(read_from(ev[i].data.fd));
      }
    }
    if (!pending_.empty()) close_late_hellos();
    return ok_status();
  }

  void close_late_hellos() {
    const auto now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      const int fd = it->first;
      const bool late = it->second <= now;
      ++it;  // drop() erases fd's entry
      if (late) drop(fd);
    }
  }

  int oldest_pending() const {
    auto oldest = pending_.begin();  // every deadline is accept time + hello_timeout_
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->second < oldest->second) oldest = it;
    }
    return oldest->first;
  }

  Status watch(int fd, In in) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      return internal_error("socket transport: epoll_ctl: " + errno_text(errno));
    }
    incoming_[fd] = std::move(in);
    return ok_status();
  }

  // A peer that is gone (tolerate_): its queued writes complete locally.
  Status forget(int peer) {
    Peer& p = peers_[peer];
    if (p.fd >= 0) drop(p.fd);
    p.fd = kClosed;
    for (const Out& o : p.queue) done_.push_back({Completion::Kind::kLocalWrite, 0, o.context});
    p.queue.clear();
    return ok_status();
  }

  // Hands queued writes to the kernel until it takes no more.
  Status flush(int peer) {
    Peer& p = peers_[peer];
    if (p.fd == kClosed && !p.queue.empty()) {
      if (tolerate_) return forget(peer);
      return Status(StatusCode::kUnavailable, "socket transport: peer " + std::to_string(peer) +
                                                  " (" + shown(p.address) +
                                                  ") closed the connection (gone?)");
    }
    while (!p.queue.empty()) {
      Out& o = p.queue.front();
      const size_t total = sizeof(Header) + o.h.len;
      iovec iov[2];
      int k = 0;
      if (o.sent < sizeof(Header)) {
        iov[k++] = {reinterpret_cast<char*>(&o.h) + o.sent, sizeof(Header) - o.sent};
        if (o.h.len > 0) iov[k++] = {const_cast<uint8_t*>(o.src), o.h.len};
      } else {
        iov[k++] = {const_cast<uint8_t*>(o.src) + (o.sent - sizeof(Header)), total - o.sent};
      }
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<size_t>(k);
      const ssize_t n = ::sendmsg(p.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();  // next poll
        if (errno == EINTR) continue;
        if (tolerate_) return forget(peer);
        return Status(StatusCode::kUnavailable, "socket transport: write to peer " +
                                                    std::to_string(peer) + " (" + shown(p.address) +
                                                    "): " + errno_text(errno) + " (gone?)");
      }
      o.sent += static_cast<size_t>(n);
      if (o.sent < total) return ok_status();  // the kernel is full
      done_.push_back({Completion::Kind::kLocalWrite, 0, o.context});
      p.queue.pop_front();
    }
    return ok_status();
  }

  // Accepts what the backlog holds. Strangers cost at most
  // kSocketMaxPendingConnections fds; no fd to spare is never an error
  // (socket_transport.h).
  Status accept_all() {
    while (true) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        const int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) return ok_status();
        // That connection failed, not the listener (accept(2): Linux hands
        // pending network errors to accept; retry).
        if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == ENETDOWN || e == ENOPROTOOPT ||
            e == EHOSTDOWN || e == ENONET || e == EHOSTUNREACH || e == EOPNOTSUPP ||
            e == ENETUNREACH) {
          continue;
        }
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
          if (!warned_fd_limit_) {
            MSI_LOG(WARNING) << "socket transport: accept: " << errno_text(e)
                             << "; closing connections without a hello, else pausing accepts "
                             << kSocketAcceptBackoffMs << " ms at a time (logged once)";
            warned_fd_limit_ = true;
          }
          if (!pending_.empty()) {
            drop(oldest_pending());
            continue;
          }
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(kSocketAcceptBackoffMs);
          return ok_status();
        }
        return internal_error("socket transport: accept: " + errno_text(e));
      }
      if (pending_.size() >= static_cast<size_t>(kSocketMaxPendingConnections)) {
        drop(oldest_pending());
      }
      In in;
      in.secret = secret_;
      if (!watch(fd, std::move(in)).ok()) continue;  // closed; a stranger's loss at worst
      pending_[fd] = Clock::now() + hello_timeout_;
      // The job's peers send the hello with the connect: read it now, so
      // that their connection is pending for no longer than that.
      MSI_RETURN_IF_ERROR(read_from(fd));
    }
  }

  void drop(int fd) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    incoming_.erase(fd);
    pending_.erase(fd);
    for (auto& p : peers_) {
      if (p.fd == fd) p.fd = kClosed;
    }
  }

  // Hands the parser's verdict on a connection's bytes on: completed writes
  // become completions; a violation drops the connection and names the peer.
  Status parsed(int fd, In& in, Status s) {
    for (uint32_t imm : imms_) done_.push_back({Completion::Kind::kRemoteWrite, imm, 0});
    imms_.clear();
    if (s.ok()) return s;
    if (!in.hello_done()) {
      // Not one of the job's processes (no secret, a port scan, a stray
      // client): dropped, and the job goes on.
      drop(fd);
      return ok_status();
    }
    const std::string who = name_of(in);
    drop(fd);
    return internal_error("socket transport: " + who + " " + s.message());
  }

  // Reads what the kernel has for one connection. Small messages
  // come in whole, header and payload, with one recv into a staging buffer
  // and are copied out (as MPI's tcp btl does up to its eager limit); the
  // rest of a large payload is received straight into the region.
  Status read_from(int fd) {
    In& in = incoming_[fd];
    while (true) {
      const bool direct = in.part == In::Part::kPayload && in.h.len - in.got >= kStaging;
      uint8_t* to = direct ? in.dst + in.got : staging_.data();
      const size_t want = direct ? in.h.len - in.got : kStaging;
      const ssize_t n = ::recv(fd, to, want, MSG_DONTWAIT);
      if (n <= 0 && !in.hello_done() &&
          !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
        // Closed or reset before its hello: a stranger (a port scan), not a
        // peer of the job that died.
        drop(fd);
        return ok_status();
      }
      if (n == 0) {
        // The writer closed: between messages that is a peer that finished.
        const bool between = in.between_messages();
        const std::string who = name_of(in);
        drop(fd);
        if (between || tolerate_) return ok_status();
        return Status(StatusCode::kUnavailable,
                      "socket transport: " + who + " closed its connection in the middle of a write (died?)");
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();
        if (errno == EINTR) continue;
        const std::string why = "socket transport: reading from " + name_of(in) + ": " +
                                errno_text(errno) + " (died?)";
        drop(fd);
        if (tolerate_) return ok_status();
        return Status(StatusCode::kUnavailable, why);
      }
      // A large read may have reopened a window that was (nearly) closed:
      // tell the writer now. Left to delayed ACKs, the update can wait until
      // the writer's tail-loss probe retransmits (>= 2 jiffies, 8 ms at
      // HZ=250): 2x2 256 KiB rounds stalled by 4-15 ms one-way, one run in
      // about four, each stall a TCPLossProbes count. After small reads it is
      // not needed, and costs: forcing ACKs after every read took 4x4 2 KiB
      // p50 from ~80 to ~105 us.
      if (static_cast<size_t>(n) >= kQuickAckAfter) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
      }
      if (direct) {
        in.got += static_cast<size_t>(n);
        if (in.got == in.h.len) MSI_RETURN_IF_ERROR(parsed(fd, in, in.part_done(regions_, &imms_)));
      } else {
        MSI_RETURN_IF_ERROR(
            parsed(fd, in, in.take(staging_.data(), static_cast<size_t>(n), regions_, &imms_)));
        if (incoming_.count(fd) == 0) return ok_status();  // dropped
        if (!pending_.empty() && in.hello_done()) pending_.erase(fd);
      }
      // Less than asked for: the socket is drained, and epoll (level-
      // triggered) reports it again when more comes; no recv to hear EAGAIN.
      if (static_cast<size_t>(n) < want) return ok_status();
    }
  }

  static constexpr size_t kStaging = 64 * 1024 + sizeof(Header);
  static constexpr size_t kQuickAckAfter = 64 * 1024;
  std::vector<uint8_t> staging_ = std::vector<uint8_t>(kStaging);
  int listen_fd_ = -1, epoll_fd_ = -1;
  std::string address_, secret_;
  std::chrono::milliseconds connect_timeout_{5000};
  bool tolerate_ = false;  // FabricOptions::tolerate_peer_loss
  using Clock = std::chrono::steady_clock;
  std::chrono::milliseconds hello_timeout_{5000};  // FabricOptions::hello_timeout_ms
  // Accepted connections without a hello yet: fd -> when they are closed.
  // At most kSocketMaxPendingConnections entries.
  std::map<int, Clock::time_point> pending_;
  Clock::time_point accept_paused_until_{};  // after EMFILE with nothing to close
  bool warned_fd_limit_ = false;
  uint64_t next_key_ = 0;
  internal::RegionTable regions_;
  std::vector<uint32_t> imms_;  // scratch for the parser
  std::vector<Peer> peers_;
  std::map<int, In> incoming_;
  std::deque<Completion> done_;
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> make_socket_transport(const FabricOptions& options) {
  auto t = std::make_unique<SocketTransport>();
  MSI_RETURN_IF_ERROR(t->init(options));
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace msinfer::comm
