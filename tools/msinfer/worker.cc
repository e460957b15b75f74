// msinfer worker: one attention or expert worker process of a disaggregated
// deployment. Started by the router (generate/serve on one host) or by mpirun /
// srun on many hosts; the bootstrap comes from the environment.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "msinfer/bench/machine.h"
#include "msinfer/core/flags.h"
#include "msinfer/model/safetensors.h"
#include "msinfer/planner/cpu_plan.h"
#include "msinfer/planner/perf_model.h"
#include "msinfer/planner/plan.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/disaggregated.h"
#include "msinfer/runtime/router.h"
#include "planner_flags.h"

namespace msinfer::cli {

void add_deployment_flags(FlagSet& flags) {
  flags.add_int("attention-workers", 0, 0, 128,
                "attention worker processes n_a (0: co-located engine)");
  flags.add_int("expert-workers", 0, 0, 128, "expert worker processes N");
  flags.add_int("micro-batches", 1, 1, 16, "micro-batches m per attention worker (ping-pong)");
  flags.add_string("placement", "", "placement JSON: experts over expert workers, with replicas");
  flags.add_string("fabric-provider", "",
                   "M2N transport: direct | socket (msinfer's own: shared memory within a host,\n"
                   "TCP) | shm | tcp | verbs | efa (libfabric providers); default: direct for a\n"
                   "local deployment, socket for one launched by mpirun/srun",
                   "MSINFER_FABRIC_PROVIDER");
  flags.add_int("prefill-workers", 0, 0, 64,
                "prefill/decode disaggregation: processes (each a co-located engine with every\n"
                "weight) that compute the prompts; each sequence's K/V then moves over the\n"
                "M2N transport to the attention worker that decodes it (requests of n = 1;\n"
                "0: the attention workers prefill; docs/RUNTIME.md)");
  flags.add_int("kv-transfer-mb", 64, 1, 1 << 20,
                "with --prefill-workers: each attention worker's K/V staging region, for a\n"
                "sequence whose blocks are not free in its KV pool when it arrives (the others\n"
                "are written straight into the pool); one larger than that is prefilled again\n"
                "on the attention worker");
  flags.add_int("timeout-ms", 10000, 100, 3600000,
                "M2N timeout: a worker silent this long is reported failed");
  flags.add_bool("resubmit",
                 "when an attention worker dies, resubmit its requests to another one (prompt\n"
                 "plus the tokens delivered; greedy output unchanged) instead of failing them");
  flags.add_bool("respawn",
                 "when an expert worker dies, start a replacement that joins the running\n"
                 "workers and takes its experts back (serving pauses meanwhile if some of\n"
                 "them have no replica; local deployments on the direct or socket transport,\n"
                 "without tp); when any other worker dies and the deployment cannot go on\n"
                 "without it, restart the workers with a replacement and resubmit every\n"
                 "request in flight (at most 3 of each). Without this flag an expert worker\n"
                 "whose experts all have replicas is still dropped in place");
  flags.add_string("routing", "cache-aware",
                   "which attention worker takes a request: cache-aware (the one whose prefix\n"
                   "cache holds the longest prefix of its prompt, unless its load exceeds the\n"
                   "least-loaded one's by more than --routing-load-slack; least-loaded without\n"
                   "prefix caching or with one attention worker) | least-loaded (fewest\n"
                   "outstanding tokens) | round-robin; docs/RUNTIME.md");
  flags.add_int("routing-load-slack", runtime::WorkerConfig::kDefaultRoutingLoadSlack, 0,
                int64_t{1} << 40,
                "cache-aware routing: how many outstanding tokens (prompt + n x max_tokens of\n"
                "the requests in flight) a replica holding a longer prefix may carry beyond\n"
                "the least-loaded one's and still be chosen");
  flags.add_int("rebalance-every", 0, 0, 1000000000,
                "online rebalancing: every STEPS steps look at the rows routed since the last\n"
                "look, compute a placement with replicas (as msinfer balance does) and, when\n"
                "it lowers the predicted max/mean expert-worker load by --rebalance-gain,\n"
                "have the expert workers load their new experts while serving, then switch\n"
                "every worker to it between two steps (0: never; CPU expert workers)");
  flags.add_int("rebalance-slots", 0, 0, 1000000,
                "experts an expert worker may hold when rebalancing (its memory limit; 0: as\n"
                "many as the fullest worker of the starting placement)");
  flags.add_double("rebalance-gain", 1.1, 1.0, 1000.0,
                   "rebalance only when the predicted max/mean load drops by this factor");
  flags.add_double("rebalance-fixed-rows", 0, 0, 1e6,
                   "what running one expert replica costs whatever its rows, in rows per step\n"
                   "and layer, when rebalancing (as msinfer balance --expert-fixed-rows)");
  flags.add_int("tp-expert", 0, 0, runtime::Placement::kMaxTp,
                "expert tensor parallelism: processes (shards) per expert worker; each holds\n"
                "1/tp of its experts' FFN (default: the placement's tp_expert, else 1)");
  flags.add_int("tp-attention", 0, 0, runtime::Placement::kMaxTp,
                "attention tensor parallelism: processes (ranks) per attention worker; each\n"
                "holds 1/tp of the query heads, their q/k/v/o weights and KV cache; tp must\n"
                "divide the query heads and divide the KV heads or be a multiple of them (a\n"
                "KV head is then replicated on tp/KV ranks) (default: the placement's\n"
                "tp_attention, else 1)");
  flags.add_string("tp-expert-reduce", "",
                   "how an expert worker's shards combine their partial outputs: attention-sum\n"
                   "(each shard answers, the attention side adds) | allreduce (shard 0 sums\n"
                   "and answers); default: the placement's or plan's, else the one the planner's\n"
                   "model prefers on this machine (its memory bandwidth and FLOP/s probed at\n"
                   "start: docs/RUNTIME.md)");
  flags.add_string("shared-experts", "attention",
                   "where a MoE layer's shared experts run (DeepSeek-V2/V3, GLM-4.5): attention\n"
                   "(on each attention worker, on its own batch; no M2N bytes) | expert (on the\n"
                   "expert workers as an always-selected expert of weight 1, batched across\n"
                   "attention workers: layer l's on expert worker l mod N, split over its tp\n"
                   "shards); dense first layers stay on the attention workers; docs/RUNTIME.md");
}

void add_step_budget_flag(FlagSet& flags) {
  flags.add_int("max-num-batched-tokens", kDefaultMaxNumBatchedTokens, 1, kMaxStepTokens,
                "tokens one engine step computes at most (vLLM's name): a decode token for each\n"
                "running sequence, then prompt chunks in what is left. Larger: prompts go in\n"
                "in fewer steps, but such a step delays every stream's next token longer.\n"
                "serve: at least --max-num-seqs (unset, it is raised to it). Disaggregated:\n"
                "every attention worker's; at most what an M2N message holds (~65535 rows\n"
                "/ top_k), and the receive regions grow with it");
}

int64_t step_token_budget(const FlagSet& flags) {
  const int64_t budget = flags.get_int("max-num-batched-tokens");
  if (flags.was_set("max-num-batched-tokens") || !flags.declared("max-num-seqs")) return budget;
  return std::max(budget, flags.get_int("max-num-seqs"));
}

Status check_step_budget_flags(const FlagSet& flags) {
  if (flags.declared("max-num-seqs") && flags.was_set("max-num-batched-tokens") &&
      flags.get_int("max-num-batched-tokens") < flags.get_int("max-num-seqs")) {
    return invalid_argument(
        "--max-num-batched-tokens " + std::to_string(flags.get_int("max-num-batched-tokens")) +
        " is less than --max-num-seqs " + std::to_string(flags.get_int("max-num-seqs")) +
        ": a step must hold a decode token for every sequence in the batch; raise "
        "--max-num-batched-tokens or lower --max-num-seqs");
  }
  return ok_status();
}

namespace {

// A deployment whose steps would not fit its M2N messages is bad input.
Status check_step_budget(const runtime::WorkerConfig& c, const ModelConfig& model) {
  const int64_t limit = runtime::max_step_tokens_limit(c, model);
  if (c.engine.max_step_tokens <= limit) return ok_status();
  return invalid_argument(
      "--max-num-batched-tokens " + std::to_string(c.engine.max_step_tokens) +
      " is more than this deployment's M2N messages hold (at most " + std::to_string(limit) +
      " tokens a step with top_k " + std::to_string(model.top_k) + ")" +
      (c.tp_attention > 1 ? "; with --tp-attention each token's block table travels in "
                            "them too, up to " +
                                std::to_string(model.max_position_embeddings) + " / " +
                                std::to_string(c.engine.block_size) + " (--block-size) ids"
                          : std::string()));
}

}  // namespace

Status check_deployment_flags(const FlagSet& flags) {
  if (const std::string& p = flags.get_string("fabric-provider"); !p.empty()) {
    if (auto t = comm::parse_transport(p); !t.ok()) {
      return invalid_argument(flags.origin("fabric-provider") + ": " + t.status().message());
    }
  }
  if (!flags.get_string("plan").empty()) {
    for (const char* f : {"attention-workers", "expert-workers", "micro-batches"}) {
      if (flags.was_set(f))
        return invalid_argument(std::string("--") + f + " conflicts with --plan");
    }
  } else if ((flags.get_int("attention-workers") > 0) != (flags.get_int("expert-workers") > 0)) {
    return invalid_argument(
        "a disaggregated deployment needs both --attention-workers and "
        "--expert-workers (>= 1)");
  }
  if (!flags.get_string("tp-expert-reduce").empty()) {
    MSI_RETURN_IF_ERROR(
        runtime::parse_expert_reduce(flags.get_string("tp-expert-reduce"), "--tp-expert-reduce")
            .status());
  }
  MSI_RETURN_IF_ERROR(runtime::parse_shared_experts(flags.get_string("shared-experts"),
                                                    flags.origin("shared-experts"))
                          .status());
  if (flags.was_set("shared-experts") && !deployment_requested(flags)) {
    return invalid_argument(
        "--shared-experts needs a disaggregated deployment (--attention-workers and "
        "--expert-workers, or --plan)");
  }
  if ((flags.was_set("tp-expert") || flags.was_set("tp-expert-reduce") ||
       flags.was_set("tp-attention")) &&
      !deployment_requested(flags)) {
    return invalid_argument(
        "--tp-expert, --tp-expert-reduce and --tp-attention need --attention-workers and "
        "--expert-workers, or --plan");
  }
  MSI_RETURN_IF_ERROR(
      runtime::parse_routing_policy(flags.get_string("routing"), flags.origin("routing")).status());
  if (flags.was_set("routing-load-slack") && flags.get_string("routing") != "cache-aware") {
    return invalid_argument("--routing-load-slack is for --routing cache-aware");
  }
  for (const char* f : {"rebalance-every", "rebalance-slots", "rebalance-gain",
                        "rebalance-fixed-rows", "routing", "routing-load-slack"}) {
    if (flags.was_set(f) && !deployment_requested(flags)) {
      return invalid_argument(std::string("--") + f +
                              " needs a disaggregated deployment (--attention-workers and "
                              "--expert-workers, or --plan)");
    }
  }
  if ((flags.was_set("rebalance-slots") || flags.was_set("rebalance-gain") ||
       flags.was_set("rebalance-fixed-rows")) &&
      flags.get_int("rebalance-every") == 0) {
    return invalid_argument(
        "--rebalance-slots, --rebalance-gain and --rebalance-fixed-rows need --rebalance-every");
  }
  if (flags.get_int("prefill-workers") > 0 || flags.was_set("kv-transfer-mb")) {
    if (!deployment_requested(flags)) {
      return invalid_argument(
          "--prefill-workers and --kv-transfer-mb need a disaggregated deployment "
          "(--attention-workers and --expert-workers, or --plan)");
    }
    if (flags.get_int("tp-attention") > 1) {
      return invalid_argument("--prefill-workers with --tp-attention > 1 is not built yet");
    }
  }
  for (const char* f : {"resubmit", "respawn"}) {
    if (flags.get_bool(f) && !deployment_requested(flags)) {
      return invalid_argument(std::string("--") + f +
                              " needs a disaggregated deployment (--attention-workers and "
                              "--expert-workers, or --plan)");
    }
  }
  if (!flags.get_string("placement").empty() && !deployment_requested(flags)) {
    return invalid_argument(
        "--placement needs --attention-workers and --expert-workers, or --plan");
  }
  return ok_status();
}

Status check_model_dir(const FlagSet& flags) {
  const std::string& dir = flags.get_string("model");
  if (dir.empty()) return invalid_argument("--model is required (a model directory)");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return not_found("--model " + dir +
                     ": no such model directory (config.json, *.safetensors; "
                     "msinfer make-model writes one)");
  }
  MSI_ASSIGN_OR_RETURN(ModelConfig c, load_model_config(dir));
  MSI_RETURN_IF_ERROR(c.check_executable().with_context(dir + "/config.json"));
  // Mapping the files and parsing their headers is cheap; it finds a damaged
  // checkpoint here, the same way for the co-located engine and for workers.
  auto ckpt = model::Checkpoint::open(dir);
  if (!ckpt.ok()) return ckpt.status();
  return ok_status();
}

