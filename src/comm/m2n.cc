#include "msinfer/comm/m2n.h"

#include <sched.h>

#include <cstdlib>
#include <cstring>

namespace msinfer::comm {

uint32_t Immediate::pack() const {
  return (static_cast<uint32_t>(channel & 1) << 31) | (static_cast<uint32_t>(sender & 0x7f) << 24) |
         (static_cast<uint32_t>(slot & 0xf) << 20) | ((seq & 0xf) << 16) | (rows & 0xffff);
}

Immediate Immediate::unpack(uint32_t v) {
  Immediate i;
  i.channel = static_cast<int>(v >> 31);
  i.sender = static_cast<int>((v >> 24) & 0x7f);
  i.slot = static_cast<int>((v >> 20) & 0xf);
  i.seq = (v >> 16) & 0xf;
  i.rows = v & 0xffff;
  return i;
}

Status M2NShape::validate() const {
  if (senders < 1 || senders > 128) return invalid_argument("M2N: senders must be in 1..128");
  if (receivers < 1) return invalid_argument("M2N: receivers must be >= 1");
  if (slots < 1 || slots > 16) return invalid_argument("M2N: slots must be in 1..16");
  if (max_rows < 0 || max_rows > 65535)
    return invalid_argument("M2N: max_rows must be in 0..65535");
  if (row_bytes < 1) return invalid_argument("M2N: row_bytes must be >= 1");
  if (channel < 0 || channel > 1) return invalid_argument("M2N: channel must be 0 or 1");
  return ok_status();
}

uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// ---- endpoint ----

M2NEndpoint::M2NEndpoint(std::unique_ptr<Transport> t, std::chrono::milliseconds timeout)
    : t_(std::move(t)), timeout_(timeout), receivers_(2, nullptr), senders_(2, nullptr) {}

M2NEndpoint::~M2NEndpoint() {
  if (abandon_) (void)t_.release();  // deliberately leaked: see abandon()
}

Status M2NEndpoint::progress(size_t* n) {
  scratch_.clear();
  MSI_RETURN_IF_ERROR(t_->poll(&scratch_, 256));
  if (n != nullptr) *n = scratch_.size();
  for (const Completion& c : scratch_) {
    if (c.kind == Completion::Kind::kRemoteWrite) {
      const Immediate imm = Immediate::unpack(c.imm);
      M2NReceiver* r = receivers_[imm.channel];
      if (r == nullptr) {
        return internal_error("M2N: a write arrived on channel " + std::to_string(imm.channel) +
                              " which this process does not receive");
      }
      MSI_RETURN_IF_ERROR(r->on_immediate(imm));
    } else {
      const int channel = static_cast<int>(c.context >> 32);
      const int slot = static_cast<int>(c.context & 0xffffffff);
      M2NSender* s = channel < 2 ? senders_[channel] : nullptr;
      if (s == nullptr || slot >= s->shape_.slots) {
        return internal_error("M2N: local completion with unknown context");
      }
      --s->in_flight_[slot];
    }
  }
  return ok_status();
}

void M2NEndpoint::relax(int64_t idle_polls) const {
  if (yield_when_idle_ && idle_polls > spins_before_yield_) {
    sched_yield();  // let the peer (and the kernel's loopback) run
  } else {
    cpu_relax();
  }
}

Status M2NEndpoint::wait_until(const std::function<bool()>& done,
                               const std::function<std::string()>& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  int idle = 0;
  while (!done()) {
    MSI_RETURN_IF_ERROR(progress());
    if (done()) break;
    if (scratch_.empty()) {
      relax(++idle);
    } else {
      idle = 0;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    what() + " (timed out after " + std::to_string(timeout_.count()) + " ms)");
    }
  }
  return ok_status();
}

// ---- receiver ----

M2NReceiver::M2NReceiver(const M2NShape& shape, int index)
    : shape_(shape),
      index_(index),
      arrivals_(static_cast<size_t>(shape.slots * shape.senders)),
      dropped_(static_cast<size_t>(shape.senders), 0) {}

StatusOr<RemoteRegion> M2NReceiver::attach(M2NEndpoint& ep) {
  MSI_RETURN_IF_ERROR(shape_.validate());
  ep_ = &ep;
  ep.receivers_[shape_.channel] = this;
  MSI_ASSIGN_OR_RETURN(region_, ep.transport().allocate(static_cast<size_t>(
                                    shape_.senders * shape_.slots * shape_.slot_bytes())));
  return ep.transport().register_memory(region_->data(), region_->size());
}

