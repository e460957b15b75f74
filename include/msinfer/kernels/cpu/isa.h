// CPU kernel levels and their run-time selection.
//
// One binary runs on every x86-64 CPU: each level's kernels are compiled in
// their own translation units for that level's instructions, and the level is
// chosen when the first kernel runs, from CPUID, XCR0 (what the OS saves) and,
// for AMX, the Linux permission to use tile data (arch_prctl). Levels, lowest
// first:
//   generic     portable C++, no intrinsics; the reference every level is tested against
//   avx2        AVX2 + FMA + F16C (Haswell, Zen 1-3): own bf16/int8 panel kernels
//   avx512      AVX-512 F/BW/VL/DQ without BF16 (Skylake-X, Ice Lake): own panel kernels
//   avx512bf16  + AVX512-BF16 and AVX512-VNNI (Cooper Lake, Zen 4/5): own vdpbf16ps
//               GEMMs (bf16, int8), vpdpbusd (w8a8)
//   amx         + AMX-TILE/AMX-BF16 (Sapphire Rapids): oneDNN with AMX
// MSINFER_ISA=<level> (inherited by worker processes; `--isa` on the commands
// that run the engine sets it) caps the process at a lower level: nothing above
// it is used or probed. A level the CPU cannot run is refused (force_isa) or,
// from the environment, replaced by the best available one with a warning. A
// level whose start-up probe fails (oneDNN cannot create a bf16 primitive)
// falls back to the next lower one with one log line. Thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer::kernels::cpu {

enum class IsaLevel { kGeneric = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

const char* isa_name(IsaLevel level);
// "generic", "avx2", "avx512", "avx512bf16", "amx".
StatusOr<IsaLevel> parse_isa(std::string_view name);
// Every level, lowest first.
const std::vector<IsaLevel>& all_isa_levels();

// The best level this CPU and OS can run (before any override or fallback).
IsaLevel detected_isa();
// Whether this process may run `level`'s kernels: level <= detected, not above
// MSINFER_ISA, and its start-up probe passed.
bool isa_supported(IsaLevel level);
// The level the kernels use now: the best supported one unless force_isa chose
// a lower one.
IsaLevel active_isa();
// Makes `level` the active one for this process (tests, `--isa`); an error
// naming the CPU's best level if this CPU cannot run it.
Status force_isa(IsaLevel level);
// The level named by MSINFER_ISA, if the variable is set and valid.
StatusOr<IsaLevel> isa_from_env();
// One line for logs and reports: "avx2 (CPU: avx512bf16)".
std::string isa_description();

}  // namespace msinfer::kernels::cpu
