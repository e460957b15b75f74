// msinfer plan --devices cpu: docs/PLANNER.md section 8.
#include "msinfer/planner/cpu_plan.h"

#include <algorithm>
#include <cmath>

namespace msinfer::planner {
namespace {

// The runtime's KV block (runtime::KvCache::kDefaultBlockSize; the planner
// does not link the runtime) and its rows on the M2N wire: fp32.
constexpr double kKvBlockTokens = 128;
constexpr double kWireBytesPerValue = 4;

StatusOr<std::vector<std::pair<double, double>>> read_points(const JsonFields& f,
                                                             const std::string& key) {
  std::vector<std::pair<double, double>> pts;
  if (!f.has(key)) return pts;
  const Json& a = f.json().at(key);
  if (!a.is_array()) return f.field_error(key, "must be an array of [batch, ms] pairs");
  for (const Json& p : a) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number()) {
      return f.field_error(key, "must be an array of [batch, ms] pairs");
    }
    const double b = p[0].get<double>(), ms = p[1].get<double>();
    if (!(b >= 1 && b <= 1e9) || !(ms > 0 && ms <= kMaxStageMs)) {
      return f.field_error(key, "holds a point outside batch [1, 1e9], time (0, 1e6] ms");
    }
    pts.emplace_back(b, ms * 1e-3);
  }
  std::sort(pts.begin(), pts.end());
  return pts;
}

double bytes_per_param(const std::string& weights) {
  return weights == "int8" || weights == "w8a8" ? 1.0 : weights == "mxfp4" ? 0.53 : 2.0;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

}  // namespace

StatusOr<CpuProfile> parse_cpu_profile(const Json& j, const std::string& source) {
  MSI_ASSIGN_OR_RETURN(Profile base, parse_profile(j, source));
  if (!base.k1 || !base.k2 || !base.k3 || !base.k4) {
    return invalid_argument(source +
                            ": --devices cpu needs k1..k4 (write it with `msinfer "
                            "profile --out`)");
  }
  if (base.tp_attention != 1 || base.tp_expert != 1) {
    return invalid_argument(source + ": --devices cpu needs a profile of one process (tp 1)");
  }
  CpuProfile p;
  p.source = source;
  p.k1 = *base.k1;
  p.k2 = *base.k2;
  p.k3 = *base.k3;
  p.k4 = *base.k4;
  p.nic_util = base.nic_util;
  p.nic_bandwidth = base.nic_bandwidth;
  JsonFields f(j, source);
  if (f.has("head_ms_per_token") || f.has("head_ms")) {
    MSI_ASSIGN_OR_RETURN(double a, f.number_in("head_ms_per_token", 0, kMaxStageMs));
    MSI_ASSIGN_OR_RETURN(double b, f.number_in("head_ms", 0, kMaxStageMs));
    p.head_per_token = a * 1e-3;
    p.head = b * 1e-3;
    p.has_head = true;
  }
  MSI_ASSIGN_OR_RETURN(p.attention_points, read_points(f, "attention_points_ms"));
  MSI_ASSIGN_OR_RETURN(p.expert_points, read_points(f, "expert_points_ms"));
  MSI_ASSIGN_OR_RETURN(p.head_points, read_points(f, "head_points_ms"));
  MSI_ASSIGN_OR_RETURN(p.expert_next_points, read_points(f, "expert_next_points_ms"));
  MSI_ASSIGN_OR_RETURN(p.attention_next_points, read_points(f, "attention_next_points_ms"));
  MSI_ASSIGN_OR_RETURN(int64_t threads, f.integer_or("threads", 1));
  if (threads < 1 || threads > 4096) return f.field_error("threads", "must be in 1..4096");
  p.threads = static_cast<int>(threads);
  MSI_ASSIGN_OR_RETURN(int64_t cores, f.integer_or("cores", 0));
  if (cores < 0 || cores > 4096) return f.field_error("cores", "must be in 0..4096");
  p.cores = static_cast<int>(cores);
  MSI_ASSIGN_OR_RETURN(double mem, f.number_or("memory_gb", 0));
  if (!(mem >= 0 && mem <= 1e6)) return f.field_error("memory_gb", "must be in [0, 1e6]");
  p.memory_bytes = mem * 1e9;
  MSI_ASSIGN_OR_RETURN(p.seq_len, f.number_or("seq_len", 0));
  MSI_ASSIGN_OR_RETURN(p.cpu_share, f.number_or("cpu_share", 1));
  if (!(p.cpu_share > 0 && p.cpu_share <= 1))
    return f.field_error("cpu_share", "must be in (0, 1]");
  MSI_ASSIGN_OR_RETURN(int64_t group_threads, f.integer_or("group_threads", 0));
  if (group_threads < 0 || group_threads > 4096)
    return f.field_error("group_threads", "must be in 0..4096");
  p.group_threads = static_cast<int>(group_threads);
  MSI_ASSIGN_OR_RETURN(p.group_cores, f.number_or("group_cores", 0));
  if (!(p.group_cores >= 0 && p.group_cores <= p.group_threads))
    return f.field_error("group_cores", "must be in [0, group_threads]");
  if (p.group_threads > 0 && !(p.group_cores > 0))
    return f.field_error("group_cores", "must be > 0 when group_threads is set");
  MSI_ASSIGN_OR_RETURN(p.weights, f.string_or("weights", "bf16"));
  return p;
}