Status M2NReceiver::on_immediate(const Immediate& imm) {
  if (imm.sender >= shape_.senders || imm.slot >= shape_.slots) {
    return internal_error("M2N receiver " + std::to_string(index_) + ": write from sender " +
                          std::to_string(imm.sender) + " for slot " + std::to_string(imm.slot) +
                          " is outside the configured " + std::to_string(shape_.senders) +
                          " senders x " + std::to_string(shape_.slots) + " slots");
  }
  if (dropped(imm.sender)) return ok_status();  // written before it died
  Arrival& a = arrivals_[imm.slot * shape_.senders + imm.sender];
  if (a.arrived) {
    return internal_error("M2N receiver " + std::to_string(index_) + ": sender " +
                          std::to_string(imm.sender) + " wrote slot " + std::to_string(imm.slot) +
                          " again before it was released (flow control broken)");
  }
  a = {true, imm.seq, imm.rows};
  return ok_status();
}

bool M2NReceiver::all_arrived(int slot) const {
  for (int s = 0; s < shape_.senders; ++s) {
    if (!arrivals_[slot * shape_.senders + s].arrived && !dropped(s)) return false;
  }
  return true;
}

std::vector<int> M2NReceiver::missing(int slot) const {
  std::vector<int> m;
  for (int s = 0; s < shape_.senders; ++s) {
    if (!arrivals_[slot * shape_.senders + s].arrived && !dropped(s)) m.push_back(s);
  }
  return m;
}

Status M2NReceiver::wait(int slot, uint32_t seq, const std::function<Status()>& between_polls) {
  if (slot < 0 || slot >= shape_.slots) {
    return invalid_argument("M2N wait: slot " + std::to_string(slot) + " out of range");
  }
  auto describe = [&] {
    std::string m;
    for (int s : missing(slot)) m += (m.empty() ? "" : ", ") + std::to_string(s);
    return "M2N receiver " + std::to_string(index_) + " (channel " +
           std::to_string(shape_.channel) + "): slot " + std::to_string(slot) + " seq " +
           std::to_string(seq) + " still waiting for sender(s) " + m;
  };
  Status hook = ok_status();
  int64_t polls = 0;
  MSI_RETURN_IF_ERROR(ep_->wait_until(
      [&] {
        if (all_arrived(slot)) return true;
        if (between_polls && (++polls & 63) == 0) {
          hook = between_polls();
          if (!hook.ok()) return true;
        }
        return all_arrived(slot);
      },
      describe));
  MSI_RETURN_IF_ERROR(hook);
  return verify(slot, seq);
}

Status M2NReceiver::verify(int slot, uint32_t seq) const {
  for (int s = 0; s < shape_.senders; ++s) {
    if (dropped(s)) continue;
    const Arrival& a = arrivals_[slot * shape_.senders + s];
    if (a.seq != (seq & 0xf)) {
      return internal_error("M2N receiver " + std::to_string(index_) + ": stale write in slot " +
                            std::to_string(slot) + " from sender " + std::to_string(s) + " (seq " +
                            std::to_string(a.seq) + ", expected " + std::to_string(seq & 0xf) +
                            ")");
    }
    if (a.rows > shape_.max_rows) {
      return internal_error("M2N receiver: sender " + std::to_string(s) + " sent " +
                            std::to_string(a.rows) + " rows, more than the slot holds");
    }
    if (shape_.checksum) {
      const uint8_t* d = data(slot, s);
      uint64_t want;
      std::memcpy(&want, d + a.rows * shape_.row_bytes, 8);
      if (fnv1a64(d, a.rows * shape_.row_bytes) != want) {
        return internal_error("M2N receiver " + std::to_string(index_) +
                              ": checksum mismatch in slot " + std::to_string(slot) +
                              " from sender " + std::to_string(s) + " (" + std::to_string(a.rows) +
                              " rows): corrupted payload");
      }
    }
  }
  return ok_status();
}

const uint8_t* M2NReceiver::data(int slot, int sender) const {
  return region_->data() +
         (static_cast<size_t>(sender) * shape_.slots + slot) * shape_.slot_bytes();
}

int64_t M2NReceiver::rows(int slot, int sender) const {
  return dropped(sender) ? 0 : arrivals_[slot * shape_.senders + sender].rows;
}

void M2NReceiver::release(int slot) {
  for (int s = 0; s < shape_.senders; ++s) arrivals_[slot * shape_.senders + s].arrived = false;
}

void M2NReceiver::drop_sender(int s) {
  if (s < 0 || s >= shape_.senders) return;
  dropped_[static_cast<size_t>(s)] = 1;
  for (int k = 0; k < shape_.slots; ++k) arrivals_[k * shape_.senders + s].arrived = false;
}

