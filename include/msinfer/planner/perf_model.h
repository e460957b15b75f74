// The performance model of docs/PLANNER.md section 3b: per-layer, per-micro-batch stage
// times of one deployment shape, and the closed forms of section 3.
//
//   T_a(b_a) = k1*b_a + k2     attention worker, one layer, one micro-batch
//   T_e(b_e) = k3*b_e + k4     expert worker,    one layer, one micro-batch
//   T_c      = max(sender side, receiver side) one-way M2N transfer time
//
// k1..k4 come from a measured profile (msinfer profile) or, without one, are
// fitted to a roofline of the catalogued GPUs (RooflineCurve: per GEMM the
// larger of arithmetic and weight streaming, plus what really runs in series)
// over the batch range the search explores.
// All times are seconds, sizes bytes, rates bytes/s.
#pragma once

#include <optional>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/planner/catalog.h"
#include "msinfer/core/model_config.h"

namespace msinfer::planner {

// One worker's time per layer and micro-batch as the hardware behaves, for a
// batch of b tokens:
//   T(b) = max(b*compute, weight, b*overlapped) + b*serial + overhead
// compute: GEMM FLOPs per token / achievable FLOP/s; weight: weight bytes /
// achievable HBM bandwidth (a decode GEMM's FLOPs per weight byte is b for every
// GEMM, so the max of the sums equals the sum of the per-GEMM maxima);
// overlapped: a collective pipelined with the GEMMs; serial: kernels that run
// after one another per token (KV reads, un-fused collectives); overhead: the
// fixed launch/sync cost per layer.
struct RooflineCurve {
  double compute_per_token = 0;
  double weight = 0;
  double overlapped_per_token = 0;
  double serial_per_token = 0;
  double overhead = 0;
  double at(double b) const;
  Json to_json() const;
};

// The straight line k*b + k0 closest to `c` in relative error at 33 batch sizes
// spaced geometrically over [lo, hi] (weighted least squares, weights 1/T^2), with
// k, k0 >= 0. Exact where the curve is linear over the range.
struct LinearFit {
  double slope = 0, intercept = 0;
};
LinearFit fit_linear(const RooflineCurve& c, double lo, double hi);

// Batch ranges k1/k2 (b_a, tokens per attention micro-batch) and k3/k4 (b_e, tokens
// per expert) are fitted over. The default spans what the search's doubling
// explores; the search then refits around the batch it settles on.
struct FitRange {
  double attention_lo = 1, attention_hi = 4096;
  double expert_lo = 1, expert_hi = 4096;
};

struct StageModel {
  // k3, k4 describe one expert node: T_e(rows) for the rows landing on any of
  // its experts (with one expert per node, rows = b_e).
  double k1 = 0, k2 = 0, k3 = 0, k4 = 0;
  double dispatch_bytes_per_token = 0;  // bytes one attention GPU sends per token (K*h*2/tp_a)
  double expert_bytes_per_token = 0;    // bytes one expert GPU receives per token (h*2/tp_e)
  double attention_nic_bandwidth = 0;   // bytes/s of one attention GPU's NIC
  double expert_nic_bandwidth = 0;      // bytes/s of one expert GPU's NIC
  UtilCurve nic_util;
  std::string source;  // "roofline" or "profile <file>"
  // The roofline curves k1..k4 were fitted to and the range (informational; a
  // plan file read back does not carry them).
  RooflineCurve attention_curve, expert_curve;
  FitRange fit;

  // Concurrent connections: one attention GPU sends to every expert GPU
  // (n_e * tp_e, n_e = E / experts per node); one expert GPU hears from every
  // attention GPU (n_a * tp_a).
  double attention_connections = 1;
  int tp_attention = 1;

  double t_attention(double b_a) const { return k1 * b_a + k2; }
  double t_expert(double b_e) const { return k3 * b_e + k4; }
  // One-way time for one attention worker to send (or receive) a micro-batch of b_a tokens.
  double t_comm_attention_side(double b_a) const;
  // One-way time for one expert worker to receive (or send) b_e tokens from n_a attention nodes.
  double t_comm_expert_side(double b_e, int n_a = 1) const;
  double t_comm(double b_a, double b_e, int n_a = 1) const {
    double a = t_comm_attention_side(b_a), e = t_comm_expert_side(b_e, n_a);
    return a > e ? a : e;
  }

