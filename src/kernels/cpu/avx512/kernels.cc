// The avx512 level: AVX-512 F/BW/VL/DQ without BF16 (Skylake-X, Ice Lake), and
// the int8 GEMMs and non-GEMM kernels of the levels above it. GEMMs are the
// panel kernels of internal/simd.inc with 32-column panels. The target is set
// after the headers for the reason given in avx2/kernels.cc.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../internal/level.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // (V::fold8 in the MLA scores tiles)

namespace msinfer::kernels::cpu::internal::avx512 {

#include "../internal/portable.inc"

#include "../internal/avx512_vec.inc"

// 12 rows x 32 columns: 24 accumulators of the 32 zmm registers.
constexpr int64_t kRows = 12;
constexpr int kAccRegs = 24;
constexpr int64_t kW8Rows = 12;  // w8a8: 24 int32 accumulators (8 zmm for the rest)

constexpr bool kDotBf16 = false;  // no vdpbf16ps at this level

#include "../internal/simd.inc"

constexpr IsaLevel kLevel = IsaLevel::kAvx512;
#include "../internal/level_table.inc"

}  // namespace msinfer::kernels::cpu::internal::avx512

#pragma GCC pop_options