namespace {

// What every worker of either kind takes from the flags, whoever sets the shape.
StatusOr<runtime::WorkerConfig> process_config_from_flags(const FlagSet& flags) {
  runtime::WorkerConfig c;
  c.model_dir = flags.get_string("model");
  if (const std::string& p = flags.get_string("fabric-provider"); !p.empty()) {
    MSI_ASSIGN_OR_RETURN(c.transport, comm::parse_transport(p));
  } else {
    c.transport =
        comm::launched_by_mpi() ? comm::TransportKind::kSocket : comm::TransportKind::kDirect;
  }
  c.timeout_ms = static_cast<int>(flags.get_int("timeout-ms"));
  if (c.timeout_ms < 100) return invalid_argument("--timeout-ms must be >= 100");
  c.resubmit = flags.get_bool("resubmit");
  c.prefill_workers = static_cast<int>(flags.get_int("prefill-workers"));
  c.kv_transfer_bytes = flags.get_int("kv-transfer-mb") << 20;
  c.respawn = flags.get_bool("respawn");
  c.rebalance_every = static_cast<int>(flags.get_int("rebalance-every"));
  c.rebalance_slots = static_cast<int>(flags.get_int("rebalance-slots"));
  c.rebalance_gain = flags.get_double("rebalance-gain");
  c.rebalance_fixed_rows = flags.get_double("rebalance-fixed-rows");
  MSI_ASSIGN_OR_RETURN(c.routing, runtime::parse_routing_policy(flags.get_string("routing"),
                                                                flags.origin("routing")));
  c.routing_load_slack = flags.get_int("routing-load-slack");
  MSI_ASSIGN_OR_RETURN(c.weights, apply_engine_flags(flags));
  c.engine = engine_options_from_flags(flags);  // the callers set micro_batches by the shape
  const std::string& device = flags.get_string("device");
  c.attention_device =
      flags.get_string("attention-device").empty() ? device : flags.get_string("attention-device");
  c.expert_device =
      flags.get_string("expert-device").empty() ? device : flags.get_string("expert-device");
  MSI_ASSIGN_OR_RETURN(c.shared_experts,
                       runtime::parse_shared_experts(flags.get_string("shared-experts"),
                                                     flags.origin("shared-experts")));
  return c;
}

}  // namespace