  Json to_json() const;
  static StatusOr<StageModel> from_json(const JsonFields& f);
};

// A measured profile (written by `msinfer profile`, NIC curve by `msinfer bench m2n`).
// k1..k4 were measured at tp_attention / tp_expert; other tp sizes scale them by
// tp_measured / tp (ideal tensor parallelism) and add the all-reduce from the roofline.
struct Profile {
  std::optional<double> k1, k2, k3, k4;  // seconds (file holds milliseconds)
  int tp_attention = 1;
  int tp_expert = 1;
  std::optional<UtilCurve> nic_util;
  std::optional<double> nic_bandwidth;  // bytes/s, replaces the catalogue's NIC rate
  std::string source;
};

// Valid ranges of a profile's fields (docs/PLANNER.md): k1..k4 in [0, kMaxStageMs]
// milliseconds, tp_attention / tp_expert in 1..kMaxGpusPerNode, nic_gb_s in
// (0, kMaxGbS], nic_util_curve as in the catalogue. Anything else is refused.
inline constexpr double kMaxStageMs = 1e6;
StatusOr<Profile> parse_profile(const Json& j, const std::string& source);
StatusOr<Profile> load_profile(const std::string& path);

// How the tp_e shards of an expert combine their row-parallel partial outputs.
//  kAllReduce: the shards receive a 1/tp_e slice of each row, all-gather it and
//    all-reduce the output among themselves, pipelined with the GEMMs in chunks
//    (the collective overlaps the arithmetic instead of following it);
//  kPartialSums: no collective among expert GPUs: every shard receives the whole
//    row over M2N and sends its partial output back over N2M (tp_e times the bytes
//    both ways); the attention side adds the tp_e partials into the residual.
//  kReduceToShard0: what the runtime's `--tp-expert-reduce allreduce` builds:
//    every shard receives the whole row (tp_e times the dispatch bytes, as with
//    partial sums), the shards 1.. send their partial rows to shard 0 after
//    their GEMMs (in series with them), shard 0 adds and answers with one row.
//    The search does not consider it (allreduce-overlapped does the same job
//    with fewer bytes and no serial step); prefer_runtime_expert_reduction does.
enum class ExpertReduction { kAllReduce, kPartialSums, kReduceToShard0 };
// "allreduce-overlapped", "n2m-partial-sums", "reduce-to-shard0"
const char* expert_reduction_name(ExpertReduction r);
StatusOr<ExpertReduction> parse_expert_reduction(const std::string& s);

struct DeploymentShape {
  GpuSpec attention_gpu;
  GpuSpec expert_gpu;
  int tp_attention = 1;
  int tp_expert = 1;
  ExpertReduction expert_reduction = ExpertReduction::kAllReduce;  // matters when tp_expert > 1
  // Routed experts one expert node (a group of tp_expert GPUs) holds, for every
  // MoE layer; the model's experts divide evenly over E / experts_per_node nodes.
  // The node runs one grouped GEMM per layer and micro-batch over its experts:
  // its weights stream x times an expert's, its rows are the top-K rows landing
  // on any of them (the expert curve's batch is the node's rows, not b_e).
  int experts_per_node = 1;
};

// k1..k4 and the transfer model for `shape`, from the roofline or from `profile`.
StageModel build_stage_model(const ModelConfig& model, const DeploymentShape& shape, double seq_len,
                             const UtilCurve& nic_util, const Profile* profile = nullptr,
                             const FitRange& fit = FitRange{});

// Time for one NIC of `bandwidth` bytes/s to move `bytes` split evenly over
// `connections` concurrent (sender, receiver) messages. Every message goes
// through the same NIC pipeline and pays its own per-message cost, so the
// NIC runs at the utilisation of the message it actually carries:
//   bytes / (BW * util(bytes / connections))
// (the x axis of the catalogue's curve is one message, as in an RDMA write
// bandwidth test; adding peers shrinks each message and lowers utilisation).
double nic_transfer_time(double bytes, double connections, double bandwidth, const UtilCurve& util);

// Time for shard 0 of a group of `tp` GPUs to receive the other tp - 1 shards'
// `bytes` each (intra-node link when tp fits a node, else the NIC).
double reduce_to_first_time(const GpuSpec& gpu, int tp, double bytes, const UtilCurve& nic_util);

// All-reduce time of `bytes` per GPU over a group of `tp` GPUs (ring: 2(tp-1)/tp
// of the data crosses each link). Intra-node link when tp fits a node, else the NIC.
double allreduce_time(const GpuSpec& gpu, int tp, double bytes, const UtilCurve& nic_util);

// Bytes an attention node of tp GPUs needs: bf16 KV cache of m micro-batches
// of b_a requests at context s (KV heads replicated over tp > kv_heads ranks
// counted once per rank), plus bf16 weights (docs/PLANNER.md 3b's memory
// constraint).
double attention_node_bytes(const ModelConfig& model, int m, double b_a, double seq_len,
                            int tp = 1);
double attention_node_capacity(const GpuSpec& gpu, int tp);  // tp * C * memory_usable
// bf16 weights of the routed experts one expert node holds (all MoE layers).
double expert_node_bytes(const ModelConfig& model, int experts_per_node = 1);
double expert_node_capacity(const GpuSpec& gpu, int tp);

// Roofline utilisation of an expert GEMM with b_e tokens: min(b_e * W / F, 1).
double expert_gemm_utilization(double b_e, const GpuSpec& gpu);

// Closed forms of docs/PLANNER.md section 3b, for one micro-batch's stage times.
struct StageTimes {
  double t_a = 0, t_e = 0, t_c = 0;
  double t_f() const { return t_a > t_e ? t_a : t_e; }
};

// A deployment as the runtime runs it (docs/RUNTIME.md): attention_workers
// replicas of tp_attention processes, expert_workers groups of tp_expert
// shards, the experts spread evenly over the expert workers, m micro-batches
// of `tokens_per_micro_batch` decode tokens per attention worker at context
// `seq_len`.
struct RuntimeShape {
  int attention_workers = 1, expert_workers = 1, micro_batches = 1;
  int tp_attention = 1, tp_expert = 2;
  double tokens_per_micro_batch = 1;
  double seq_len = 512;
};
// The runtime's expert-tp reductions (kPartialSums = attention-sum,
// kReduceToShard0 = allreduce) on `host` (every worker on one such device;
// its NIC and intra-node link are the transport between workers), by this
// model: per micro-batch stage times (an expert worker's T_e covers all its
// experts) and the time of one decode step over every layer. It prefers
// partial sums unless reducing to shard 0 is kReduceToShard0MinGain times
// faster.
inline constexpr double kReduceToShard0MinGain = 1.05;
struct RuntimeReductionChoice {
  ExpertReduction preferred = ExpertReduction::kPartialSums;
  StageTimes partial_sums, reduce_to_shard0;
  double partial_sums_step = 0, reduce_to_shard0_step = 0;  // seconds
};
RuntimeReductionChoice prefer_runtime_expert_reduction(const ModelConfig& model,
                                                       const GpuSpec& host,
                                                       const RuntimeShape& shape,
                                                       const UtilCurve& nic_util);
// The paper's T_total = (T_a + T_e + 2T_c) + T_f (mL - 1): exact under full overlap.
double spec_iteration_time(const StageTimes& t, int m, int layers);
// Generalised iteration time, equal to spec_iteration_time under full overlap:
//   R = T_a + T_e + 2T_c (one micro-batch's round trip through a layer)
//   T_s = max(T_a, T_e, T_c) (the slowest stage, network included)
//   P = max(m T_s, R)        (period of one layer for all m micro-batches)
//   T = R + (L-1) P + (m-1) T_s
double iteration_time(const StageTimes& t, int m, int layers);
// The full-overlap conditions of docs/PLANNER.md 3b: m >= 2(1 + T_c/T_f) and T_c < T_f.
bool full_overlap(const StageTimes& t, int m);
// The smallest m that satisfies condition (3).
int min_micro_batches_for_overlap(const StageTimes& t);

}  // namespace msinfer::planner