LinearFit local_fit(const std::vector<std::pair<double, double>>& pts, double b, LinearFit global) {
  if (pts.size() < 2) return global;
  size_t hi = 1;
  while (hi + 1 < pts.size() && pts[hi].first < b) ++hi;
  const auto [b0, t0] = pts[hi - 1];
  const auto [b1, t1] = pts[hi];
  if (!(b1 > b0)) return global;
  LinearFit f;
  f.slope = (t1 - t0) / (b1 - b0);
  f.intercept = t0 - f.slope * b0;
  // A line with a negative term predicts nonsense away from its segment:
  // keep both >= 0 as the profile's own fit does.
  if (f.slope < 0) {
    f.slope = 0;
    f.intercept = (t0 + t1) / 2;
  } else if (f.intercept < 0) {
    f.intercept = 0;
    f.slope = t1 / b1;
  }
  return f;
}

CpuPrediction predict_cpu(const CpuSearchOptions& o, const CpuDeployment& d) {
  const ModelConfig& mc = o.model;
  const CpuProfile& pr = o.profile;
  CpuPrediction p;
  const double A = d.attention_workers, N = d.expert_workers, m = d.micro_batches;
  const double b_a = static_cast<double>(d.batch_per_micro_batch);
  const double E = mc.experts, K = mc.top_k, h = mc.hidden;
  // The pipeline runs over the MoE layers; dense layers (DeepSeek's
  // first_k_dense_replace) are the attention workers' alone (below).
  const int moe_layers = mc.moe_layers > 0 ? mc.moe_layers : mc.layers;
  const double L = moe_layers;
  const double x = E / N;               // experts per expert worker
  const double rows = A * b_a * K / N;  // rows one expert worker gets per micro-batch, layer
  const double b_e = rows / x;          // rows per expert
  p.rows_per_expert = b_e;
  // Kernels scale with threads as tensor parallelism does in section 3b
  // (ideal); a profile at the worker's own thread count needs no scaling.
  const double sa = static_cast<double>(pr.threads) / d.attention_threads;
  const double se = static_cast<double>(pr.threads) / d.expert_threads;
  LinearFit fa{pr.k1, pr.k2}, fe{pr.k3, pr.k4}, fh{pr.head_per_token, pr.head};
  if (o.local_fit) {
    fa = local_fit(pr.attention_points, b_a, fa);
    fe = local_fit(pr.expert_points, b_e, fe);
    if (pr.has_head) fh = local_fit(pr.head_points, m * b_a, fh);
  }
  // Cores shared with other processes. Linux shares the CPU fairly between
  // scheduling groups (autogroups: one per session; every worker the
  // deployment forks is in its router's), then between a group's runnable
  // threads. What a group with r runnable threads gets, G(r), is measured:
  // the profile's threads got cpu_share x threads, and group_threads busy
  // threads (the machine's cores) got group_cores; between the two G is
  // the line through them, beyond group_threads it stays (the cores are
  // all taken). A profile without the second point gives every r the
  // first's cores (all the cores when it was not held back). Each stage's
  // threads split G(r) over the r runnable, at most a core each: the side
  // that computes; during an expert stage also the attention side where
  // its waits spin (the runtime's processes fit the cores; they yield
  // otherwise); with m >= 2 both sides compute at once. An idle expert
  // worker sleeps after 2000 empty polls (expert_worker.cc), so it does not
  // compete with the attention stage or the head.
  const int cores = std::max(o.cores, 1);
  const double s_p = pr.cpu_share;
  const double r1 = pr.threads, g1 = s_p * pr.threads;
  const bool measured = pr.group_threads > 0 && pr.group_cores > 0;
  const double r2 = measured ? pr.group_threads : 0, g2 = pr.group_cores;
  auto group_at = [&](double r) {
    if (!measured) return s_p < 1 ? g1 : static_cast<double>(cores);
    if (r <= r1) return g1;
    if (r >= r2) return g2;
    return g1 + (g2 - g1) * (r - r1) / (r2 - r1);
  };
  const bool spin = d.processes() <= cores;
  auto share = [&](double ours) { return std::min(1.0, group_at(ours) / ours); };
  const double att_threads = A * d.attention_threads;
  const double exp_threads = N * d.tp_expert * d.expert_threads;
  const bool overlap = d.micro_batches >= 2;
  const double r_att = att_threads + (overlap ? exp_threads : 0);
  const double r_exp = exp_threads + (spin || overlap ? att_threads : 0);
  const double s_att = share(r_att);
  const double s_exp = share(r_exp);
  const double s_head = share(att_threads);
  // The work-conservation bound below uses the group with every worker
  // thread runnable.
  const double group = group_at(std::max({r_att, r_exp, att_threads + exp_threads}));
  const double s_prof = std::min(1.0, s_p);
  p.group_cores = group;
  p.share_factor_attention = s_prof / s_att;
  p.share_factor_expert = s_prof / s_exp;
  p.share_factor_head = s_prof / s_head;
  p.k1 = fa.slope * sa * p.share_factor_attention;
  p.k2 = fa.intercept * sa * p.share_factor_attention;
  p.k3 = fe.slope * se * p.share_factor_expert;
  p.k4 = fe.intercept * se * p.share_factor_expert;
  // The first micro-batch of a layer finds the layer's attention weights
  // gone from the caches (the rest of the step streamed through since); a
  // later one runs right after it and finds part of them: the profile's
  // next-micro-batch points. As for T_e below, the pipeline's one T_a per
  // stage is the mean over the m micro-batches (--global-fit: the first's).
  const double t_first = p.k1 * b_a + p.k2;
  double t_next = t_first;
  if (d.micro_batches >= 2 && o.local_fit && !pr.attention_next_points.empty()) {
    const LinearFit fn = local_fit(pr.attention_next_points, b_a, fa);
    t_next = (fn.slope * b_a + fn.intercept) * sa * p.share_factor_attention;
  }
  p.t_attention_first = t_first;
  p.t_attention_next = t_next;
  // A dense layer is an attention stage whose FFN is the dense one, on the
  // attention worker's b_a rows, with nothing on the expert side: the
  // profile times MoE layers only, so its FFN is the profiled expert FFN's
  // line scaled by width (weights and FLOPs both scale with it), less the
  // shared experts T_a holds already (they run with attention in the plans
  // bench serve --plan starts). Spread over the MoE layers as section 3b
  // spreads them on a GPU.
  const double dense_layers = mc.layers - moe_layers;
  if (dense_layers > 0 && mc.dense_ffn > 0 && mc.expert_ffn > 0) {
    const LinearFit ff = o.local_fit ? local_fit(pr.expert_points, b_a, LinearFit{pr.k3, pr.k4})
                                     : LinearFit{pr.k3, pr.k4};
    const double width =
        std::max<double>(0, static_cast<double>(mc.dense_ffn - mc.shared_expert_ffn) /
                                static_cast<double>(mc.expert_ffn));
    // On the attention worker's threads: scaled as T_a is (sa), not T_e.
    const double ffn = width * (ff.slope * b_a + ff.intercept) * sa * p.share_factor_attention;
    p.t_dense_layer = t_first + ffn;
    p.t_attention_first += dense_layers / L * p.t_dense_layer;
    p.t_attention_next += dense_layers / L * (t_next + ffn);
  }
  p.t_attention = (p.t_attention_first + (m - 1) * p.t_attention_next) / m;
  // One FFN per expert the worker holds, one after another (expert_worker.cc);
  // a tp_expert shard computes 1/tp of each FFN's width.
  p.t_expert = x * (p.k3 * b_e + p.k4) / d.tp_expert;
  p.t_expert_first = p.t_expert_next = p.t_expert;
  if (d.micro_batches >= 2 && o.local_fit && !pr.expert_next_points.empty()) {
    // From the second micro-batch of a layer on, the worker's experts run
    // right after they ran: the profile's next-micro-batch points. The
    // pipeline has one T_e per stage: the mean over the m micro-batches.
    // (--global-fit keeps the single line of the first micro-batch.)
    const LinearFit fn = local_fit(pr.expert_next_points, b_e, fe);
    p.t_expert_next =
        x * (fn.slope * b_e + fn.intercept) * se * p.share_factor_expert / d.tp_expert;
    p.t_expert = (p.t_expert_first + (m - 1) * p.t_expert_next) / m;
  }
  if (pr.nic_bandwidth) {
    // fp32 rows; with tp_expert each shard receives every row (attention-sum).
    const UtilCurve flat = *UtilCurve::make({{1.0, 1.0}}, "flat");
    const UtilCurve& u = pr.nic_util ? *pr.nic_util : flat;
    const double row = kWireBytesPerValue * h;
    const double sent = b_a * K * row * d.tp_expert, received = rows * row;
    p.t_comm = std::max(sent / (*pr.nic_bandwidth * u.at(sent)),
                        received / (*pr.nic_bandwidth * u.at(received)));
  }
  p.t_head = (fh.slope * m * b_a + fh.intercept) * sa * p.share_factor_head;
  StageTimes t;
  t.t_a = p.t_attention;
  t.t_e = p.t_expert;
  t.t_c = p.t_comm;
  p.layers_time = iteration_time(t, d.micro_batches, moe_layers);
  // What the workers compute per step, in CPU-seconds: no schedule finishes
  // a step before the cores have done it.
  // CPU-seconds: each stage's time at the profile's share, times that share
  // (the time it would take on a core of its own), times its threads.
  p.cpu_seconds =
      s_prof *
      (A * d.attention_threads *
           (L * m * p.t_attention / p.share_factor_attention + p.t_head / p.share_factor_head) +
       N * d.tp_expert * d.expert_threads * (L * m * p.t_expert) / p.share_factor_expert);
  p.cpu_bound = p.cpu_seconds / group;
  p.shares_cores = d.threads() > cores;
  p.tbt = std::max(p.layers_time + p.t_head, p.cpu_bound);
  p.throughput = static_cast<double>(d.global_batch()) / p.tbt;
  const double bpp = bytes_per_param(pr.weights);
  p.kv_budget_bytes = static_cast<double>(o.kv_cache_mb) * (1 << 20);
  const double context = o.workload.input_len + o.workload.output_len;
  p.kv_bytes_per_worker = m * b_a * std::ceil(context / kKvBlockTokens) * kKvBlockTokens *
                          mc.kv_bytes_per_token_per_layer() * L;
  p.memory_bytes =
      A * (mc.attention_side_params() * bpp + p.kv_budget_bytes) + N * x * mc.expert_params() * bpp;
  p.memory_capacity = o.memory_bytes;
  return p;
}