// --placement (checked against the model and the number of expert workers
// `workers`, which `what` names in errors), else round robin.
StatusOr<runtime::Placement> placement_from_flags(const FlagSet& flags, const ModelConfig& model,
                                                  int workers, const std::string& what) {
  const std::string& path = flags.get_string("placement");
  if (path.empty()) {
    if (workers > model.experts) {
      return invalid_argument(what + " " + std::to_string(workers) + " exceeds the " +
                              std::to_string(model.experts) +
                              " experts; give a --placement with replicas");
    }
    return runtime::Placement::round_robin(model.experts, workers);
  }
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  MSI_ASSIGN_OR_RETURN(runtime::Placement p, runtime::Placement::from_json(j, model.experts, path));
  if (p.workers != workers) {
    return invalid_argument(path + ": places experts on " + std::to_string(p.workers) +
                            " expert workers, " + what + " is " + std::to_string(workers));
  }
  return p;
}

// Expert tensor parallelism: flag > placement file > plan (`plan_tp`,
// `plan_reduce`) > 1 and attention-sum; the model's FFN width must split evenly
// and every process must fit the M2N immediate's 7-bit sender index.
Status apply_tp_expert(const FlagSet& flags, const ModelConfig& model, int plan_tp,
                       std::optional<runtime::ExpertReduce> plan_reduce, runtime::WorkerConfig* c) {
  c->tp_expert = plan_tp > 0 ? plan_tp : 1;
  if (c->placement.tp_expert > 0) c->tp_expert = c->placement.tp_expert;
  if (flags.get_int("tp-expert") > 0) c->tp_expert = static_cast<int>(flags.get_int("tp-expert"));
  const bool reduce_chosen =
      plan_reduce || c->placement.tp_expert_reduce || !flags.get_string("tp-expert-reduce").empty();
  if (plan_reduce) c->tp_expert_reduce = *plan_reduce;
  if (c->placement.tp_expert_reduce) c->tp_expert_reduce = *c->placement.tp_expert_reduce;
  if (!flags.get_string("tp-expert-reduce").empty()) {
    MSI_ASSIGN_OR_RETURN(
        c->tp_expert_reduce,
        runtime::parse_expert_reduce(flags.get_string("tp-expert-reduce"), "--tp-expert-reduce"));
  }
  if (model.expert_ffn % c->tp_expert != 0) {
    return invalid_argument("tp_expert " + std::to_string(c->tp_expert) +
                            " does not divide the experts' FFN width " +
                            std::to_string(model.expert_ffn));
  }
  if (c->expert_processes() > 128) {
    return invalid_argument("expert workers x tp_expert = " +
                            std::to_string(c->expert_processes()) + " processes; at most 128");
  }
  // The placement in effect (printed with the routing statistics) says it too.
  // (Only with tp > 1: without it the document stays what it was. With tp > 1
  // and nothing choosing the mode, it stays unset until start_deployment has
  // the planner's model choose.)
  c->placement.tp_expert = c->tp_expert;
  c->placement.tp_expert_reduce.reset();
  if (c->tp_expert > 1 && reduce_chosen) c->placement.tp_expert_reduce = c->tp_expert_reduce;
  return ok_status();
}

