// CPU feature detection and the choice of the active kernel level (isa.h).
#include "msinfer/kernels/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "internal/level.h"
#include "msinfer/core/logging.h"

namespace msinfer::kernels::cpu {
namespace {

constexpr const char* kNames[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};

bool bit(unsigned v, int b) { return ((v >> b) & 1u) != 0; }

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux refuses AMX tile data to a process until it asks (kernel >= 5.16).
bool request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

IsaLevel detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return IsaLevel::kGeneric;
  const bool osxsave = bit(c, 27), avx = bit(c, 28), fma = bit(c, 12), f16c = bit(c, 29);
  if (!osxsave || !avx) return IsaLevel::kGeneric;
  const uint64_t xcr0 = xgetbv0();
  if ((xcr0 & 0x6) != 0x6) return IsaLevel::kGeneric;  // XMM and YMM state saved
  if (__get_cpuid_max(0, nullptr) < 7) return IsaLevel::kGeneric;
  unsigned a7, b7, c7, d7;
  __cpuid_count(7, 0, a7, b7, c7, d7);
  const bool avx2 = bit(b7, 5);
  if (!(avx2 && fma && f16c)) return IsaLevel::kGeneric;
  const bool avx512 = bit(b7, 16) /*F*/ && bit(b7, 17) /*DQ*/ && bit(b7, 30) /*BW*/ &&
                      bit(b7, 31) /*VL*/ && (xcr0 & 0xe0) == 0xe0 /*opmask, ZMM state*/;
  if (!avx512) return IsaLevel::kAvx2;
  unsigned a71 = 0, b71, c71, d71;
  if (a7 >= 1) __cpuid_count(7, 1, a71, b71, c71, d71);
  // avx512bf16 also uses AVX512-VNNI (w8a8's vpdpbusd): every CPU with
  // AVX512-BF16 so far has it (Cooper Lake, Sapphire Rapids, Zen 4 and 5);
  // one without it gets avx512.
  const bool bf16 = bit(a71, 5), vnni = bit(c7, 11);
  if (!bf16 || !vnni) return IsaLevel::kAvx512;
  const bool amx = bit(d7, 24) /*AMX-TILE*/ && bit(d7, 22) /*AMX-BF16*/ &&
                   (xcr0 & 0x60000) == 0x60000 /*XTILECFG, XTILEDATA*/;
  if (amx && request_amx_permission()) return IsaLevel::kAmx;
  return IsaLevel::kAvx512Bf16;
}

// Start-up probe of a level's kernels: only the oneDNN level (amx) can fail.
Status probe(IsaLevel level) {
  if (level == IsaLevel::kAmx) return internal::onednn_probe();
  return ok_status();
}

struct State {
  IsaLevel detected = IsaLevel::kGeneric;
  IsaLevel best =
      IsaLevel::kGeneric;  // detected, capped by MSINFER_ISA, lowered past failed probes
  std::atomic<int> active{0};
};

State& state() {
  static State* s = [] {
    auto* st = new State();
    st->detected = detect();
    // MSINFER_ISA caps the process: no level above it is used, probed or
    // forced (oneDNN fixes its instruction set at its first primitive).
    IsaLevel best = st->detected;
    if (const char* env = std::getenv("MSINFER_ISA"); env != nullptr && *env != '\0') {
      auto lvl = parse_isa(env);
      if (!lvl.ok()) {
        MSI_LOG(WARNING) << "MSINFER_ISA: " << lvl.status().message() << "; ignored";
      } else if (*lvl > best) {
        MSI_LOG(WARNING) << "MSINFER_ISA=" << env << ": this CPU runs at most " << isa_name(best)
                         << "; using it";
      } else {
        best = *lvl;
      }
    }
    while (best > IsaLevel::kGeneric) {
      Status p = probe(best);
      if (p.ok()) break;
      const IsaLevel lower = static_cast<IsaLevel>(static_cast<int>(best) - 1);
      MSI_LOG(WARNING) << "CPU kernel level " << isa_name(best) << " failed its start-up check ("
                       << p.message() << "); using " << isa_name(lower);
      best = lower;
    }
    st->best = best;
    st->active.store(static_cast<int>(best));
    return st;
  }();
  return *s;
}

}  // namespace

const char* isa_name(IsaLevel level) { return kNames[static_cast<int>(level)]; }

StatusOr<IsaLevel> parse_isa(std::string_view name) {
  for (IsaLevel l : all_isa_levels()) {
    if (name == isa_name(l)) return l;
  }
  return invalid_argument("unknown CPU kernel level '" + std::string(name) +
                          "' (expected generic, avx2, avx512, avx512bf16 or amx)");
}

const std::vector<IsaLevel>& all_isa_levels() {
  static const std::vector<IsaLevel> levels = {IsaLevel::kGeneric, IsaLevel::kAvx2,
                                               IsaLevel::kAvx512, IsaLevel::kAvx512Bf16,
                                               IsaLevel::kAmx};
  return levels;
}

IsaLevel detected_isa() { return state().detected; }

bool isa_supported(IsaLevel level) { return level <= state().best; }

IsaLevel active_isa() { return static_cast<IsaLevel>(state().active.load()); }

Status force_isa(IsaLevel level) {
  State& s = state();
  if (level > s.best) {
    return failed_precondition(std::string("CPU kernel level ") + isa_name(level) +
                               " is not available on this CPU (best: " + isa_name(s.best) + ")");
  }
  s.active.store(static_cast<int>(level));
  return ok_status();
}

StatusOr<IsaLevel> isa_from_env() {
  const char* env = std::getenv("MSINFER_ISA");
  if (env == nullptr || *env == '\0') return not_found("MSINFER_ISA is not set");
  return parse_isa(env);
}

std::string isa_description() {
  std::string d = isa_name(active_isa());
  if (active_isa() != detected_isa()) d += std::string(" (CPU: ") + isa_name(detected_isa()) + ")";
  return d;
}

namespace internal {

const LevelKernels& kernels_for(IsaLevel level) {
  MSI_CHECK(isa_supported(level)) << "kernels of " << isa_name(level) << " on a CPU without it";
  switch (level) {
    case IsaLevel::kGeneric:
      return generic::kernels();
    case IsaLevel::kAvx2:
      return avx2::kernels();
    case IsaLevel::kAvx512:
      return avx512::kernels();
    case IsaLevel::kAvx512Bf16:
      return avx512bf16::kernels();
    case IsaLevel::kAmx:  // avx512bf16's, with bf16 GEMMs through oneDNN (AMX)
      return avx512bf16::amx_kernels();
  }
  return generic::kernels();
}

const LevelKernels& active_kernels() { return kernels_for(active_isa()); }

}  // namespace internal
}  // namespace msinfer::kernels::cpu