std::vector<std::string> check_cpu_deployment(const CpuSearchOptions& o, const CpuDeployment& d,
                                              const CpuPrediction& p) {
  std::vector<std::string> r;
  const ModelConfig& mc = o.model;
  auto s = [](double v) { return std::to_string(v); };
  if (d.threads() > o.cores && (d.attention_threads > 1 || d.expert_threads > 1)) {
    r.push_back("cores: " + std::to_string(d.threads()) + " compute threads on " +
                std::to_string(o.cores) + " cores (shared cores only with one thread per worker)");
  }
  if (d.processes() > 128) r.push_back("processes: more than the runtime's 128");
  if (d.micro_batches > 16) r.push_back("micro_batches: the runtime runs at most 16");
  if (mc.experts % d.expert_workers != 0) {
    r.push_back("expert_workers: " + std::to_string(d.expert_workers) + " does not divide the " +
                std::to_string(mc.experts) + " experts");
  }
  if (mc.expert_ffn % d.tp_expert != 0) {
    r.push_back("tp_expert: " + std::to_string(d.tp_expert) + " does not divide the FFN width " +
                std::to_string(mc.expert_ffn));
  }
  if (p.memory_capacity > 0 && p.memory_bytes > p.memory_capacity) {
    r.push_back("memory: weights + KV budgets " + s(p.memory_bytes / 1e9) + " GB of " +
                s(p.memory_capacity / 1e9) + " GB");
  }
  if (p.kv_bytes_per_worker > p.kv_budget_bytes) {
    r.push_back("kv_budget: " + std::to_string(d.micro_batches * d.batch_per_micro_batch) +
                " requests need " + s(p.kv_bytes_per_worker / (1 << 20)) +
                " MiB of KV on an attention worker, its budget is " +
                std::to_string(o.kv_cache_mb) + " MiB");
  }
  if (p.tbt > o.slo) {
    r.push_back("slo: TBT " + s(p.tbt * 1e3) + " ms exceeds the " + s(o.slo * 1e3) + " ms SLO");
  }
  if (d.global_batch() > o.max_batch) {
    r.push_back("max_batch: global batch " + std::to_string(d.global_batch()) + " exceeds " +
                std::to_string(o.max_batch));
  }
  return r;
}

