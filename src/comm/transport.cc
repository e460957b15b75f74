#include <algorithm>
#include <cstring>

#include "msinfer/comm/direct_transport.h"
#include "msinfer/comm/inproc_transport.h"
#include "msinfer/comm/socket_transport.h"
#include "msinfer/core/mapped_file.h"

namespace msinfer::comm {

namespace {
constexpr TransportKind kAllTransports[] = {TransportKind::kDirect,      TransportKind::kSocket,
                                            TransportKind::kFabricShm,   TransportKind::kFabricTcp,
                                            TransportKind::kFabricVerbs, TransportKind::kFabricEfa};
}  // namespace

const char* transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kDirect:
      return "direct";
    case TransportKind::kSocket:
      return "socket";
    case TransportKind::kFabricShm:
      return "shm";
    case TransportKind::kFabricTcp:
      return "tcp";
    case TransportKind::kFabricVerbs:
      return "verbs";
    case TransportKind::kFabricEfa:
      return "efa";
  }
  return "?";
}

StatusOr<TransportKind> parse_transport(std::string_view name) {
  std::string names;
  for (TransportKind k : kAllTransports) {
    if (name == transport_name(k)) return k;
    names += std::string(names.empty() ? "" : ", ") + transport_name(k);
  }
  return invalid_argument("unknown provider '" + std::string(name) + "' (" + names + ")");
}

bool transport_within_host(TransportKind kind) {
  return kind == TransportKind::kDirect || kind == TransportKind::kFabricShm;
}

bool transport_is_msinfer(TransportKind kind) {
  return kind == TransportKind::kDirect || kind == TransportKind::kSocket;
}

StatusOr<std::unique_ptr<Transport>> make_transport(const FabricOptions& options) {
  switch (options.transport) {
    case TransportKind::kDirect:
      return make_direct_transport(options);
    case TransportKind::kSocket:
      return make_socket_transport(options);
    default:
      return make_fabric_transport(options);
  }
}

namespace {
// Zero pages the kernel maps at their first touch: a region as large as a
// KV pool costs neither memory nor time until it is used.
class ZeroMemory : public RegionMemory {
 public:
  explicit ZeroMemory(ZeroPages z) : z_(std::move(z)) {}
  uint8_t* data() override { return z_.data(); }
  size_t size() const override { return z_.size(); }

 private:
  ZeroPages z_;
};
}  // namespace

StatusOr<std::unique_ptr<RegionMemory>> Transport::allocate(size_t len) {
  MSI_ASSIGN_OR_RETURN(ZeroPages z, ZeroPages::allocate(std::max<size_t>(len, 1)));
  return std::unique_ptr<RegionMemory>(new ZeroMemory(std::move(z)));
}

class InprocTransport : public Transport {
 public:
  InprocTransport(InprocFabric* f, int index) : f_(f), index_(index) {}
  ~InprocTransport() override {
    std::lock_guard<std::mutex> lock(f_->mu_);
    f_->endpoints_[index_]->closed = true;
  }
  std::string name() const override { return "inproc"; }
  std::string address() const override { return std::to_string(index_); }

  StatusOr<RemoteRegion> register_memory(void* base, size_t len) override {
    std::lock_guard<std::mutex> lock(f_->mu_);
    RemoteRegion r;
    r.key = f_->next_key_++;
    r.base = 0;  // offset addressing
    r.length = len;
    f_->endpoints_[index_]->regions[r.key] = {static_cast<uint8_t*>(base), len};
    return r;
  }

  StatusOr<int> connect(const std::string& address) override {
    int peer = -1;
    try {
      peer = std::stoi(address);
    } catch (...) {
    }
    std::lock_guard<std::mutex> lock(f_->mu_);
    if (peer < 0 || peer >= static_cast<int>(f_->endpoints_.size())) {
      return not_found("inproc: no endpoint '" + address + "'");
    }
    return peer;
  }

  Status write(int peer, const void* src, size_t len, const RemoteRegion& dst, uint64_t offset,
               uint32_t imm, uint64_t context) override {
    std::lock_guard<std::mutex> lock(f_->mu_);
    MSI_RETURN_IF_ERROR(check_write("inproc", peer, f_->endpoints_.size(), len, dst, offset));
    auto& target = *f_->endpoints_[peer];
    if (target.closed) {
      return Status(StatusCode::kUnavailable, "inproc: peer " + std::to_string(peer) + " is gone");
    }
    auto it = target.regions.find(dst.key);
    if (it == target.regions.end() || !range_within(offset, len, it->second.len)) {
      return invalid_argument("inproc: write outside peer " + std::to_string(peer) + "'s region");
    }
    if (len > 0) std::memcpy(it->second.base + offset, src, len);
    target.completions.push_back({Completion::Kind::kRemoteWrite, imm, 0});
    f_->endpoints_[index_]->completions.push_back({Completion::Kind::kLocalWrite, 0, context});
    return ok_status();
  }

  Status poll(std::vector<Completion>* out, size_t max) override {
    std::lock_guard<std::mutex> lock(f_->mu_);
    auto& q = f_->endpoints_[index_]->completions;
    while (!q.empty() && max-- > 0) {
      out->push_back(q.front());
      q.pop_front();
    }
    return ok_status();
  }

 private:
  InprocFabric* f_;
  int index_;
};

std::unique_ptr<Transport> InprocFabric::endpoint() {
  std::lock_guard<std::mutex> lock(mu_);
  endpoints_.push_back(std::make_shared<Endpoint>());
  return std::make_unique<InprocTransport>(this, static_cast<int>(endpoints_.size()) - 1);
}

}  // namespace msinfer::comm
