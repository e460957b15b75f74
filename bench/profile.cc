#include "msinfer/bench/profile.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <thread>

#include "internal/timing.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/kernels/cpu/ops.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/model_runner.h"

namespace msinfer::bench {
namespace {

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
  // Every point is measured in kRounds rounds, and the rounds of all points
  // are interleaved: pass p runs round p of each point in turn. A slow spell
  // of the machine (another tenant's memory traffic on a shared host moved
  // single points by 60% when each point's rounds ran back to back) then
  // lands in one round of several points, which their medians drop, instead
  // of in every round of one point.
  constexpr int kRounds = 5;
  const double round_s = o.min_seconds / kRounds;
  std::vector<std::function<void()>> rounds;  // one per point; each call runs a round
  // Per-call samples of walk-type points, and per-round means of the others.
  struct Samples {
    int64_t b = 0;
    std::vector<double> times, next_times;
  };
  auto timed_round = [round_s](auto& f) { return internal::round_seconds_per_call(f, round_s); };

  // The attention stage as a deployment runs it (docs/PLANNER.md 8): a walk
  // over the MoE layers in which each layer's stage runs for one micro-batch
  // (the first: since this layer's weights last ran, everything else the step
  // reads went through the caches, here the other layers' attention and the
  // layer's experts, untimed, as the expert worker streams them between two
  // stages) and then for a second micro-batch of as many other requests right
  // after it (a later micro-batch: it finds what of the layer's weights the
  // first left in the caches). A point is the median per call over its walks.
  std::vector<Samples> attention(o.attention_batches.size());
  std::vector<float> one_row(c.hidden, 0.01f), one_out(c.hidden);
  for (size_t pi = 0; pi < o.attention_batches.size(); ++pi) {
    attention[pi].b = o.attention_batches[pi];
    rounds.push_back([&, pi] {
      Samples& smp = attention[pi];
      const int64_t b = smp.b;
      runtime::TokenBatch mb[2];
      for (int k = 0; k < 2; ++k) {
        for (int64_t i = k * b; i < (k + 1) * b; ++i) {
          MSI_CHECK(kv.reserve(i, o.seq_len + 1).ok());
          mb[k].ids.push_back(static_cast<int32_t>(i % c.vocab));
          mb[k].positions.push_back(static_cast<int32_t>(o.seq_len));
          for (int g = 0; g < kv.groups(); ++g) mb[k].tables_of(g).push_back(kv.block_table(i, g));
        }
      }
      x.assign(b * c.hidden, 0.01f);
      auto stage = [&](int l, const runtime::TokenBatch& batch) {
        const auto t0 = std::chrono::steady_clock::now();
        MSI_CHECK(attn->attention_and_gate(l, batch, kv, x.data(), &routed).ok());
        results.assign(routed.rows() * c.hidden, 0.f);
        attn->combine(routed, results.data(), x.data());
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fill(x.begin(), x.end(), 0.01f);  // keep activations bounded
        return t;
      };
      // What precedes a layer's first stage in the walk, untimed, for the
      // walk's first layer: the last layer's stages and experts (before it
      // ran whatever point this round follows, and the stage took 1.4x as
      // long at b_a 1).
      // Layer l's experts on one row each, untimed: the weights an expert
      // worker streams between two attention stages.
      auto stream_experts = [&](int l) {
        for (int e = 0; e < c.experts; ++e) {
          MSI_CHECK(experts->forward_group(l, {e}, {0, 1}, one_row.data(), one_out.data()).ok());
        }
      };
      const int last = moe_layers.back();
      stage(last, mb[0]);
      stage(last, mb[1]);
      stream_experts(last);
      const auto t0 = std::chrono::steady_clock::now();
      do {
        for (int l : moe_layers) {
          smp.times.push_back(stage(l, mb[0]));
          smp.next_times.push_back(stage(l, mb[1]));
          stream_experts(l);
        }
      } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
               round_s);
      for (int64_t i = 0; i < 2 * b; ++i) kv.release(i);
    });
  }
  // T_e: one expert's FFN on b_e rows, cycling through every MoE layer's
  // experts (the per-round mean; a point is the median round).
  std::vector<Samples> expert(o.expert_batches.size());
  std::vector<std::vector<float>> expert_rows(o.expert_batches.size());
  std::vector<float> expert_out;
  for (size_t pi = 0; pi < o.expert_batches.size(); ++pi) {
    const int64_t b = o.expert_batches[pi];
    expert[pi].b = b;
    expert_rows[pi].assign(b * c.hidden, 0.01f);
    expert_out.resize(std::max<size_t>(expert_out.size(), b * c.hidden));
    rounds.push_back([&, pi, b, idx = 0]() mutable {
      auto f = [&] {
        MSI_CHECK(experts
                      ->forward_group(moe_layers[idx / c.experts], {idx % c.experts}, {0, b},
                                      expert_rows[pi].data(), expert_out.data())
                      .ok());
        idx = (idx + 1) % (n_moe * c.experts);
      };
      if (expert[pi].times.empty()) f();  // warm-up: first touch of the buffers
      expert[pi].times.push_back(timed_round(f));
    });
  }
  // A micro-batch after the first: an expert worker runs a layer's experts
  // once per micro-batch, back to back (expert_worker.cc), so from the second
  // micro-batch on it finds what of the layer's weights the caches kept.
  // Timed as the runtime does it: each layer's experts twice in a row; a
  // point is the second pass's time per expert, the median over the passes.
  for (size_t pi = 0; pi < o.expert_batches.size(); ++pi) {
    const int64_t b = o.expert_batches[pi];
    rounds.push_back([&, pi, b, li = 0]() mutable {
      auto pass = [&](int l) {
        for (int e = 0; e < c.experts; ++e) {
          MSI_CHECK(
              experts->forward_group(l, {e}, {0, b}, expert_rows[pi].data(), expert_out.data())
                  .ok());
        }
      };
      const auto t0 = std::chrono::steady_clock::now();
      do {
        pass(moe_layers[li]);
        const auto s0 = std::chrono::steady_clock::now();
        pass(moe_layers[li]);
        expert[pi].next_times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count() /
            c.experts);
        li = (li + 1) % n_moe;
      } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
               round_s);
    });
  }
  // The step's tail: final norm + LM head over b rows, and the greedy pick.
  std::vector<Samples> head(o.head_batches.size());
  std::vector<std::vector<float>> head_x(o.head_batches.size());
  std::vector<float> head_logits;
  int64_t picked = 0;
  for (size_t pi = 0; pi < o.head_batches.size(); ++pi) {
    const int64_t b = o.head_batches[pi];
    head[pi].b = b;
    head_x[pi].assign(b * c.hidden, 0.01f);
    head_logits.resize(std::max<size_t>(head_logits.size(), b * c.vocab));
    rounds.push_back([&, pi, b] {
      std::vector<const float*> rows;
      for (int64_t i = 0; i < b; ++i) rows.push_back(head_x[pi].data() + i * c.hidden);
      auto f = [&] {
        MSI_CHECK(attn->logits(rows, head_logits.data()).ok());
        // The pick the runtime's greedy sampler makes (sampling.cc).
        for (int64_t i = 0; i < b; ++i)
          picked += kernels::cpu::argmax(head_logits.data() + i * c.vocab, c.vocab);
      };
      if (head[pi].times.empty()) f();  // warm-up
      head[pi].times.push_back(timed_round(f));
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    for (auto& run_round : rounds) run_round();
    if (progress) {
      progress("round " + std::to_string(round + 1) + " of " + std::to_string(kRounds) +
               " of every point done");
    }
  }
  asm volatile("" : : "g"(picked) : "memory");  // keeps the picks from being optimised away
  auto report = [&](const std::string& what, int64_t b, double t) {
    if (progress) progress(what + std::to_string(b) + ") = " + std::to_string(t * 1e3) + " ms");
  };
  for (Samples& smp : attention) {
    r.attention.emplace_back(static_cast<double>(smp.b), internal::median(smp.times));
    r.attention_next.emplace_back(static_cast<double>(smp.b), internal::median(smp.next_times));
    report("T_a(b_a = ", smp.b, r.attention.back().second);
    report("T_a, next micro-batch (b_a = ", smp.b, r.attention_next.back().second);
  }
  for (Samples& smp : expert) {
    r.expert.emplace_back(static_cast<double>(smp.b), internal::median(smp.times));
    r.expert_next.emplace_back(static_cast<double>(smp.b), internal::median(smp.next_times));
    report("T_e(b_e = ", smp.b, r.expert.back().second);
    report("T_e, next micro-batch (b_e = ", smp.b, r.expert_next.back().second);
  }
  for (Samples& smp : head) {
    r.head.emplace_back(static_cast<double>(smp.b), internal::median(smp.times));
    report("T_head(b = ", smp.b, r.head.back().second);
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