StatusOr<std::vector<CpuPlan>> search_cpu_plans(const CpuSearchOptions& o) {
  const ModelConfig& mc = o.model;
  if (o.cores < 1) return invalid_argument("--cores must be >= 1");
  auto pick = [](int fixed, std::vector<int> all) {
    return fixed > 0 ? std::vector<int>{fixed} : all;
  };
  std::vector<int> upto_cores, upto_2cores;
  for (int i = 1; i <= o.cores; ++i) upto_cores.push_back(i);
  for (int i = 1; i <= 2 * o.cores; ++i) upto_2cores.push_back(i);
  std::vector<int> ms;
  for (int i = 1; i <= o.max_micro_batches; ++i) ms.push_back(i);
  std::vector<int> tps;
  for (int t = 1; t <= o.cores; t *= 2) tps.push_back(t);
  std::vector<CpuPlan> plans;
  for (int A : pick(o.attention_workers, upto_2cores)) {
    for (int N : pick(o.expert_workers, divisors(mc.experts))) {
      for (int tp : pick(o.tp_expert, tps)) {
        for (int ta : pick(o.attention_threads, upto_cores)) {
          for (int te : pick(o.expert_threads, upto_cores)) {
            for (int m : pick(o.micro_batches, ms)) {
              CpuDeployment d{A, N, m, tp, ta, te, 1};
              // Cores: threads within them, or every worker one thread on
              // shared cores (processes up to twice the cores).
              const bool shared = ta == 1 && te == 1 && d.processes() <= 2 * o.cores;
              if (d.threads() > o.cores && !shared) continue;
              auto ok = [&](int64_t b) {
                d.batch_per_micro_batch = b;
                return check_cpu_deployment(o, d, predict_cpu(o, d)).empty();
              };
              int64_t lo = 1, hi = std::max<int64_t>(1, o.max_batch / (int64_t{A} * m));
              if (o.batch_per_micro_batch > 0) lo = hi = o.batch_per_micro_batch;
              if (!ok(lo)) continue;
              while (lo < hi) {  // largest feasible b_a: time and KV grow with it
                const int64_t mid = lo + (hi - lo + 1) / 2;
                if (ok(mid)) {
                  lo = mid;
                } else {
                  hi = mid - 1;
                }
              }
              d.batch_per_micro_batch = lo;
              CpuPlan p{d, predict_cpu(o, d)};
              CpuDeployment more = d;
              more.batch_per_micro_batch = lo + 1;
              const auto why = check_cpu_deployment(o, more, predict_cpu(o, more));
              p.predicted.binds =
                  why.empty() ? "fixed" : why.front().substr(0, why.front().find(':'));
              plans.push_back(p);
            }
          }
        }
      }
    }
  }
  if (plans.empty()) {
    return invalid_argument("no CPU deployment of " + mc.name + " fits " + std::to_string(o.cores) +
                            " cores, the memory, the KV budget and the SLO (try --slo-ms, "
                            "--kv-cache-mb or fewer fixed flags)");
  }
  std::stable_sort(plans.begin(), plans.end(), [](const CpuPlan& a, const CpuPlan& b) {
    if (a.predicted.throughput != b.predicted.throughput) {
      return a.predicted.throughput > b.predicted.throughput;
    }
    return a.deployment.processes() < b.deployment.processes();
  });
  return plans;
}