// Attention tensor parallelism: flag > placement file > plan > 1; the heads
// must split evenly, the KV heads too or be replicated
// (ModelConfig::check_attention_tp).
Status apply_tp_attention(const FlagSet& flags, const ModelConfig& model, int plan_tp,
                          runtime::WorkerConfig* c) {
  c->tp_attention = plan_tp > 0 ? plan_tp : 1;
  if (c->placement.tp_attention > 0) c->tp_attention = c->placement.tp_attention;
  if (flags.get_int("tp-attention") > 0) {
    c->tp_attention = static_cast<int>(flags.get_int("tp-attention"));
  }
  MSI_RETURN_IF_ERROR(model.check_attention_tp(c->tp_attention));
  if (c->attention_processes() > 128) {
    return invalid_argument("attention workers x tp_attention = " +
                            std::to_string(c->attention_processes()) + " processes; at most 128");
  }
  if (c->tp_attention > 1 && !runtime::is_cpu_device(c->attention_device)) {
    return unimplemented("tp_attention " + std::to_string(c->tp_attention) + " on " +
                         c->attention_device +
                         ": attention tensor parallelism runs on the CPU only");
  }
  c->placement.tp_attention = c->tp_attention;
  return ok_status();
}

StatusOr<runtime::WorkerConfig> worker_config_from_flags(const FlagSet& flags,
                                                         const ModelConfig& model) {
  MSI_ASSIGN_OR_RETURN(runtime::WorkerConfig c, process_config_from_flags(flags));
  c.attention_workers = static_cast<int>(flags.get_int("attention-workers"));
  c.expert_workers = static_cast<int>(flags.get_int("expert-workers"));
  c.engine.micro_batches = static_cast<int>(flags.get_int("micro-batches"));
  if (c.attention_workers < 1 || c.attention_workers > 128) {
    return invalid_argument("--attention-workers must be in 1..128");
  }
  if (c.expert_workers < 1 || c.expert_workers > 128) {
    return invalid_argument("--expert-workers must be in 1..128");
  }
  if (c.engine.micro_batches < 1 || c.engine.micro_batches > 16)
    return invalid_argument("--micro-batches must be in 1..16");
  MSI_ASSIGN_OR_RETURN(c.placement,
                       placement_from_flags(flags, model, c.expert_workers, "--expert-workers"));
  MSI_RETURN_IF_ERROR(apply_tp_expert(flags, model, 0, std::nullopt, &c));
  MSI_RETURN_IF_ERROR(apply_tp_attention(flags, model, 0, &c));
  MSI_RETURN_IF_ERROR(runtime::check_rebalancing(c, static_cast<int>(model.experts)));
  MSI_RETURN_IF_ERROR(check_step_budget(c, model));
  return c;
}

