#include "msinfer/comm/fabric_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <unordered_set>

#include "fabric_lazy.h"

namespace msinfer::comm {
namespace {

std::string fi_error(const char* what, int rc) {
  return std::string(what) + " failed: " + fi_strerror(-rc) + " (" + std::to_string(rc) + ")";
}

// shm endpoints are POSIX shared-memory objects (16 MiB each) that libfabric
// names "<pid>:<uid>:<index>" by default and creates with O_EXCL. A process that
// is killed leaves its object behind, and a later process that gets the same
// pid then cannot open an endpoint (fi_enable: EBUSY). So msinfer names its
// own: kShmPrefix + "<pid>-<16 hex digits>", and each new endpoint first
// removes the objects whose owner is gone.
constexpr const char* kShmPrefix = "msinfer-";
constexpr const char* kLiveSuffix = ".live";

// The token an object's name starts with ("msinfer-<pid>-<16 hex>"), or ""
// for a name msinfer did not make.
std::string token_of(const std::string& name) {
  const size_t plen = std::strlen(kShmPrefix);
  if (name.compare(0, plen, kShmPrefix) != 0) return "";
  size_t i = plen;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == plen || i >= name.size() || name[i] != '-') return "";
  const size_t hex = ++i;
  while (i < name.size() && std::isxdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i - hex != 16) return "";
  return name.substr(0, i);
}

// Whether a process holds the lock of `token`; with `keep_fd`, a lock this
// call took (the owner is gone) stays held and its fd is returned there.
bool token_alive(const std::string& token, int* keep_fd = nullptr) {
  const std::string live = "/dev/shm/" + token + kLiveSuffix;
  const int fd = ::open(live.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;  // no lock: nobody can vouch for the objects
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return true;  // held by its owner (EWOULDBLOCK): alive; any other error: assume so
  }
  if (keep_fd != nullptr) {
    *keep_fd = fd;
  } else {
    ::close(fd);
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<ShmOwner>> ShmOwner::create() {
  std::random_device rd;
  for (int attempt = 0; attempt < 8; ++attempt) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%d-%08x%08x", kShmPrefix, static_cast<int>(::getpid()), rd(),
                  rd());
    auto o = std::unique_ptr<ShmOwner>(new ShmOwner());
    o->name_ = buf;
    // Locked before it appears under its name (link), so no cleaner ever
    // sees the lock object unlocked while its owner lives.
    const std::string tmp = std::string("/dev/shm/.") + buf + ".tmp";
    const std::string live = "/dev/shm/" + o->name_ + kLiveSuffix;
    o->fd_ = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (o->fd_ < 0) {
      return Status(StatusCode::kUnavailable,
                    "shared memory: creating " + tmp + ": " + errno_text(errno));
    }
    const bool locked = ::flock(o->fd_, LOCK_EX | LOCK_NB) == 0;
    const int e = locked ? (::link(tmp.c_str(), live.c_str()) == 0 ? 0 : errno) : errno;
    ::unlink(tmp.c_str());
    if (e == EEXIST) continue;  // the same random name: take another
    if (e != 0)
      return Status(StatusCode::kUnavailable, "shared memory: lock " + live + ": " + errno_text(e));
    return o;
  }
  return internal_error("shared memory: no free object name after 8 tries");
}

ShmOwner::~ShmOwner() {
  if (fd_ >= 0) {
    ::unlink(("/dev/shm/" + name_ + kLiveSuffix).c_str());
    ::close(fd_);
  }
}

bool shm_owner_alive(const std::string& object_name) {
  const std::string token = token_of(object_name);
  return !token.empty() && token_alive(token);
}

void remove_dead_shm_endpoints() {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return;
  std::map<std::string, std::vector<std::string>> by_token;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string token = token_of(name);
    if (!token.empty()) by_token[token].push_back(name);
  }
  ::closedir(d);
  for (const auto& [token, names] : by_token) {
    int lock_fd = -1;
    if (token_alive(token, &lock_fd)) continue;
    // Its owner is gone (or never took a lock: an object of an older msinfer
    // or one a cleaner was removing): its objects first, the lock last.
    for (const std::string& n : names) {
      if (n != token + kLiveSuffix) ::shm_unlink(("/" + n).c_str());
    }
    if (lock_fd >= 0) {
      ::unlink(("/dev/shm/" + token + kLiveSuffix).c_str());
      ::close(lock_fd);
    }
  }
}

