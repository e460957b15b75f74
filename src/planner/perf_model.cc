#include "msinfer/planner/perf_model.h"

#include <algorithm>
#include <cmath>

namespace msinfer::planner {
namespace {

double bytes_time(double bytes, double bandwidth, const UtilCurve& util) {
  if (bytes <= 0) return 0;
  return bytes / (bandwidth * util.at(bytes));
}

// Time for `moved` bytes to cross one GPU's link within a tp group: the
// intra-node link when the group fits a node, else the NIC.
double group_link_time(const GpuSpec& gpu, int tp, double moved, const UtilCurve& nic_util) {
  if (tp <= gpu.gpus_per_node) {
    return moved / (gpu.intra_node_bandwidth * gpu.efficiency.intra_node_link);
  }
  return bytes_time(moved, gpu.nic_bandwidth, nic_util);
}

}  // namespace

double RooflineCurve::at(double b) const {
  return std::max({b * compute_per_token, weight, b * overlapped_per_token}) +
         b * serial_per_token + overhead;
}

Json RooflineCurve::to_json() const {
  return Json{{"compute_ms_per_token", compute_per_token * 1e3},
              {"weight_ms", weight * 1e3},
              {"overlapped_ms_per_token", overlapped_per_token * 1e3},
              {"serial_ms_per_token", serial_per_token * 1e3},
              {"overhead_ms", overhead * 1e3}};
}

LinearFit fit_linear(const RooflineCurve& c, double lo, double hi) {
  lo = std::max(lo, 1e-9);
  hi = std::max(hi, lo);
  constexpr int kPoints = 33;
  // Weighted normal equations of y = k b + k0, weights 1/y^2.
  double sw = 0, swb = 0, swbb = 0, swy = 0, swby = 0;
  for (int i = 0; i < kPoints; ++i) {
    const double b = lo * std::pow(hi / lo, static_cast<double>(i) / (kPoints - 1));
    const double y = c.at(b);
    if (!(y > 0)) continue;
    const double w = 1.0 / (y * y);
    sw += w;
    swb += w * b;
    swbb += w * b * b;
    swy += w * y;
    swby += w * b * y;
  }
  LinearFit f;
  if (sw == 0) return f;
  const double det = sw * swbb - swb * swb;
  if (det > 1e-12 * sw * swbb) {
    f.slope = (sw * swby - swb * swy) / det;
    f.intercept = (swbb * swy - swb * swby) / det;
  } else {  // one batch size: all in the constant
    f.slope = 0;
    f.intercept = swy / sw;
  }
  if (f.intercept < 0) {  // through the origin
    f.intercept = 0;
    f.slope = swby / swbb;
  } else if (f.slope < 0) {
    f.slope = 0;
    f.intercept = swy / sw;
  }
  return f;
}

const char* expert_reduction_name(ExpertReduction r) {
  switch (r) {
    case ExpertReduction::kPartialSums:
      return "n2m-partial-sums";
    case ExpertReduction::kReduceToShard0:
      return "reduce-to-shard0";
    case ExpertReduction::kAllReduce:
      break;
  }
  return "allreduce-overlapped";
}

StatusOr<ExpertReduction> parse_expert_reduction(const std::string& s) {
  for (ExpertReduction r : {ExpertReduction::kAllReduce, ExpertReduction::kPartialSums,
                            ExpertReduction::kReduceToShard0}) {
    if (s == expert_reduction_name(r)) return r;
  }
  return invalid_argument(
      "expert_tp_reduction: expected allreduce-overlapped, n2m-partial-sums or "
      "reduce-to-shard0, got '" +
      s + "'");
}

double nic_transfer_time(double bytes, double connections, double bandwidth,
                         const UtilCurve& util) {
  if (bytes <= 0) return 0;
  connections = std::max(connections, 1.0);
  return bytes / (bandwidth * util.at(bytes / connections));
}

double StageModel::t_comm_attention_side(double b_a) const {
  return nic_transfer_time(b_a * dispatch_bytes_per_token, attention_connections,
                           attention_nic_bandwidth, nic_util);
}

double StageModel::t_comm_expert_side(double b_e, int n_a) const {
  return nic_transfer_time(
      b_e * expert_bytes_per_token,
      tp_attention > 0 ? static_cast<double>(std::max(n_a, 1)) * tp_attention : 1.0,
      expert_nic_bandwidth, nic_util);
}

Json StageModel::to_json() const {
  return Json{{"k1_ms_per_token", k1 * 1e3},
              {"k2_ms", k2 * 1e3},
              {"k3_ms_per_token", k3 * 1e3},
              {"k4_ms", k4 * 1e3},
              {"dispatch_bytes_per_token", dispatch_bytes_per_token},
              {"expert_bytes_per_token", expert_bytes_per_token},
              {"attention_nic_gb_s", attention_nic_bandwidth / 1e9},
              {"expert_nic_gb_s", expert_nic_bandwidth / 1e9},
              {"nic_util_curve", nic_util.to_json()},
              {"source", source},
              {"attention_connections", attention_connections},
              {"tp_attention", tp_attention},
              {"roofline_attention", attention_curve.to_json()},
              {"roofline_expert", expert_curve.to_json()},
              {"fit_range",
               {{"attention_tokens", {fit.attention_lo, fit.attention_hi}},
                {"expert_tokens", {fit.expert_lo, fit.expert_hi}}}}};
}

StatusOr<StageModel> StageModel::from_json(const JsonFields& f) {
  MSI_RETURN_IF_ERROR(f.expect_object());
  StageModel s;
  MSI_ASSIGN_OR_RETURN(double k1, f.number_in("k1_ms_per_token", 0, kMaxStageMs));
  MSI_ASSIGN_OR_RETURN(double k2, f.number_in("k2_ms", 0, kMaxStageMs));
  MSI_ASSIGN_OR_RETURN(double k3, f.number_in("k3_ms_per_token", 0, kMaxStageMs));
  MSI_ASSIGN_OR_RETURN(double k4, f.number_in("k4_ms", 0, kMaxStageMs));
  s.k1 = k1 * 1e-3;
  s.k2 = k2 * 1e-3;
  s.k3 = k3 * 1e-3;
  s.k4 = k4 * 1e-3;
  MSI_ASSIGN_OR_RETURN(s.dispatch_bytes_per_token,
                       f.number_in("dispatch_bytes_per_token", 0, 1e9, true));
  MSI_ASSIGN_OR_RETURN(s.expert_bytes_per_token,
                       f.number_in("expert_bytes_per_token", 0, 1e9, true));
  MSI_ASSIGN_OR_RETURN(double a_nic, f.number_in("attention_nic_gb_s", 0, kMaxGbS, true));
  MSI_ASSIGN_OR_RETURN(double e_nic, f.number_in("expert_nic_gb_s", 0, kMaxGbS, true));
  s.attention_nic_bandwidth = a_nic * 1e9;
  s.expert_nic_bandwidth = e_nic * 1e9;
  if (!f.has("nic_util_curve")) return f.field_error("nic_util_curve", "is missing");
  MSI_ASSIGN_OR_RETURN(s.nic_util, UtilCurve::from_json(f.json().at("nic_util_curve"),
                                                        f.where() + ".nic_util_curve"));
  MSI_ASSIGN_OR_RETURN(s.source, f.string_or("source", "plan file"));
  // Absent in plans written before the per-connection NIC model: one connection.
  MSI_ASSIGN_OR_RETURN(s.attention_connections, f.number_or("attention_connections", 1));
  if (!(s.attention_connections >= 1))
    return f.field_error("attention_connections", "must be >= 1");
  MSI_ASSIGN_OR_RETURN(int64_t tpa_c, f.integer_or("tp_attention", 1));
  if (tpa_c < 0) return f.field_error("tp_attention", "must be >= 0");
  s.tp_attention = static_cast<int>(tpa_c);
  return s;
}

StatusOr<Profile> parse_profile(const Json& j, const std::string& source) {
  JsonFields f(j, source);
  MSI_RETURN_IF_ERROR(f.expect_object());
  Profile p;
  p.source = source;
  auto opt_ms = [&](const char* key, std::optional<double>& out) -> Status {
    if (!f.has(key)) return ok_status();
    MSI_ASSIGN_OR_RETURN(double v, f.number_in(key, 0, kMaxStageMs));
    out = v * 1e-3;
    return ok_status();
  };
  MSI_RETURN_IF_ERROR(opt_ms("k1_ms_per_token", p.k1));
  MSI_RETURN_IF_ERROR(opt_ms("k2_ms", p.k2));
  MSI_RETURN_IF_ERROR(opt_ms("k3_ms_per_token", p.k3));
  MSI_RETURN_IF_ERROR(opt_ms("k4_ms", p.k4));
  // tp_attention 2147483648 used to print "H800 x1048576 ... -49 tokens/s".
  int64_t tpa = 1, tpe = 1;
  if (f.has("tp_attention")) {
    MSI_ASSIGN_OR_RETURN(tpa, f.integer_in("tp_attention", 1, kMaxGpusPerNode));
  }
  if (f.has("tp_expert")) {
    MSI_ASSIGN_OR_RETURN(tpe, f.integer_in("tp_expert", 1, kMaxGpusPerNode));
  }
  p.tp_attention = static_cast<int>(tpa);
  p.tp_expert = static_cast<int>(tpe);
  if (f.has("nic_util_curve")) {
    MSI_ASSIGN_OR_RETURN(UtilCurve c,
                         UtilCurve::from_json(j.at("nic_util_curve"), source + ": nic_util_curve"));
    p.nic_util = c;
  }
  if (f.has("nic_gb_s")) {
    MSI_ASSIGN_OR_RETURN(double bw, f.number_in("nic_gb_s", 0, kMaxGbS, true));
    p.nic_bandwidth = bw * 1e9;
  }
  if (!p.k1 && !p.k2 && !p.k3 && !p.k4 && !p.nic_util && !p.nic_bandwidth) {
    return invalid_argument(source +
                            ": holds none of k1_ms_per_token, k2_ms, k3_ms_per_token, k4_ms, "
                            "nic_util_curve, nic_gb_s");
  }
  return p;
}

StatusOr<Profile> load_profile(const std::string& path) {
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  return parse_profile(j, path);
}

double reduce_to_first_time(const GpuSpec& gpu, int tp, double bytes, const UtilCurve& nic_util) {
  if (tp <= 1 || bytes <= 0) return 0;
  return group_link_time(gpu, tp, (tp - 1) * bytes, nic_util);
}

double allreduce_time(const GpuSpec& gpu, int tp, double bytes, const UtilCurve& nic_util) {
  if (tp <= 1 || bytes <= 0) return 0;
  return group_link_time(gpu, tp, 2.0 * (tp - 1) / tp * bytes, nic_util);
}

StageModel build_stage_model(const ModelConfig& model, const DeploymentShape& shape, double seq_len,
                             const UtilCurve& nic_util, const Profile* profile,
                             const FitRange& fit) {
  const GpuSpec& ga = shape.attention_gpu;
  const GpuSpec& ge = shape.expert_gpu;
  const int tpa = shape.tp_attention, tpe = shape.tp_expert;
  const double h = static_cast<double>(model.hidden);
  const double L = model.layers, Lm = model.moe_layers;
  StageModel s;
  s.source = "roofline";

  // Attention side, per MoE layer and micro-batch (dense layers and LM head spread over them).
  const double w_bytes_a = 2.0 * model.attention_side_params() / Lm / tpa;
  // A sliding layer reads its window, not the whole context (gpt-oss).
  const double attended = model.attended_tokens(seq_len);
  const double kv_bytes_a =
      model.kv_bytes_per_token_per_layer_per_attention_rank(tpa) * attended * (L / Lm);
  const double flops_dense_a = model.attention_side_flops_per_token_per_moe_layer() / tpa;
  const double flops_score_a = model.attention_score_flops(attended) * (L / Lm) / tpa;
  const double bw_a = ga.memory_bandwidth * ga.efficiency.memory_bandwidth;
  const double fl_a = ga.bf16_flops * ga.efficiency.compute;
  // One all-reduce of the token's hidden state after O-proj per layer, one more
  // after the shared-expert FFN when the model has one.
  const double allreduces_a = (L / Lm) * (1.0 + (model.shared_expert_ffn > 0 ? 1.0 : 0.0));
  const double ar_a = allreduces_a * allreduce_time(ga, tpa, 2 * h, nic_util);
  RooflineCurve& ca = s.attention_curve;
  ca.compute_per_token = flops_dense_a / fl_a;
  ca.weight = w_bytes_a / bw_a;
  // Decode attention is one kernel per layer that streams the KV cache and computes
  // the scores as it goes: the larger of the two, per token; the all-reduce after
  // O-proj (and the shared expert) feeds the next op, so it runs in series.
  ca.serial_per_token = std::max(kv_bytes_a / bw_a, flops_score_a / fl_a) + ar_a;
  ca.overhead = ga.efficiency.attention_layer_overhead_s;

  // Expert side, one expert node (x experts), per layer and micro-batch: the
  // rows it gets are spread over its x experts, so the arithmetic per row is an
  // expert's and the weights streamed are x experts'; one grouped-GEMM launch.
  const double x = std::max(shape.experts_per_node, 1);
  const double w_bytes_e = x * 2.0 * 3.0 * h * model.expert_ffn / tpe;
  const double bw_e = ge.memory_bandwidth * ge.efficiency.memory_bandwidth;
  const double fl_e = ge.bf16_flops * ge.efficiency.compute;
  const double ar_e = allreduce_time(ge, tpe, 2 * h, nic_util);
  const double r0_e = reduce_to_first_time(ge, tpe, 2 * h, nic_util);
  const bool partial_sums = tpe > 1 && shape.expert_reduction == ExpertReduction::kPartialSums;
  const bool to_shard0 = tpe > 1 && shape.expert_reduction == ExpertReduction::kReduceToShard0;
  const bool overlapped = tpe > 1 && shape.expert_reduction == ExpertReduction::kAllReduce;
  RooflineCurve& ce = s.expert_curve;
  ce.compute_per_token = model.expert_flops_per_token() / tpe / fl_e;
  ce.weight = w_bytes_e / bw_e;
  // The row-parallel output is reduced by a collective among the shards,
  // pipelined with the GEMMs (the all-gather of the input slices moves (tp-1)/tp
  // of a row, the all-reduce 2(tp-1)/tp: 1.5x the all-reduce), by shard 0
  // receiving the other shards' partial rows after the GEMMs, or not at all.
  ce.overlapped_per_token = overlapped ? 1.5 * ar_e : 0.0;
  if (to_shard0) ce.serial_per_token += r0_e;
  ce.overhead = ge.efficiency.expert_layer_overhead_s;
  if (partial_sums) {
    // The attention side reads the tp_e partial rows of each of its K experts
    // and adds them into the residual.
    ca.serial_per_token += 2.0 * h * model.top_k * tpe / tpa / bw_a;
  }

  s.fit = fit;
  const LinearFit fa = fit_linear(ca, fit.attention_lo, fit.attention_hi);
  const LinearFit fe = fit_linear(ce, fit.expert_lo, fit.expert_hi);
  s.k1 = fa.slope;
  s.k2 = fa.intercept;
  s.k3 = fe.slope;
  s.k4 = fe.intercept;

  // bf16 rows; with partial sums every expert shard gets (and returns) a whole
  // row; reducing to shard 0 sends every shard the whole row and takes one row
  // back (T_c is one-way and the same both ways here: the dispatch's, the
  // larger).
  const bool whole_rows = partial_sums || to_shard0;
  s.dispatch_bytes_per_token = 2.0 * h * model.top_k / tpa * (whole_rows ? tpe : 1);
  s.expert_bytes_per_token = whole_rows ? 2.0 * h : 2.0 * h / tpe;
  s.attention_nic_bandwidth = ga.nic_bandwidth;
  s.expert_nic_bandwidth = ge.nic_bandwidth;
  s.nic_util = nic_util;
  s.attention_connections = static_cast<double>(model.experts) / x * tpe;
  s.tp_attention = tpa;

  if (profile != nullptr) {
    const double sa = static_cast<double>(profile->tp_attention) / tpa;
    const double se = static_cast<double>(profile->tp_expert) / tpe;
    if (profile->k1) s.k1 = *profile->k1 * sa + ar_a;
    if (profile->k2) s.k2 = *profile->k2 * sa;
    if (profile->k3) {
      s.k3 = *profile->k3 * se + (overlapped ? 1.5 * ar_e : 0.0) + (to_shard0 ? r0_e : 0.0);
    }
    // A measured k4 is one expert's weight streaming and launch: a node of x
    // experts streams x times the weights (its one launch counted x times too).
    if (profile->k4) s.k4 = *profile->k4 * se * x;
    if (profile->nic_util) {
      // `msinfer bench m2n` keys its curve by the bytes one sender sends over all
      // its receivers at the bench's fan-out: read it at the total, as measured.
      s.nic_util = *profile->nic_util;
      s.attention_connections = 1;
      s.tp_attention = 0;  // expert side: one connection too (see t_comm_expert_side)
    }
    if (profile->nic_bandwidth) {
      s.attention_nic_bandwidth = s.expert_nic_bandwidth = *profile->nic_bandwidth;
    }
    s.source = "profile " + profile->source;
  }
  return s;
}

double attention_node_bytes(const ModelConfig& model, int m, double b_a, double seq_len, int tp) {
  return model.kv_bytes_per_token_per_layer_per_attention_rank(tp) * tp * m * b_a *
             model.attended_tokens(seq_len) * model.layers +
         2.0 * model.attention_side_params();
}

double attention_node_capacity(const GpuSpec& gpu, int tp) {
  return tp * gpu.memory_bytes * gpu.efficiency.memory_usable;
}

double expert_node_bytes(const ModelConfig& model, int experts_per_node) {
  return 2.0 * model.expert_params() * std::max(experts_per_node, 1);
}

double expert_node_capacity(const GpuSpec& gpu, int tp) {
  return tp * gpu.memory_bytes * gpu.efficiency.memory_usable;
}

double expert_gemm_utilization(double b_e, const GpuSpec& gpu) {
  return std::min(b_e * gpu.memory_bandwidth / gpu.bf16_flops, 1.0);
}

double spec_iteration_time(const StageTimes& t, int m, int layers) {
  return (t.t_a + t.t_e + 2 * t.t_c) + t.t_f() * (static_cast<double>(m) * layers - 1);
}

double iteration_time(const StageTimes& t, int m, int layers) {
  const double round_trip = t.t_a + t.t_e + 2 * t.t_c;
  const double slowest = std::max({t.t_a, t.t_e, t.t_c});
  const double period = std::max(m * slowest, round_trip);
  return round_trip + (layers - 1) * period + (m - 1) * slowest;
}

bool full_overlap(const StageTimes& t, int m) {
  const double tf = t.t_f();
  return t.t_c < tf && m * tf >= 2 * (tf + t.t_c);
}

int min_micro_batches_for_overlap(const StageTimes& t) {
  const double tf = t.t_f();
  if (tf <= 0) return 1;
  return std::max(1, static_cast<int>(std::ceil(2.0 * (1.0 + t.t_c / tf) - 1e-12)));
}

RuntimeReductionChoice prefer_runtime_expert_reduction(const ModelConfig& model,
                                                       const GpuSpec& host,
                                                       const RuntimeShape& shape,
                                                       const UtilCurve& nic_util) {
  const double A = shape.attention_workers, N = shape.expert_workers;
  const double E = static_cast<double>(model.experts);
  const double b_a = shape.tokens_per_micro_batch;
  const double rows_per_worker = b_a * A * model.top_k / N;  // one micro-batch, one layer
  auto times = [&](ExpertReduction r) {
    const DeploymentShape d{host, host, shape.tp_attention, shape.tp_expert, r};
    const StageModel s = build_stage_model(model, d, shape.seq_len, nic_util);
    StageTimes t;
    t.t_a = s.attention_curve.at(b_a);
    // One GEMM per expert the worker holds, each on its share of the rows.
    t.t_e = E / N * s.expert_curve.at(rows_per_worker * N / E);
    t.t_c = s.t_comm(b_a, rows_per_worker, shape.attention_workers);
    return t;
  };
  RuntimeReductionChoice c;
  c.partial_sums = times(ExpertReduction::kPartialSums);
  c.reduce_to_shard0 = times(ExpertReduction::kReduceToShard0);
  c.partial_sums_step = iteration_time(c.partial_sums, shape.micro_batches, model.moe_layers);
  c.reduce_to_shard0_step =
      iteration_time(c.reduce_to_shard0, shape.micro_batches, model.moe_layers);
  // Partial sums unless reducing to shard 0 is clearly faster: it needs no
  // step among the shards, and the model does not count the extra message per
  // layer and micro-batch the reduce costs (no per-message latency in it).
  c.preferred = c.reduce_to_shard0_step * kReduceToShard0MinGain < c.partial_sums_step
                    ? ExpertReduction::kReduceToShard0
                    : ExpertReduction::kPartialSums;
  return c;
}

}  // namespace msinfer::planner