// A plan of msinfer plan --devices cpu (docs/PLANNER.md section 8): its
// workers, their threads, m, tp_expert (attention-sum, what the plan
// modelled) and, unless --kv-cache-mb says otherwise, its KV budget.
StatusOr<runtime::WorkerConfig> worker_config_from_cpu_plan(const FlagSet& flags,
                                                            const ModelConfig& model, const Json& j,
                                                            const std::string& path) {
  MSI_ASSIGN_OR_RETURN(planner::CpuDeployment d,
                       planner::cpu_deployment_from_plan_document(j, path, model));
  MSI_ASSIGN_OR_RETURN(runtime::WorkerConfig c, process_config_from_flags(flags));
  c.attention_workers = d.attention_workers;
  c.expert_workers = d.expert_workers;
  c.engine.micro_batches = d.micro_batches;
  c.attention_threads = d.attention_threads;
  c.expert_threads = d.expert_threads;
  if (!flags.was_set("kv-cache-mb") && j["plan"].contains("kv_cache_mb")) {
    JsonFields f(j["plan"], path + ": plan");
    MSI_ASSIGN_OR_RETURN(int64_t mb, f.integer_in("kv_cache_mb", 1, 1 << 20));
    c.engine.kv_cache_bytes = mb << 20;
  }
  MSI_ASSIGN_OR_RETURN(c.placement, placement_from_flags(flags, model, c.expert_workers,
                                                         path + "'s expert workers"));
  MSI_RETURN_IF_ERROR(
      apply_tp_expert(flags, model, d.tp_expert, runtime::ExpertReduce::kAttentionSum, &c));
  MSI_RETURN_IF_ERROR(apply_tp_attention(flags, model, 1, &c).with_context(path));
  MSI_RETURN_IF_ERROR(runtime::check_rebalancing(c, static_cast<int>(model.experts)));
  MSI_RETURN_IF_ERROR(check_step_budget(c, model));
  return c;
}

