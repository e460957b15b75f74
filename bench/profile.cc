#include "msinfer/bench/profile.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include "internal/timing.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/ops.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/model_runner.h"

namespace msinfer::bench {
namespace {

// A profile point: the median of 5 rounds that together take `min_seconds`.
// One long round let a burst of another process's work, or of the machine's
// memory traffic, move a point by 15-25% between profiles a minute apart
// (docs/PLANNER.md 8), and a local fit through two such points twice that.
template <typename F>
double one_point(F&& f, double min_seconds) {
  return internal::median_seconds_per_call(f, min_seconds, /*rounds=*/5);
}

double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

double measure_group_cores(int threads, double seconds) {
  threads = std::max(threads, 1);
  const double cpu0 = process_cpu_s();
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> spinners;
  for (int i = 0; i < threads; ++i) {
    spinners.emplace_back([until] {
      uint64_t x = 1;
      while (std::chrono::steady_clock::now() < until) {
        for (int k = 0; k < 1000; ++k) x = x * 6364136223846793005ull + 1442695040888963407ull;
        asm volatile("" : "+r"(x));
      }
    });
  }
  for (std::thread& t : spinners) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!(wall > 0)) return threads;
  return std::clamp((process_cpu_s() - cpu0) / wall, 0.0, static_cast<double>(threads));
}

LinearFit fit_line(const std::vector<std::pair<double, double>>& pts) {
  LinearFit f;
  const double n = static_cast<double>(pts.size());
  if (pts.size() < 2) return f;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : pts) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double den = n * sxx - sx * sx;
  f.slope = den != 0 ? (n * sxy - sx * sy) / den : 0;
  f.intercept = (sy - f.slope * sx) / n;
  // Stage times cannot have negative terms (plan --profile refuses them): when
  // noise or cache effects push one below zero, fit the other alone.
  if (f.intercept < 0) {
    f.intercept = 0;
    f.slope = sxx > 0 ? sxy / sxx : 0;
  }
  if (f.slope < 0) {
    f.slope = 0;
    f.intercept = sy / n;
  }
  const double mean = sy / n;
  double ss_res = 0, ss_tot = 0;
  for (auto [x, y] : pts) {
    const double pred = f.slope * x + f.intercept;
    ss_res += (y - pred) * (y - pred);
    ss_tot += (y - mean) * (y - mean);
    f.max_rel_error = std::max(f.max_rel_error, std::fabs(pred - y) / y);
  }
  f.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
  return f;
}

Json ProfileResult::to_json(const ProfileOptions& o) const {
  auto pts = [](const std::vector<std::pair<double, double>>& v) {
    Json a = Json::array();
    for (auto [x, y] : v) a.push_back({x, y * 1e3});
    return a;
  };
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const double memory_gb = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                           static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1e9;
  return Json{{"k1_ms_per_token", attention_fit.slope * 1e3},
              {"k2_ms", attention_fit.intercept * 1e3},
              {"k3_ms_per_token", expert_fit.slope * 1e3},
              {"k4_ms", expert_fit.intercept * 1e3},
              {"tp_attention", 1},
              {"tp_expert", 1},
              {"seq_len", o.seq_len},
              {"model", o.model_dir},
              {"head_ms_per_token", head_fit.slope * 1e3},
              {"head_ms", head_fit.intercept * 1e3},
              {"threads", omp_get_max_threads()},
              {"cores", cores},
              {"memory_gb", memory_gb},
              {"cpu_share", cpu_share},
              {"group_threads", group_threads},
              {"group_cores", group_cores},
              {"isa", kernels::cpu::isa_name(kernels::cpu::active_isa())},
              {"weights", kernels::cpu::weight_format_name(o.weights)},
              {"device", o.device},
              {"attention_points_ms", pts(attention)},
              {"expert_points_ms", pts(expert)},
              {"attention_next_points_ms", pts(attention_next)},
              {"expert_next_points_ms", pts(expert_next)},
              {"head_points_ms", pts(head)},
              {"fit",
               {{"attention_r2", attention_fit.r2},
                {"attention_max_rel_error", attention_fit.max_rel_error},
                {"expert_r2", expert_fit.r2},
                {"expert_max_rel_error", expert_fit.max_rel_error},
                {"head_r2", head_fit.r2},
                {"head_max_rel_error", head_fit.max_rel_error}}}};
}

