#include "msinfer/runtime/worker_stats.h"

#include <algorithm>

#include "msinfer/core/process.h"

namespace msinfer::runtime {

int64_t UnitTimes::count() const {
  int64_t c = 0;
  for (int64_t n : n_) c += n;
  return c;
}

double UnitTimes::mean() const {
  double s = 0;
  for (double x : sum_) s += x;
  const int64_t c = count();
  return c > 0 ? s / static_cast<double>(c) : 0.0;
}

Json UnitTimes::to_json() const {
  Json slots = Json::array();
  for (size_t k = 0; layers_ > 0 && k < sum_.size() / layers_; ++k) {
    Json row = Json::array();
    for (int l = 0; l < layers_; ++l) {
      const size_t i = k * layers_ + l;
      row.push_back(n_[i] > 0 ? Json(sum_[i] / static_cast<double>(n_[i])) : Json(nullptr));
    }
    slots.push_back(row);
  }
  return slots;
}

void UnitTimes::reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0);
  std::fill(n_.begin(), n_.end(), 0);
}

RoutingWindow::RoutingWindow(int layers, int experts)
    : layers_(layers),
      experts_(experts),
      buckets_(kBuckets, std::vector<int64_t>(static_cast<size_t>(layers) * experts, 0)),
      bucket_steps_(kBuckets, 0) {}

void RoutingWindow::begin_step() {
  if (buckets_.empty()) return;
  if (bucket_steps_[current_] == kWindowSteps / kBuckets) {
    current_ = (current_ + 1) % kBuckets;  // drop the oldest bucket
    std::fill(buckets_[current_].begin(), buckets_[current_].end(), 0);
    bucket_steps_[current_] = 0;
  }
  ++bucket_steps_[current_];
}

int64_t RoutingWindow::steps() const {
  int64_t n = 0;
  for (int64_t s : bucket_steps_) n += s;
  return n;
}

std::vector<int64_t> RoutingWindow::counts() const {
  std::vector<int64_t> c(static_cast<size_t>(layers_) * experts_, 0);
  for (const auto& b : buckets_) {
    for (size_t i = 0; i < c.size(); ++i) c[i] += b[i];
  }
  return c;
}

Json RoutingWindow::to_json() const {
  const std::vector<int64_t> c = counts();
  Json layers = Json::array();
  for (int l = 0; l < layers_; ++l) {
    layers.push_back(std::vector<int64_t>(c.begin() + static_cast<ptrdiff_t>(l) * experts_,
                                          c.begin() + static_cast<ptrdiff_t>(l + 1) * experts_));
  }
  return Json{{"window_steps", kWindowSteps}, {"steps", steps()}, {"layer_expert_tokens", layers}};
}

void RoutingWindow::reset() {
  for (auto& b : buckets_) std::fill(b.begin(), b.end(), 0);
  std::fill(bucket_steps_.begin(), bucket_steps_.end(), 0);
  current_ = 0;
}

WorkerStats::WorkerStats(int slots, int layers, int experts)
    : routed(experts > 0 ? RoutingWindow(layers, experts) : RoutingWindow()),
      t_a(slots, layers),
      t_e(slots, layers),
      t_c(slots, layers),
      cpu_at_reset(process_cpu_seconds()) {}

double WorkerStats::window_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - reset_at).count();
}

Json WorkerStats::to_json() const {
  const double window_s = this->window_s();
  const double cpu = process_cpu_seconds() - cpu_at_reset;
  Json j{{"window_s", window_s},
         {"cpu_s", cpu},
         {"cpu_fraction", window_s > 0 ? cpu / window_s : 0.0},
         {"rss_mb", read_process_memory().rss_bytes / 1048576.0},
         {"busy_s", busy_s},
         {"wait_s", wait_s},
         {"busy_fraction", window_s > 0 ? busy_s / window_s : 0.0},
         {"wait_fraction", window_s > 0 ? wait_s / window_s : 0.0},
         {"gemm_flops", gemm_flops},
         {"gemm_gflops_per_s", busy_s > 0 ? gemm_flops / busy_s / 1e9 : 0.0},
         {"tokens", tokens},
         {"m2n_bytes_sent", m2n_bytes_sent},
         {"tp_reduce_bytes_sent", tp_reduce_bytes_sent}};
  if (!expert_tokens.empty()) {
    Json e = Json::object();
    for (const auto& [expert, n] : expert_tokens) e[std::to_string(expert)] = n;
    j["expert_tokens"] = e;
  }
  if (routed.experts() > 0) j["routed"] = routed.to_json();
  for (const auto& [name, t] : {std::pair{"t_a", &t_a}, {"t_e", &t_e}, {"t_c", &t_c}}) {
    if (t->count() == 0) continue;
    j[std::string(name) + "_mean_s"] = t->mean();
    j[std::string(name) + "_s"] = t->to_json();
  }
  return j;
}

void WorkerStats::reset() {
  busy_s = wait_s = gemm_flops = 0;
  tokens = 0;
  m2n_bytes_sent = tp_reduce_bytes_sent = 0;
  expert_tokens.clear();
  routed.reset();
  cpu_at_reset = process_cpu_seconds();
  reset_at = std::chrono::steady_clock::now();
  t_a.reset();
  t_e.reset();
  t_c.reset();
}

}  // namespace msinfer::runtime