StatusOr<runtime::WorkerConfig> worker_config_from_plan(const FlagSet& flags,
                                                        const ModelConfig& model) {
  const std::string& path = flags.get_string("plan");
  for (const char* f :
       {"attention-workers", "expert-workers", "micro-batches", "tp-expert", "tp-attention"}) {
    if (flags.was_set(f)) return invalid_argument(std::string("--") + f + " conflicts with --plan");
  }
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  if (planner::is_cpu_plan_document(j)) return worker_config_from_cpu_plan(flags, model, j, path);
  MSI_ASSIGN_OR_RETURN(planner::Deployment d, planner::deployment_from_plan_document(j, path));
  if (d.model.experts != model.experts) {
    return invalid_argument(path + ": the plan is for " + std::to_string(d.model.experts) +
                            " experts (" + d.model.name + "), the model has " +
                            std::to_string(model.experts));
  }
  MSI_ASSIGN_OR_RETURN(runtime::WorkerConfig c, process_config_from_flags(flags));
  c.attention_workers = d.attention_nodes;
  c.expert_workers = d.expert_nodes();
  c.engine.micro_batches = d.micro_batches;
  if (c.attention_workers > 128 || c.engine.micro_batches > 16) {
    return invalid_argument(path + ": attention_nodes must be <= 128 and micro_batches <= 16 here");
  }
  // A placement (e.g. from `msinfer balance`) must fit the plan's expert nodes.
  MSI_ASSIGN_OR_RETURN(
      c.placement, placement_from_flags(flags, model, c.expert_workers, path + "'s expert nodes"));
  // The planner's choice of reduction: its all-reduce is this one's
  // allreduce, its N2M partial sums this one's attention-sum.
  MSI_RETURN_IF_ERROR(
      apply_tp_expert(flags, model, d.shape.tp_expert,
                      d.shape.expert_reduction == planner::ExpertReduction::kPartialSums
                          ? runtime::ExpertReduce::kAttentionSum
                          : runtime::ExpertReduce::kAllReduce,
                      &c));
  MSI_RETURN_IF_ERROR(
      apply_tp_attention(flags, model, d.shape.tp_attention, &c).with_context(path));
  // Where the plan's prediction puts the shared experts (plan.shared_experts_on),
  // unless --shared-experts says otherwise.
  const Json& plan = j.contains("plan") ? j.at("plan") : j;
  if (!flags.was_set("shared-experts") && plan.contains("shared_experts_on") &&
      plan.at("shared_experts_on").is_string() && plan.at("shared_experts_on") != "none") {
    MSI_ASSIGN_OR_RETURN(c.shared_experts, runtime::parse_shared_experts(
                                               plan.at("shared_experts_on").get<std::string>(),
                                               path + ": plan.shared_experts_on"));
  }
  MSI_RETURN_IF_ERROR(runtime::check_rebalancing(c, static_cast<int>(model.experts)));
  MSI_RETURN_IF_ERROR(check_step_budget(c, model));
  return c;
}