Json CpuPrediction::to_json() const {
  return Json{{"throughput_tokens_per_s", throughput},
              {"tbt_ms", tbt * 1e3},
              {"t_attention_ms", t_attention * 1e3},
              {"t_expert_ms", t_expert * 1e3},
              {"t_comm_ms", t_comm * 1e3},
              {"t_head_ms", t_head * 1e3},
              {"t_dense_layer_ms", t_dense_layer * 1e3},
              {"t_attention_first_ms", t_attention_first * 1e3},
              {"t_attention_next_ms", t_attention_next * 1e3},
              {"t_expert_first_ms", t_expert_first * 1e3},
              {"t_expert_next_ms", t_expert_next * 1e3},
              {"layers_ms", layers_time * 1e3},
              {"cpu_seconds_per_step", cpu_seconds},
              {"cpu_bound_ms", cpu_bound * 1e3},
              {"shares_cores", shares_cores},
              {"group_cores", group_cores},
              {"share_factor_attention", share_factor_attention},
              {"share_factor_expert", share_factor_expert},
              {"share_factor_head", share_factor_head},
              {"rows_per_expert", rows_per_expert},
              {"k1_ms_per_token", k1 * 1e3},
              {"k2_ms", k2 * 1e3},
              {"k3_ms_per_token", k3 * 1e3},
              {"k4_ms", k4 * 1e3}};
}

