#include "msinfer/kernels/cpu/threads.h"

#include <omp.h>

#include <atomic>

namespace msinfer::kernels::cpu {

namespace {

// 0: not set (OpenMP's default). Bumped generation: threads re-apply.
std::atomic<int> g_threads{0};
std::atomic<int> g_generation{0};
// OpenMP's default, read before anyone changed it.
const int g_default = omp_get_max_threads();

}  // namespace

void set_compute_threads(int n) {
  g_threads.store(n > 0 ? n : 0);
  g_generation.fetch_add(1);
  enter_compute_thread();
}

int compute_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : g_default;
}

void enter_compute_thread() {
  thread_local int applied = 0;  // the generation applied on this thread
  const int gen = g_generation.load();
  if (applied == gen) return;
  applied = gen;
  omp_set_num_threads(compute_threads());
}

}  // namespace msinfer::kernels::cpu