// Nothing chose the reduction of a tp_expert > 1 deployment: take the one the
// planner's model prefers on this machine (the probed limits stand for every
// worker's; the transport between workers is taken to copy at half the read
// bandwidth, the most any transport here reaches).
void choose_expert_reduce_by_model(const ModelConfig& model, runtime::WorkerConfig* c) {
  const bench::MachineLimits m = bench::measure_machine(/*quick=*/true);
  planner::GpuSpec host;
  host.name = m.cpu;
  host.bf16_flops = m.bf16_flops > 0 ? m.bf16_flops : m.fp32_flops;
  host.memory_bandwidth = m.read_bw;
  host.memory_bytes = 1;
  host.nic_bandwidth = host.intra_node_bandwidth = m.read_bw / 2;
  host.gpus_per_node = static_cast<int>(planner::kMaxGpusPerNode);
  // The probes measured what the kernels reach; fixed per-layer costs are
  // the same in both modes.
  host.efficiency = planner::Efficiency{1, 1, 1, 1, 0, 0};
  planner::RuntimeShape shape;
  shape.attention_workers = c->attention_workers;
  shape.expert_workers = c->expert_workers;
  shape.micro_batches = c->engine.micro_batches;
  shape.tp_attention = c->tp_attention;
  shape.tp_expert = c->tp_expert;
  shape.tokens_per_micro_batch =
      std::max(1.0, static_cast<double>(c->engine.max_step_tokens) / c->engine.micro_batches);
  const auto flat = planner::UtilCurve::make({{1, 1.0}}, "flat");
  const planner::RuntimeReductionChoice r =
      planner::prefer_runtime_expert_reduction(model, host, shape, *flat);
  c->tp_expert_reduce = r.preferred == planner::ExpertReduction::kReduceToShard0
                            ? runtime::ExpertReduce::kAllReduce
                            : runtime::ExpertReduce::kAttentionSum;
  c->placement.tp_expert_reduce = c->tp_expert_reduce;
  std::fprintf(stderr,
               "msinfer: reduce %s: the planner's model on this machine (%.1f GB/s read, "
               "%.0f GFLOP/s; %g tokens per micro-batch, context %g) puts a decode step at "
               "%.3f ms with attention-sum, %.3f ms with allreduce (allreduce when %.0f%% "
               "faster; --tp-expert-reduce chooses)\n",
               runtime::expert_reduce_name(c->tp_expert_reduce), m.read_bw / 1e9,
               host.bf16_flops / 1e9, shape.tokens_per_micro_batch, shape.seq_len,
               r.partial_sums_step * 1e3, r.reduce_to_shard0_step * 1e3,
               (planner::kReduceToShard0MinGain - 1) * 100);
}

StatusOr<std::unique_ptr<comm::Bootstrap>> launcher_job() {
  if (!comm::launched_by_mpi()) return std::unique_ptr<comm::Bootstrap>();
#ifdef MSINFER_HAVE_MPI
  MSI_ASSIGN_OR_RETURN(auto b, comm::make_mpi_bootstrap());
  if (b->size() == 1) return std::unique_ptr<comm::Bootstrap>();  // mpirun -np 1: fork locally
  return b;
#else
  return failed_precondition("started by mpirun/srun, but this msinfer was built without MPI");
#endif
}

StatusOr<std::string> self_executable() {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return internal_error("cannot resolve /proc/self/exe");
  return std::string(exe, static_cast<size_t>(n));
}

StatusOr<Deployment> start_deployment(const FlagSet& flags) {
  Deployment d;
  MSI_ASSIGN_OR_RETURN(ModelConfig model, load_model_config(flags.get_string("model")));
  MSI_ASSIGN_OR_RETURN(d.config, flags.get_string("plan").empty()
                                     ? worker_config_from_flags(flags, model)
                                     : worker_config_from_plan(flags, model));
  const runtime::WorkerConfig& c = d.config;
  // Under mpirun / srun every rank runs the same command: rank 0 routes, the
  // others become the workers their rank names and serve until told to exit.
  MSI_ASSIGN_OR_RETURN(auto launcher, launcher_job());
  if (launcher && launcher->rank() > 0) {
    d.worker_rank = launcher->rank();
    d.worker_status = runtime::join_launched_deployment(c, *launcher);
    return d;
  }
  // Rank 0 decides for the job (the launched ranks take its choice).
  if (c.tp_expert > 1 && !c.placement.tp_expert_reduce) {
    choose_expert_reduce_by_model(model, &d.config);
  }
  std::fprintf(stderr, "msinfer: %d attention worker(s), %d expert worker(s), %d micro-batch(es)\n",
               c.attention_workers, c.expert_workers, c.engine.micro_batches);
  if (model.shared_expert_ffn > 0) {
    std::fprintf(stderr, "msinfer: shared experts on the %s workers (--shared-experts %s)\n",
                 runtime::shared_experts_name(c.shared_experts),
                 runtime::shared_experts_name(c.shared_experts));
  }
  if (c.tp_attention > 1) {
    std::fprintf(stderr, "msinfer: tp_attention %d (%d processes per attention worker)\n",
                 c.tp_attention, c.tp_attention);
  }
  if (c.tp_expert > 1) {
    std::fprintf(stderr, "msinfer: tp_expert %d (%d processes per expert worker), reduce: %s\n",
                 c.tp_expert, c.tp_expert, runtime::expert_reduce_name(c.tp_expert_reduce));
  }
  std::fprintf(stderr, "%s", c.placement.describe().c_str());
  if (launcher) {
    MSI_ASSIGN_OR_RETURN(d.router, runtime::Router::start_launched(c, *launcher));
  } else {
    MSI_ASSIGN_OR_RETURN(std::string exe, self_executable());
    MSI_ASSIGN_OR_RETURN(d.router, runtime::Router::start(c, exe));
  }
  std::fprintf(stderr, "%s", d.router->describe().c_str());
  return d;
}