StatusOr<ProfileResult> profile_model(const ProfileOptions& o,
                                      void (*progress)(const std::string&)) {
  if (o.seq_len < 1) return invalid_argument("--seq-len must be >= 1");
  MSI_RETURN_IF_ERROR(runtime::check_device(o.device));
  model::LoadOptions lo;
  lo.weights = o.weights;
  MSI_ASSIGN_OR_RETURN(auto weights, model::ModelWeights::load(
                                         o.model_dir, runtime::host_load_options(lo, o.device)));
  const ModelConfig& c = weights->config();
  int64_t max_ba = 0;
  for (int64_t b : o.attention_batches) max_ba = std::max(max_ba, b);
  // Two micro-batches of the largest b_a (the attention walk below).
  const int64_t need = 2 * max_ba * (o.seq_len + 1) * runtime::KvCache::bytes_per_token(c);
  if (need > (o.kv_cache_mb << 20)) {
    return resource_exhausted(
        "profile needs " + std::to_string(need >> 20) +
        " MiB of KV cache for two micro-batches of b_a = " + std::to_string(max_ba) + " at " +
        std::to_string(o.seq_len) + " tokens; raise --kv-cache-mb");
  }
  MSI_ASSIGN_OR_RETURN(runtime::KvCache kv,
                       runtime::KvCache::create(c, o.kv_cache_mb << 20, /*block_size=*/16,
                                                runtime::is_cpu_device(o.device)));
  ProfileResult r;
  const double cpu0 = process_cpu_s();
  const auto wall0 = std::chrono::steady_clock::now();
  MSI_ASSIGN_OR_RETURN(auto attn, runtime::make_attention_compute(o.device, *weights, kv));
  MSI_ASSIGN_OR_RETURN(auto experts, runtime::make_expert_compute(o.device, *weights, {}));
  kernels::cpu::RoutedBatch routed;
  std::vector<float> x, results;
  // T_a and T_e are an MoE layer's: dense first layers (DeepSeek's
  // first_k_dense_replace) have no experts to time and no routing.
  std::vector<int> moe_layers;
  for (int l = 0; l < c.layers; ++l) {
    if (c.is_moe_layer(l)) moe_layers.push_back(l);
  }
  if (moe_layers.empty()) return invalid_argument(c.name + ": no MoE layer to profile");
  const int n_moe = static_cast<int>(moe_layers.size());
  // The attention stage as a deployment runs it (docs/PLANNER.md 8): a walk
  // over the MoE layers in which each layer's stage runs for one micro-batch
  // (the first: since this layer's weights last ran, everything else the step
  // reads went through the caches, here the other layers' attention and the
  // layer's experts, untimed, as the expert worker streams them between two
  // stages) and then for a second micro-batch of as many other requests right
  // after it (a later micro-batch: it finds what of the layer's weights the
  // first left in the caches). A point is the median per call over the walks.
  for (int64_t b : o.attention_batches) {
    runtime::TokenBatch mb[2];
    for (int k = 0; k < 2; ++k) {
      for (int64_t i = k * b; i < (k + 1) * b; ++i) {
        MSI_RETURN_IF_ERROR(kv.reserve(i, o.seq_len + 1));
        mb[k].ids.push_back(static_cast<int32_t>(i % c.vocab));
        mb[k].positions.push_back(static_cast<int32_t>(o.seq_len));
        for (int g = 0; g < kv.groups(); ++g) mb[k].tables_of(g).push_back(kv.block_table(i, g));
      }
    }
    x.assign(b * c.hidden, 0.01f);
    std::vector<float> rows(c.hidden, 0.01f), out(c.hidden);
    auto stage = [&](int l, const runtime::TokenBatch& batch) {
      const auto t0 = std::chrono::steady_clock::now();
      MSI_CHECK(attn->attention_and_gate(l, batch, kv, x.data(), &routed).ok());
      results.assign(routed.rows() * c.hidden, 0.f);
      attn->combine(routed, results.data(), x.data());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fill(x.begin(), x.end(), 0.01f);  // keep activations bounded
      return s;
    };
    std::vector<double> first, next;
    const auto t0 = std::chrono::steady_clock::now();
    do {
      for (int l : moe_layers) {
        first.push_back(stage(l, mb[0]));
        next.push_back(stage(l, mb[1]));
        for (int e = 0; e < c.experts; ++e) {
          MSI_CHECK(experts->forward_group(l, {e}, {0, 1}, rows.data(), out.data()).ok());
        }
      }
    } while (first.size() < 3 * moe_layers.size() ||
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
                 o.min_seconds);
    const double s = internal::median(std::move(first));
    const double sn = internal::median(std::move(next));
    r.attention.emplace_back(static_cast<double>(b), s);
    r.attention_next.emplace_back(static_cast<double>(b), sn);
    for (int64_t i = 0; i < 2 * b; ++i) kv.release(i);
    if (progress)
      progress("T_a(b_a = " + std::to_string(b) + ") = " + std::to_string(s * 1e3) +
               " ms, next micro-batch = " + std::to_string(sn * 1e3) + " ms");
  }
  for (int64_t b : o.expert_batches) {
    std::vector<float> rows(b * c.hidden, 0.01f), out(b * c.hidden);
    int idx = 0;
    const double s = one_point(
        [&] {
          MSI_CHECK(experts
                        ->forward_group(moe_layers[idx / c.experts], {idx % c.experts}, {0, b},
                                        rows.data(), out.data())
                        .ok());
          idx = (idx + 1) % (n_moe * c.experts);
        },
        o.min_seconds);
    r.expert.emplace_back(static_cast<double>(b), s);
    if (progress) progress("T_e(b_e = " + std::to_string(b) + ") = " + std::to_string(s * 1e3) + " ms");
  }
  // A micro-batch after the first: an expert worker runs a layer's experts
  // once per micro-batch, back to back (expert_worker.cc), so from the second
  // micro-batch on it finds what of the layer's weights the caches kept.
  // Timed as the runtime does it: each layer's experts twice in a row; a
  // point is the second pass's time per expert, the median over the passes.
  for (int64_t b : o.expert_batches) {
    std::vector<float> rows(b * c.hidden, 0.01f), out(b * c.hidden);
    auto pass = [&](int l) {
      for (int e = 0; e < c.experts; ++e) {
        MSI_CHECK(experts->forward_group(l, {e}, {0, b}, rows.data(), out.data()).ok());
      }
    };
    std::vector<double> second;
    const auto t0 = std::chrono::steady_clock::now();
    int li = 0;
    do {
      pass(moe_layers[li]);
      const auto s0 = std::chrono::steady_clock::now();
      pass(moe_layers[li]);
      second.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count() / c.experts);
      li = (li + 1) % n_moe;
    } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
             o.min_seconds);
    const double s = internal::median(std::move(second));
    r.expert_next.emplace_back(static_cast<double>(b), s);
    if (progress)
      progress("T_e(b_e = " + std::to_string(b) +
               "), next micro-batch = " + std::to_string(s * 1e3) + " ms");
  }
  // The step's tail: final norm + LM head over b rows, and the greedy pick.
  for (int64_t b : o.head_batches) {
    std::vector<float> xs(b * c.hidden, 0.01f), lg(b * c.vocab);
    std::vector<const float*> rows;
    for (int64_t i = 0; i < b; ++i) rows.push_back(xs.data() + i * c.hidden);
    int64_t picked = 0;
    const double s = one_point(
        [&] {
          MSI_CHECK(attn->logits(rows, lg.data()).ok());
          // The pick the runtime's greedy sampler makes (sampling.cc).
          for (int64_t i = 0; i < b; ++i)
            picked += kernels::cpu::argmax(lg.data() + i * c.vocab, c.vocab);
        },
        o.min_seconds);
    asm volatile("" : : "g"(picked) : "memory");  // keeps the picks from being optimised away
    r.head.emplace_back(static_cast<double>(b), s);
    if (progress)
      progress("T_head(b = " + std::to_string(b) + ") = " + std::to_string(s * 1e3) + " ms");
  }
  r.head_fit = fit_line(r.head);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (wall > 0) {
    r.cpu_share =
        std::min(1.0, (process_cpu_s() - cpu0) / wall / std::max(1, omp_get_max_threads()));
  }
  // The deployment's workers are one group of up to `cores` busy threads:
  // what such a group gets is measured, not inferred from the one-thread
  // share above (docs/PLANNER.md 8).
  r.group_threads = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  r.group_cores = measure_group_cores(r.group_threads, std::max(0.1, o.min_seconds));
  if (progress) {
    progress("group of " + std::to_string(r.group_threads) +
             " busy threads: " + std::to_string(r.group_cores) + " cores");
  }
  r.attention_fit = fit_line(r.attention);
  r.expert_fit = fit_line(r.expert);
  return r;
}

}  // namespace msinfer::bench
