#include "msinfer/comm/direct_transport.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <new>

namespace msinfer::comm {
namespace {

constexpr uint64_t kMagic = 0x6d73696e66646972ull;  // "msinfdir"
constexpr uint32_t kLinks = 256;                    // senders one receiver takes writes from
constexpr uint64_t kRingCells = 512;                // immediates in flight per link; power of two

// One sender's queue of immediates to one receiver: a single-producer,
// single-consumer ring. Only the producer stores `tail` and the cells, only
// the consumer `head`, so a producer that dies at any instruction leaves its
// own link short of (at most) the immediate it was posting, and every other
// link as it was. (A ring shared by all senders, claimed with a CAS and
// published per cell, left a hole that blocked the receiver for everyone
// when a sender died between the two; NCCL's shared-memory FIFOs and
// libfabric shm's per-peer queues are per pair for the same reason.)
struct Link {
  alignas(64) std::atomic<uint64_t> tail;  // written by the producer (release, after the data)
  int64_t pid;                             // the producer's, for messages
  alignas(64) std::atomic<uint64_t> head;  // written by the consumer
  alignas(64) uint32_t cells[kRingCells];
};

// The receiver's mailbox: kLinks links, handed out in order to the senders
// that connect (links_claimed counts them; a link is never reused).
struct Mailbox {
  uint64_t magic;
  int64_t pid;
  alignas(64) std::atomic<uint32_t> links_claimed;
  Link links[kLinks];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "mailbox atomics must be address-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "mailbox atomics must be address-free");

// A whole shared-memory object, mapped.
struct Mapping {
  uint8_t* p = nullptr;
  size_t n = 0;
};

// Creates the object `name` with `create_bytes` (its pages reserved with
// posix_fallocate, so a full /dev/shm is an error here rather than a SIGBUS
// at the first store) or, with create_bytes == 0, opens an existing one; maps
// all of it. A created object is unlinked again if anything fails.
StatusOr<Mapping> map_object(const std::string& name, size_t create_bytes) {
  const std::string path = "/" + name;
  const bool create = create_bytes > 0;
  const int fd = ::shm_open(path.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return Status(StatusCode::kUnavailable, "direct: shm_open(" + name + "): " + errno_text(errno));
  size_t n = create_bytes;
  int rc = 0;
  if (create) {
    rc = ::ftruncate(fd, static_cast<off_t>(n)) == 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(n)) : errno;
  } else {
    struct stat st {};
    rc = ::fstat(fd, &st) == 0 ? 0 : errno;
    n = static_cast<size_t>(st.st_size);
  }
  void* p = rc == 0 ? ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (rc == 0 && p == MAP_FAILED) rc = errno;
  ::close(fd);
  if (rc == 0) return Mapping{static_cast<uint8_t*>(p), n};
  if (!create) return Status(StatusCode::kUnavailable, "direct: mapping " + name + ": " + errno_text(rc));
  ::shm_unlink(path.c_str());
  return Status(StatusCode::kResourceExhausted,
                "direct: a " + std::to_string(n) + "-byte object in /dev/shm (" + name + "): " +
                    errno_text(rc) + "; make /dev/shm larger or use another transport (socket, shm)");
}

// Maps the mailbox object `name`; creates and initialises it when `create`.
StatusOr<Mailbox*> map_mailbox(const std::string& name, bool create) {
  MSI_ASSIGN_OR_RETURN(Mapping map, map_object(name, create ? sizeof(Mailbox) : 0));
  auto* m = reinterpret_cast<Mailbox*>(map.p);
  if (create) {
    // The object is zero-filled (ftruncate): every link empty, none claimed.
    m->pid = ::getpid();
    std::atomic_thread_fence(std::memory_order_release);
    m->magic = kMagic;
  } else if (map.n != sizeof(Mailbox) || m->magic != kMagic) {
    ::munmap(map.p, map.n);
    return Status(StatusCode::kUnavailable, "direct: " + name + " is not an msinfer direct-transport mailbox");
  }
  return m;
}

// Copies into a peer's region. From 32 KiB on, with non-temporal (streaming)
// stores: they go to memory without first taking each destination line from
// the cache that holds it, which is the receiver's (it read the slot last
// time). When the two processes' cores share no cache (on this VM: whenever
// the hypervisor puts the vCPUs on different CCDs), a plain memcpy paid a
// cross-cache transfer per line: bench m2n 1x1 256 KiB p50 54-90 us, against
// 10 us streaming; with a shared cache 7.4 vs 9.9 us; 4x4 2 MiB 2252 vs
// 1249 us.
constexpr size_t kStreamingCopyBytes = 32 * 1024;

void copy_to_peer(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamingCopyBytes) {
    const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    const size_t body = n & ~static_cast<size_t>(63);
    for (size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + body, src + body, n - body);
    _mm_sfence();  // the stores are visible before the immediate is published
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// The producer's side: stores `imm` and publishes it (after the data the
// caller wrote); false when the link is full. `head_seen` is the producer's
// last reading of the consumer's head: the head's cache line (written by the
// receiver) is read again only when the ring looks full, not on every post.
bool try_post(Link* l, uint64_t* head_seen, uint32_t imm) {
  const uint64_t t = l->tail.load(std::memory_order_relaxed);  // ours alone
  if (t - *head_seen >= kRingCells) {
    *head_seen = l->head.load(std::memory_order_acquire);
    if (t - *head_seen >= kRingCells) return false;
  }
  l->cells[t & (kRingCells - 1)] = imm;
  l->tail.store(t + 1, std::memory_order_release);
  return true;
}

// The transport's record of its live region objects: base -> (bytes, n).
using ObjectIndex = std::map<uintptr_t, std::pair<size_t, uint64_t>>;

// A receive region: a shared-memory object of its own, unlinked when freed.
class SharedRegion : public RegionMemory {
 public:
  SharedRegion(std::string name, uint8_t* p, size_t n, std::shared_ptr<ObjectIndex> index,
               std::shared_ptr<ShmOwner> owner)
      : name_(std::move(name)), p_(p), n_(n), index_(std::move(index)), owner_(std::move(owner)) {}
  ~SharedRegion() override {
    index_->erase(reinterpret_cast<uintptr_t>(p_));
    ::munmap(p_, n_);
    ::shm_unlink(("/" + name_).c_str());
  }
  uint8_t* data() override { return p_; }
  size_t size() const override { return n_; }

 private:
  std::string name_;
  uint8_t* p_;
  size_t n_;
  std::shared_ptr<ObjectIndex> index_;
  std::shared_ptr<ShmOwner> owner_;  // the lock outlives the object
};

class DirectTransport : public Transport {
 public:
  ~DirectTransport() override {
    for (auto& p : peers_) {
      ::munmap(p.mailbox, sizeof(Mailbox));
      for (auto& [key, m] : p.regions) ::munmap(m.p, m.n);
    }
    if (mine_ != nullptr) ::munmap(mine_, sizeof(Mailbox));
    if (!name_.empty()) ::shm_unlink(("/" + name_).c_str());
  }

  Status init(const FabricOptions& o) {
    write_timeout_ = std::chrono::milliseconds(o.write_timeout_ms);
    remove_dead_shm_endpoints();
    MSI_ASSIGN_OR_RETURN(owner_, ShmOwner::create());
    name_ = owner_->name();
    auto m = map_mailbox(name_, true);
    if (!m.ok()) {
      name_.clear();
      return m.status();
    }
    mine_ = *m;
    return ok_status();
  }

  std::string name() const override { return "direct"; }
  std::string address() const override { return "direct:" + std::to_string(::getpid()) + ":" + name_; }

  StatusOr<std::unique_ptr<RegionMemory>> allocate(size_t len) override {
    const uint64_t n = ++objects_;
    const std::string name = region_name(name_, n);
    MSI_ASSIGN_OR_RETURN(Mapping map, map_object(name, std::max<size_t>(len, 1)));
    (*objects_at_)[reinterpret_cast<uintptr_t>(map.p)] = {map.n, n};
    return std::unique_ptr<RegionMemory>(new SharedRegion(name, map.p, map.n, objects_at_, owner_));
  }

  StatusOr<RemoteRegion> register_memory(void* base, size_t len) override {
    RemoteRegion r;
    r.length = len;
    const uintptr_t a = reinterpret_cast<uintptr_t>(base);
    auto it = objects_at_->upper_bound(a);
    if (it != objects_at_->begin() && a + len <= std::prev(it)->first + std::prev(it)->second.first) {
      --it;
      r.key = it->second.second;  // peers map object n and write at this offset
      r.base = a - it->first;
    } else {
      r.key = 0;  // not shared memory: a source of writes only, peers cannot write it
      r.base = 0;
    }
    return r;
  }

  StatusOr<int> connect(const std::string& address) override {
    const size_t a = address.find(':'), b = address.find(':', a + 1);
    if (address.rfind("direct:", 0) != 0 || b == std::string::npos) {
      return invalid_argument("direct: '" + address +
                              "' is not a direct-transport address (direct:<pid>:<mailbox>)");
    }
    const pid_t pid = static_cast<pid_t>(std::atoll(address.substr(a + 1, b - a - 1).c_str()));
    auto mapped = map_mailbox(address.substr(b + 1), false);
    if (!mapped.ok() && owner_gone(address.substr(b + 1))) {
      return Status(StatusCode::kUnavailable, "direct: the endpoint at " + address + " is gone (" +
                                                  mapped.status().message() + ")");
    }
    MSI_ASSIGN_OR_RETURN(Mailbox * m, std::move(mapped));
    if (m->pid != pid) {
      ::munmap(m, sizeof(Mailbox));
      return Status(StatusCode::kUnavailable, "direct: mailbox of " + address + " belongs to pid " +
                                                  std::to_string(m->pid));
    }
    // Our own link into that mailbox. A claim is one fetch_add: a process
    // that dies around it leaves at most one unused link behind.
    const uint32_t k = m->links_claimed.fetch_add(1, std::memory_order_relaxed);
    if (k >= kLinks) {
      ::munmap(m, sizeof(Mailbox));
      return Status(StatusCode::kResourceExhausted,
                    "direct: the mailbox of " + address + " has no free link (" +
                        std::to_string(kLinks) + " senders have connected to it)");
    }
    Link* link = &m->links[k];
    link->pid = ::getpid();
    peers_.push_back({pid, address.substr(b + 1), m, link, 0, {}});
    return static_cast<int>(peers_.size()) - 1;
  }

  Status write(int peer, const void* src, size_t len, const RemoteRegion& dst, uint64_t offset,
               uint32_t imm, uint64_t context) override {
    MSI_RETURN_IF_ERROR(check_write("direct", peer, peers_.size(), len, dst, offset));
    Peer& p = peers_[peer];
    // Peers write only into shared-memory objects their owner allocated.
    // (Memory registered otherwise was once written with process_vm_writev,
    // which needed every process to let any other ptrace it; nothing used it.)
    if (dst.key == 0) {
      return invalid_argument("direct: peer " + std::to_string(peer) +
                              "'s region is not shared memory (registered without "
                              "Transport::allocate); the direct transport cannot write into it");
    }
    auto it = p.regions.find(dst.key);
    if (it == p.regions.end()) {
      auto m = map_object(region_name(p.mailbox_name, dst.key), 0);
      // A dead peer's objects may already be gone (any new endpoint on the
      // machine removes them): name the peer, not the missing object.
      if (!m.ok()) return owner_gone(p.mailbox_name) ? peer_gone(peer) : m.status();
      it = p.regions.emplace(dst.key, *m).first;
    }
    // dst comes from the peer's bootstrap blob: no sum that can wrap.
    if (dst.base > it->second.n || !range_within(offset, len, it->second.n - dst.base)) {
      return invalid_argument("direct: write beyond peer " + std::to_string(peer) +
                              "'s region object");
    }
    copy_to_peer(it->second.p + dst.base + offset, static_cast<const uint8_t*>(src), len);
    // The data is in place; now the immediate. The link holds kRingCells, far
    // more than M2N's flow control lets be outstanding, so a full one means
    // the receiver stopped taking them.
    const auto deadline = std::chrono::steady_clock::now() + write_timeout_;
    while (!try_post(p.link, &p.head_seen, imm)) {
      if (!shm_owner_alive(p.mailbox_name)) return peer_gone(peer);
      if (std::chrono::steady_clock::now() > deadline) {
        return Status(StatusCode::kUnavailable,
                      "direct: peer " + std::to_string(peer) + " took no immediate for " +
                          std::to_string(write_timeout_.count()) + " ms (mailbox full)");
      }
      sched_yield();
    }
    local_.push_back(context);
    return ok_status();
  }

  Status poll(std::vector<Completion>* out, size_t max) override {
    while (max > 0 && !local_.empty()) {
      out->push_back({Completion::Kind::kLocalWrite, 0, local_.front()});
      local_.pop_front();
      --max;
    }
    // Every claimed link, from where the last poll stopped (so a busy link
    // cannot starve the others when `max` cuts a poll short). A link's tail is
    // whatever its producer stored: anything beyond kRingCells ahead of the
    // head reads stale cells (bad immediates, refused by M2N), never outside
    // the ring.
    const uint32_t n = std::min(mine_->links_claimed.load(std::memory_order_acquire), kLinks);
    if (heads_.size() < n) heads_.resize(n, 0);
    for (uint32_t i = 0; i < n && max > 0; ++i) {
      const uint32_t k = (next_link_ + i) % n;
      Link& l = mine_->links[k];
      uint64_t h = heads_[k];
      const uint64_t t = l.tail.load(std::memory_order_acquire);
      if (t == h) continue;
      while (h != t && max > 0) {
        out->push_back({Completion::Kind::kRemoteWrite, l.cells[h & (kRingCells - 1)], 0});
        ++h;
        --max;
      }
      heads_[k] = h;
      l.head.store(h, std::memory_order_release);
      if (max == 0) next_link_ = (k + 1) % n;
    }
    return ok_status();
  }

 private:
  // Whether the owner of the mailbox `mailbox` is dead or its objects are
  // being removed. A cleaner holds a dead owner's lock while it unlinks the
  // objects (the lock last), so in that moment the lock reads as held; but a
  // live owner unlinks its mailbox only as it closes.
  static bool owner_gone(const std::string& mailbox) {
    return !shm_owner_alive(mailbox) || ::access(("/dev/shm/" + mailbox).c_str(), F_OK) != 0;
  }
  Status peer_gone(int peer) const {
    return Status(StatusCode::kUnavailable, "direct: peer " + std::to_string(peer) + " (pid " +
                                                std::to_string(peers_[peer].pid) + ") is gone");
  }
  static std::string region_name(const std::string& mailbox, uint64_t n) {
    return mailbox + "-r" + std::to_string(n);
  }
  struct Peer {
    pid_t pid;
    std::string mailbox_name;
    Mailbox* mailbox;
    Link* link;                           // ours in that mailbox
    uint64_t head_seen = 0;               // the link's head when we last looked
    std::map<uint64_t, Mapping> regions;  // mapped on first write
  };
  std::shared_ptr<ShmOwner> owner_;  // our objects' name and liveness lock; regions share it
  std::string name_;
  Mailbox* mine_ = nullptr;
  std::vector<uint64_t>
      heads_;  // consumer positions of mine_'s links (the shared copy is for producers)
  uint32_t next_link_ = 0;
  std::vector<Peer> peers_;
  uint64_t objects_ = 0;
  std::shared_ptr<ObjectIndex> objects_at_ = std::make_shared<ObjectIndex>();
  std::deque<uint64_t> local_;  // writes done, completions not yet polled
  std::chrono::milliseconds write_timeout_{5000};
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> make_direct_transport(const FabricOptions& options) {
  auto t = std::make_unique<DirectTransport>();
  MSI_RETURN_IF_ERROR(t->init(options));
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace msinfer::comm
