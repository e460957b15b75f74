// How many threads the CPU kernels (and oneDNN) run their parallel regions on.
// One process-wide setting; OpenMP keeps the count per thread, so a thread
// that runs kernels calls enter_compute_thread() first (Engine::step does).
#pragma once

namespace msinfer::kernels::cpu {

// n >= 1: that many threads; n <= 0: OpenMP's default (OMP_NUM_THREADS, else
// one per core).
void set_compute_threads(int n);
// The count parallel regions use on a thread that entered.
int compute_threads();
// Applies the setting to the calling thread (cheap when nothing changed).
void enter_compute_thread();

// GOMP_SPINCOUNT as msinfer sets it when the environment chose no OpenMP
// wait policy (tools/msinfer/cli_common.h): idle threads spin this many
// times, not libgomp's 300,000, before they sleep.
inline constexpr const char* kOpenmpSpinCount = "10000";

}  // namespace msinfer::kernels::cpu