bool deployment_requested(const FlagSet& flags) {
  return flags.get_int("attention-workers") > 0 || flags.get_int("expert-workers") > 0 ||
         !flags.get_string("plan").empty();
}

int worker_rank_exit_code(const Deployment& d) {
  if (d.worker_status.ok()) return 0;
  return report_error(("rank " + std::to_string(d.worker_rank)).c_str(), d.worker_status);
}

runtime::EngineOptions engine_options_from_flags(const FlagSet& flags) {
  runtime::EngineOptions eo;
  eo.kv_cache_bytes = flags.get_int("kv-cache-mb") << 20;
  eo.max_step_tokens = step_token_budget(flags);
  eo.micro_batches = static_cast<int>(flags.get_int("micro-batches"));
  eo.device = flags.get_string("device");
  // Checked by apply_engine_flags before any engine is made.
  if (auto cost = parse_attention_cost(flags.get_string("attention-cost")); cost.ok()) {
    eo.attention_cost_per_token = cost->first;
    eo.attention_cost_per_position = cost->second;
  }
  eo.prefix_caching = !flags.get_bool("no-prefix-caching");
  eo.block_size = flags.get_int("block-size");
  return eo;
}

int run_worker(int argc, char** argv) {
  FlagSet flags("worker",
                "One worker process of a disaggregated deployment, started by the router of "
                "`generate` / `serve` / `bench serve` with --attention-workers: its configuration "
                "is the router's first command (a Configure) on fd 3, its answers go to fd 4. "
                "Not for use by hand.");
  if (auto done = parse_command_line(flags, "worker", argc, argv, 2)) return *done;
  // The router writes the configuration at once; a minute covers a machine
  // slow to exec us.
  auto configure = runtime::control::read_configure(3, 60000);
  if (!configure.ok()) {
    return report_error("worker",
                        configure.status().with_context(
                            "the worker subcommand is started by a router, which configures it "
                            "on fd 3"));
  }
  const runtime::WorkerConfig& c = configure->config;
  const int index = configure->index, tp_rank = configure->tp_rank;
  const bool expert = configure->role == runtime::WorkerRole::kExpert;
  if (configure->role == runtime::WorkerRole::kPrefill) {
    // No bootstrap rank: the router hands it the attention workers' regions.
    const Status s = runtime::run_prefill_worker(c, index, 3, 4);
    if (!s.ok())
      return report_error(("worker (prefill worker " + std::to_string(index) + ")").c_str(), s);
    return 0;
  }
  const std::string who = expert ? runtime::expert_process_name(index, tp_rank, c.tp_expert)
                                 : runtime::attention_process_name(index, tp_rank, c.tp_attention);
  auto model = load_model_config(c.model_dir);
  if (!model.ok()) return report_error(("worker (" + who + ")").c_str(), model.status());
  if (static_cast<int64_t>(c.placement.replicas.size()) != model->experts) {
    return report_error(("worker (" + who + ")").c_str(),
                        invalid_argument("the router's placement has " +
                                         std::to_string(c.placement.replicas.size()) +
                                         " experts, the model " + std::to_string(model->experts)));
  }
  // A replacement joining a running deployment (the router's --respawn)
  // exchanges its M2N card with the router over the command pipes.
  StatusOr<std::unique_ptr<comm::Bootstrap>> boot = std::unique_ptr<comm::Bootstrap>();
  if (const char* join = std::getenv("MSINFER_JOIN"); join != nullptr && *join == '1') {
    const char* rank = std::getenv("MSINFER_RANK");
    const char* world = std::getenv("MSINFER_WORLD_SIZE");
    if (rank == nullptr || world == nullptr) {
      return report_error("worker", invalid_argument("MSINFER_JOIN needs MSINFER_RANK and "
                                                     "MSINFER_WORLD_SIZE"));
    }
    boot = runtime::router_pipe_bootstrap(3, 4, std::atoi(rank), std::atoi(world));
  } else {
    boot = comm::make_bootstrap_from_env();
  }
  if (!boot.ok()) return report_error("worker", boot.status());
  // The router's command pipe is fd 3, the answer pipe fd 4.
  const Status s = expert ? runtime::run_expert_worker(c, index, tp_rank, **boot, 3, 4)
                          : runtime::run_attention_worker(c, index, tp_rank, **boot, 3, 4);
  if (!s.ok()) return report_error(("worker (" + who + ")").c_str(), s);
  return 0;
}

}  // namespace msinfer::cli