void M2NReceiver::restore_sender(int s) {
  if (s < 0 || s >= shape_.senders) return;
  dropped_[static_cast<size_t>(s)] = 0;
  for (int k = 0; k < shape_.slots; ++k) arrivals_[k * shape_.senders + s].arrived = false;
}

// ---- sender ----

M2NSender::M2NSender(const M2NShape& shape, int index)
    : shape_(shape),
      index_(index),
      buffer_(static_cast<size_t>(shape.receivers * shape.slots * shape.slot_bytes())),
      peers_(shape.receivers, -1),
      regions_(shape.receivers),
      in_flight_(shape.slots, 0),
      dropped_(static_cast<size_t>(shape.receivers), 0) {}

Status M2NSender::attach(M2NEndpoint& ep) {
  MSI_RETURN_IF_ERROR(shape_.validate());
  if (index_ < 0 || index_ >= shape_.senders) {
    return invalid_argument("M2N sender index " + std::to_string(index_) + " out of range");
  }
  ep_ = &ep;
  ep.senders_[shape_.channel] = this;
  auto r = ep.transport().register_memory(buffer_.data(), buffer_.size());
  return r.ok() ? ok_status() : r.status();
}

void M2NSender::set_receiver(int r, int peer, const RemoteRegion& region) {
  peers_[r] = peer;
  regions_[r] = region;
}

uint8_t* M2NSender::buffer(int slot, int receiver) {
  return buffer_.data() +
         (static_cast<size_t>(receiver) * shape_.slots + slot) * shape_.slot_bytes();
}

Status M2NSender::send(int slot, uint32_t seq, const std::vector<int64_t>& rows) {
  // Everything is checked before the first write goes out.
  if (slot < 0 || slot >= shape_.slots) {
    return invalid_argument("M2N send: slot " + std::to_string(slot) + " out of range 0.." +
                            std::to_string(shape_.slots - 1));
  }
  if (static_cast<int>(rows.size()) != shape_.receivers) {
    return invalid_argument("M2N send: " + std::to_string(rows.size()) + " row counts for " +
                            std::to_string(shape_.receivers) + " receivers");
  }
  for (int r = 0; r < shape_.receivers; ++r) {
    if (rows[r] < 0 || rows[r] > shape_.max_rows) {
      return invalid_argument("M2N send: " + std::to_string(rows[r]) + " rows for receiver " +
                              std::to_string(r) + " exceed the slot's capacity of " +
                              std::to_string(shape_.max_rows));
    }
    if (peers_[r] < 0 && !dropped(r)) {
      return invalid_argument("M2N send: receiver " + std::to_string(r) + " is not connected");
    }
  }
  if (in_flight_[slot] > 0) {
    return failed_precondition("M2N send: slot " + std::to_string(slot) +
                               " still has writes in flight");
  }
  const uint64_t context =
      (static_cast<uint64_t>(shape_.channel) << 32) | static_cast<uint32_t>(slot);
  for (int r = 0; r < shape_.receivers; ++r) {
    if (dropped(r)) continue;
    uint8_t* src = buffer(slot, r);
    size_t len = static_cast<size_t>(rows[r] * shape_.row_bytes);
    if (shape_.checksum) {
      const uint64_t h = fnv1a64(src, len);
      std::memcpy(src + len, &h, 8);
      len += 8;
    }
    Immediate imm{shape_.channel, index_, slot, seq & 0xf, static_cast<uint32_t>(rows[r])};
    const uint64_t offset =
        (static_cast<uint64_t>(index_) * shape_.slots + slot) * shape_.slot_bytes();
    ++in_flight_[slot];
    Status s =
        ep_->transport().write(peers_[r], src, len, regions_[r], offset, imm.pack(), context);
    if (!s.ok()) {
      --in_flight_[slot];
      return s.with_context("M2N sender " + std::to_string(index_) + " -> receiver " +
                            std::to_string(r));
    }
  }
  return ok_status();
}

void M2NSender::drop_receiver(int r) {
  if (r >= 0 && r < shape_.receivers) dropped_[static_cast<size_t>(r)] = 1;
}

void M2NSender::restore_receiver(int r) {
  if (r >= 0 && r < shape_.receivers) dropped_[static_cast<size_t>(r)] = 0;
}

Status M2NSender::wait_sent(int slot) {
  return ep_->wait_until([&] { return in_flight_[slot] == 0; },
                         [&] {
                           return "M2N sender " + std::to_string(index_) + ": slot " +
                                  std::to_string(slot) + " writes not completed";
                         });
}

}  // namespace msinfer::comm