namespace {

// Context of one write: libfabric hands it back in the completion.
struct WriteOp {
  fi_context2 ctx;  // must be first (FI_CONTEXT / FI_CONTEXT2 modes)
  uint64_t user_context = 0;
  int peer = -1;
  bool is_recv = false;
};

class FabricTransport : public Transport {
 public:
  ~FabricTransport() override {
    for (auto* mr : mrs_) fi_close(&mr->fid);
    if (ep_) fi_close(&ep_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
    for (auto* op : ops_) delete op;
  }

  Status init(const FabricOptions& o) {
    write_timeout_ = std::chrono::milliseconds(o.write_timeout_ms);
    if (transport_is_msinfer(o.transport)) {
      return invalid_argument(std::string("libfabric: '") + transport_name(o.transport) +
                              "' is not a libfabric provider");
    }
    const std::string provider = transport_name(o.transport);
    if (o.transport == TransportKind::kFabricShm && std::getenv("FI_SHM_DISABLE_CMA") == nullptr) {
      const bool cma = o.shm_single_copy == FabricOptions::SingleCopy::kOn ||
                       o.max_message_bytes >= (1 << 20);
      ::setenv("FI_SHM_DISABLE_CMA", cma ? "0" : "1", 0);
    }
    fi_info* hints = fi_allocinfo();
    if (hints == nullptr) {
      const std::string why = fabric_load_error();
      return Status(StatusCode::kUnavailable,
                    "libfabric: " + (why.empty() ? std::string("out of memory") : why) +
                        "; try --fabric-provider direct or socket");
    }
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->fabric_attr->prov_name =
        strdup(o.transport == TransportKind::kFabricTcp ? "tcp;ofi_rxm" : provider.c_str());
    int rc = fi_getinfo(FI_VERSION(1, 9), o.address.empty() ? nullptr : o.address.c_str(),
                        nullptr, o.address.empty() ? 0 : FI_SOURCE, hints, &info_);
    fi_freeinfo(hints);
    if (rc != 0 || info_ == nullptr) {
      return Status(StatusCode::kUnavailable, "libfabric: no provider '" + provider +
                                                  "' with RDM endpoints, RMA writes and CQ data" +
                                                  (o.address.empty() ? "" : " on " + o.address) +
                                                  " (" + fi_strerror(-rc) +
                                                  "); try --fabric-provider shm or tcp");
    }
    provider_ = info_->fabric_attr->prov_name;
    if (info_->domain_attr->cq_data_size < 4) {
      return Status(StatusCode::kUnavailable, "libfabric " + provider_ + ": CQ data < 4 bytes");
    }
    mr_mode_ = info_->domain_attr->mr_mode;
    if ((rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr))) return internal_error(fi_error("fi_fabric", rc));
    if ((rc = fi_domain(fabric_, info_, &domain_, nullptr))) return internal_error(fi_error("fi_domain", rc));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.size = 4096;
    if ((rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr))) return internal_error(fi_error("fi_cq_open", rc));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((rc = fi_av_open(domain_, &av_attr, &av_, nullptr))) return internal_error(fi_error("fi_av_open", rc));
    if ((rc = fi_endpoint(domain_, info_, &ep_, nullptr))) return internal_error(fi_error("fi_endpoint", rc));
    if ((rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV))) return internal_error(fi_error("fi_ep_bind(cq)", rc));
    if ((rc = fi_ep_bind(ep_, &av_->fid, 0))) return internal_error(fi_error("fi_ep_bind(av)", rc));
    if (provider_ == "shm") {
      remove_dead_shm_endpoints();
      MSI_ASSIGN_OR_RETURN(shm_owner_, ShmOwner::create());
      const std::string shm_name = shm_owner_->name();
      if ((rc = fi_setname(&ep_->fid, const_cast<char*>(shm_name.c_str()), shm_name.size() + 1))) {
        return internal_error(fi_error("fi_setname", rc));
      }
    }
    if ((rc = fi_enable(ep_))) return internal_error(fi_error("fi_enable", rc));
    char name[256];
    size_t len = sizeof(name);
    if ((rc = fi_getname(&ep_->fid, name, &len))) return internal_error(fi_error("fi_getname", rc));
    address_.assign(name, len);
    rx_cq_data_ = (info_->rx_attr->mode & FI_RX_CQ_DATA) != 0;
    if (rx_cq_data_) {
      for (int i = 0; i < o.posted_receives; ++i) {
        auto* op = new WriteOp();
        op->is_recv = true;
        ops_.insert(op);
        MSI_RETURN_IF_ERROR(post_recv(op));
      }
    }
    return ok_status();
  }

  std::string name() const override { return "fabric:" + provider_; }
  std::string address() const override { return address_; }

  StatusOr<RemoteRegion> register_memory(void* base, size_t len) override {
    fid_mr* mr = nullptr;
    int rc = fi_mr_reg(domain_, base, len, FI_REMOTE_WRITE | FI_WRITE | FI_READ | FI_REMOTE_READ, 0,
                       next_key_++, 0, &mr, nullptr);
    if (rc) return internal_error(fi_error("fi_mr_reg", rc));
    if (mr_mode_ & FI_MR_ENDPOINT) {
      if ((rc = fi_mr_bind(mr, &ep_->fid, 0))) return internal_error(fi_error("fi_mr_bind", rc));
      if ((rc = fi_mr_enable(mr))) return internal_error(fi_error("fi_mr_enable", rc));
    }
    mrs_.push_back(mr);
    regions_[reinterpret_cast<uintptr_t>(base)] = {len, mr};
    RemoteRegion r;
    r.key = fi_mr_key(mr);
    // shm reports FI_MR_VIRT_ADDR: peers name target bytes by virtual address;
    // tcp/rxm reports 0: by offset. A wrong choice completes at the sender and
    // never at the target (a silent hang), so it follows the reported mode.
    r.base = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(base) : 0;
    r.length = len;
    return r;
  }

  StatusOr<int> connect(const std::string& address) override {
    fi_addr_t a;
    int rc = fi_av_insert(av_, address.data(), 1, &a, 0, nullptr);
    if (rc != 1) return Status(StatusCode::kUnavailable, fi_error("fi_av_insert", rc));
    peers_.push_back(a);
    return static_cast<int>(peers_.size()) - 1;
  }

  Status write(int peer, const void* src, size_t len, const RemoteRegion& dst, uint64_t offset,
               uint32_t imm, uint64_t context) override {
    MSI_RETURN_IF_ERROR(check_write("fabric", peer, peers_.size(), len, dst, offset));
    void* desc = nullptr;
    if (mr_mode_ & FI_MR_LOCAL) {
      fid_mr* mr = find_mr(src, len);
      if (mr == nullptr) return invalid_argument("fabric: write source is not registered memory");
      desc = fi_mr_desc(mr);
    }
    WriteOp* op = take_op();
    op->user_context = context;
    op->peer = peer;
    const auto deadline = std::chrono::steady_clock::now() + write_timeout_;
    while (true) {
      ssize_t rc = fi_writedata(ep_, src, len, desc, imm, peers_[peer], dst.base + offset, dst.key,
                                &op->ctx);
      if (rc == 0) return ok_status();
      if (rc != -FI_EAGAIN) {
        free_.push_back(op);
        return Status(StatusCode::kUnavailable,
                      "fabric: write to peer " + std::to_string(peer) + ": " +
                          fi_error("fi_writedata", static_cast<int>(rc)));
      }
      // Progress is manual: completions must be read for the provider to make room.
      Status p = progress();
      if (!p.ok() || std::chrono::steady_clock::now() > deadline) {
        free_.push_back(op);
        return p.ok() ? Status(StatusCode::kUnavailable,
                               "fabric (" + provider_ + "): peer " + std::to_string(peer) +
                                   " accepted no write for " +
                                   std::to_string(write_timeout_.count()) + " ms (gone?)")
                      : p;
      }
      sched_yield();
    }
  }

  Status poll(std::vector<Completion>* out, size_t max) override {
    MSI_RETURN_IF_ERROR(progress());
    while (!pending_.empty() && max-- > 0) {
      out->push_back(pending_.front());
      pending_.pop_front();
    }
    return ok_status();
  }

 private:
  Status post_recv(WriteOp* op) {
    while (true) {
      ssize_t rc = fi_recv(ep_, nullptr, 0, nullptr, FI_ADDR_UNSPEC, &op->ctx);
      if (rc == 0) return ok_status();
      if (rc != -FI_EAGAIN) return internal_error(fi_error("fi_recv", static_cast<int>(rc)));
      fi_cq_data_entry e[16];
      fi_cq_read(cq_, e, 0);  // progress only
    }
  }

  // Reads the CQ into pending_. Incoming immediates and our own write
  // completions are told apart by op_context (flags are not reliable across
  // providers).
  Status progress() {
    fi_cq_data_entry e[64];
    while (true) {
      ssize_t n = fi_cq_read(cq_, e, 64);
      if (n == -FI_EAGAIN) return ok_status();
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(cq_, &err, 0);
        auto* op = static_cast<WriteOp*>(err.op_context);
        if (!owned(op)) op = nullptr;
        std::string who = op && !op->is_recv ? "peer " + std::to_string(op->peer) : "a peer";
        char buf[256] = {0};
        const char* prov = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
        return Status(StatusCode::kUnavailable, "fabric (" + provider_ + "): write to " + who +
                                                    " failed: " + fi_strerror(err.err) + " [" +
                                                    (prov ? prov : "") + "]");
      }
      if (n < 0) return internal_error(fi_error("fi_cq_read", static_cast<int>(n)));
      for (ssize_t i = 0; i < n; ++i) {
        // op_context of a remote write's completion is whatever the provider
        // left there (shm: not a pointer of this process), so it is looked up
        // among our operations before it is dereferenced.
        auto* op = static_cast<WriteOp*>(e[i].op_context);
        if (!owned(op)) op = nullptr;
        if (op != nullptr && !op->is_recv) {
          pending_.push_back({Completion::Kind::kLocalWrite, 0, op->user_context});
          free_.push_back(op);
        } else {
          pending_.push_back({Completion::Kind::kRemoteWrite, static_cast<uint32_t>(e[i].data), 0});
          if (op != nullptr) MSI_RETURN_IF_ERROR(post_recv(op));
        }
      }
    }
  }

  bool owned(WriteOp* op) const { return ops_.count(op) != 0; }

  WriteOp* take_op() {
    if (free_.empty()) {
      auto* op = new WriteOp();
      ops_.insert(op);
      return op;
    }
    WriteOp* op = free_.back();
    free_.pop_back();
    return op;
  }

  fid_mr* find_mr(const void* p, size_t len) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return nullptr;
    --it;
    if (a + len > it->first + it->second.first) return nullptr;
    return it->second.second;
  }

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::unique_ptr<ShmOwner> shm_owner_;  // shm: names the endpoint's object, proves we live
  uint64_t mr_mode_ = 0;
  uint64_t next_key_ = 1;
  bool rx_cq_data_ = false;
  std::string provider_, address_;
  std::vector<fid_mr*> mrs_;
  std::map<uintptr_t, std::pair<size_t, fid_mr*>> regions_;
  std::vector<fi_addr_t> peers_;
  // Every op we made (writes and pre-posted receives): owned here, and what
  // tells our completions from a provider's stale op_context.
  std::unordered_set<WriteOp*> ops_;
  std::vector<WriteOp*> free_;
  std::deque<Completion> pending_;
  std::chrono::milliseconds write_timeout_{5000};
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> make_fabric_transport(const FabricOptions& options) {
  auto t = std::make_unique<FabricTransport>();
  MSI_RETURN_IF_ERROR(t->init(options));
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace msinfer::comm