namespace {

Json deployment_json(const ModelConfig& mc, const CpuSearchOptions& o, const CpuDeployment& d) {
  return Json{{"attention_workers", d.attention_workers},
              {"expert_workers", d.expert_workers},
              {"experts_per_worker", mc.experts / d.expert_workers},
              {"tp_expert", d.tp_expert},
              {"expert_tp_reduction", d.tp_expert > 1 ? "attention-sum" : "none"},
              {"attention_threads", d.attention_threads},
              {"expert_threads", d.expert_threads},
              {"micro_batches", d.micro_batches},
              {"batch_per_micro_batch", d.batch_per_micro_batch},
              {"global_batch", d.global_batch()},
              {"processes", d.processes()},
              {"threads", d.threads()},
              {"kv_cache_mb", o.kv_cache_mb}};
}

}  // namespace

Json cpu_plan_document(const CpuSearchOptions& o, const std::vector<CpuPlan>& plans,
                       size_t alternatives) {
  const CpuPlan& best = plans.front();
  const CpuProfile& pr = o.profile;
  Json doc;
  doc["devices"] = "cpu";
  doc["plan"] = deployment_json(o.model, o, best.deployment);
  doc["predicted"] = best.predicted.to_json();
  const auto why = check_cpu_deployment(o, best.deployment, best.predicted);
  doc["constraints"] = {
      {"holds", why.empty()},
      {"binds", best.predicted.binds},
      {"reasons", why},
      {"memory_gb", best.predicted.memory_bytes / 1e9},
      {"memory_capacity_gb", best.predicted.memory_capacity / 1e9},
      {"kv_mib_per_attention_worker", best.predicted.kv_bytes_per_worker / (1 << 20)},
      {"kv_budget_mib", o.kv_cache_mb},
      {"threads", best.deployment.threads()},
      {"cores", o.cores}};
  doc["machine"] = {{"cores", o.cores}, {"memory_gb", o.memory_bytes / 1e9}};
  doc["model"] = o.model.to_json();
  Json sm{{"source", pr.source},
          {"profile_threads", pr.threads},
          {"profile_seq_len", pr.seq_len},
          {"weights", pr.weights},
          {"k1_ms_per_token", pr.k1 * 1e3},
          {"k2_ms", pr.k2 * 1e3},
          {"k3_ms_per_token", pr.k3 * 1e3},
          {"k4_ms", pr.k4 * 1e3},
          {"head_ms_per_token", pr.head_per_token * 1e3},
          {"head_ms", pr.head * 1e3},
          {"has_head", pr.has_head},
          {"profile_cpu_share", pr.cpu_share},
          {"local_fit", o.local_fit},
          {"wire_bytes_per_token", kWireBytesPerValue * o.model.hidden}};
  if (pr.nic_bandwidth) sm["transport_gb_s"] = *pr.nic_bandwidth / 1e9;
  if (pr.nic_util) sm["transport_util_curve"] = pr.nic_util->to_json();
  doc["stage_model"] = sm;
  doc["search"] = {{"objective", "decode tokens/s of the machine"},
                   {"slo_ms", o.slo * 1e3},
                   {"workload",
                    {{"name", o.workload.name},
                     {"input_len", o.workload.input_len},
                     {"output_len", o.workload.output_len}}},
                   {"seq_len", o.workload.mean_decode_context()},
                   {"max_micro_batches", o.max_micro_batches},
                   {"max_batch", o.max_batch},
                   {"candidates", plans.size()}};
  Json alts = Json::array();
  for (size_t i = 1; i < plans.size() && i <= alternatives; ++i) {
    Json a = deployment_json(o.model, o, plans[i].deployment);
    a["predicted"] = plans[i].predicted.to_json();
    a["binds"] = plans[i].predicted.binds;
    alts.push_back(a);
  }
  doc["alternatives"] = alts;
  return doc;
}

bool is_cpu_plan_document(const Json& j) {
  return j.is_object() && j.contains("devices") && j["devices"].is_string() &&
         j["devices"].get<std::string>() == "cpu";
}

StatusOr<CpuDeployment> cpu_deployment_from_plan_document(const Json& j, const std::string& source,
                                                          const ModelConfig& model) {
  JsonFields doc(j, source);
  MSI_RETURN_IF_ERROR(doc.expect_object());
  MSI_ASSIGN_OR_RETURN(JsonFields f, doc.object("plan"));
  CpuDeployment d;
  MSI_ASSIGN_OR_RETURN(int64_t a, f.integer_in("attention_workers", 1, 128));
  MSI_ASSIGN_OR_RETURN(int64_t n, f.integer_in("expert_workers", 1, 128));
  MSI_ASSIGN_OR_RETURN(int64_t m, f.integer_in("micro_batches", 1, 16));
  MSI_ASSIGN_OR_RETURN(int64_t tp, f.integer_in("tp_expert", 1, 128));
  MSI_ASSIGN_OR_RETURN(int64_t ta, f.integer_in("attention_threads", 1, 4096));
  MSI_ASSIGN_OR_RETURN(int64_t te, f.integer_in("expert_threads", 1, 4096));
  MSI_ASSIGN_OR_RETURN(int64_t b, f.integer_in("batch_per_micro_batch", 1, int64_t{1} << 24));
  d = CpuDeployment{static_cast<int>(a),
                    static_cast<int>(n),
                    static_cast<int>(m),
                    static_cast<int>(tp),
                    static_cast<int>(ta),
                    static_cast<int>(te),
                    b};
  if (f.has("global_batch")) {
    MSI_ASSIGN_OR_RETURN(int64_t g, f.integer_in("global_batch", 1, int64_t{1} << 32));
    if (g != d.global_batch()) {
      return f.field_error("global_batch",
                           "must be attention_workers x micro_batches x "
                           "batch_per_micro_batch = " +
                               std::to_string(d.global_batch()));
    }
  }
  if (model.experts % d.expert_workers != 0) {
    return f.field_error("expert_workers",
                         "must divide the model's " + std::to_string(model.experts) + " experts");
  }
  if (d.processes() > 128) return f.field_error("expert_workers", "more than 128 processes");
  return d;
}

}  // namespace msinfer::planner
