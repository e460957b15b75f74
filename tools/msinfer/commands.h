// Subcommands of the msinfer CLI, one file each. Each returns the process exit
// code: 0 on success, 1 on a runtime failure, 2 on bad input (flags, files).
#pragma once

#include <memory>
#include <random>
#include <string>

#include "msinfer/comm/bootstrap.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/model_config.h"
#include "msinfer/kernels/cpu/gemm.h"
#include "msinfer/runtime/disaggregated.h"
#include "msinfer/runtime/router.h"

namespace msinfer::cli {

int run_plan(int argc, char** argv);
int run_simulate(int argc, char** argv);
int run_make_model(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_bench_serve(int argc, char** argv);  // `bench serve`
int run_bench_serve_online(const FlagSet& flags);  // `bench serve --base-url`
int run_profile(int argc, char** argv);
int run_worker(int argc, char** argv);
int run_serve(int argc, char** argv);
int run_balance(int argc, char** argv);

// --isa and --weights, for every command that runs the engine.
void add_engine_flags(FlagSet& flags);
// `--isa LEVEL` (empty: no change): caps this process and the workers it starts
// at LEVEL by setting MSINFER_ISA; bad input if unknown or above this CPU's best.
Status apply_isa_flag(const std::string& level);
// --attention-cost "PER_TOKEN,PER_POSITION" ("": (0, 0), the model's defaults).
StatusOr<std::pair<double, double>> parse_attention_cost(const std::string& s);
// Bad input when `kv_cache_mb` MiB (one attention worker's KV budget) is more
// than this machine's physical memory (it would end in std::bad_alloc).
Status check_kv_cache_fits_memory(int64_t kv_cache_mb);
// Applies --isa and returns the --weights format (bad input for unknown values).
StatusOr<kernels::cpu::WeightFormat> apply_engine_flags(const FlagSet& flags);

// --max-num-batched-tokens: the engine's token budget per step (generate,
// serve, bench serve, worker), 1..kMaxStepTokens. Its default is the one
// measured best on the development machine (docs/SERVING.md, "The step
// budget"); EngineOptions keeps kDefaultMaxStepTokens for library callers.
inline constexpr int64_t kDefaultMaxNumBatchedTokens = 1024;
inline constexpr int64_t kMaxStepTokens = 65536;
void add_step_budget_flag(FlagSet& flags);
// Its value; where the command has --max-num-seqs (serve) and the flag was
// not given, at least --max-num-seqs, so that every sequence decodes each step.
int64_t step_token_budget(const FlagSet& flags);
// Bad input when --max-num-batched-tokens was given below --max-num-seqs.
// (The bound of a disaggregated deployment's M2N messages is checked with
// its configuration: worker_config_from_flags / _from_plan.)
Status check_step_budget_flags(const FlagSet& flags);

// Flags of a disaggregated deployment (shared by generate and worker).
void add_deployment_flags(FlagSet& flags);
// Checks the deployment flags that need no model (--fabric-provider, conflicts
// with --plan, both worker counts), before any expensive work.
Status check_deployment_flags(const FlagSet& flags);
// Checks --model names a model directory whose config the engine runs and whose
// safetensors headers are sound (cheap: the files are mapped, not read), so a
// damaged model is the same bad-input error co-located and disaggregated.
Status check_model_dir(const FlagSet& flags);
StatusOr<runtime::WorkerConfig> worker_config_from_flags(const FlagSet& flags,
                                                         const ModelConfig& model);
// From `--plan FILE` (the plan document, docs/PLANNER.md section 7): n_a and m from the plan, one
// expert worker per expert; tensor-parallel plans are refused.
StatusOr<runtime::WorkerConfig> worker_config_from_plan(const FlagSet& flags,
                                                        const ModelConfig& model);

// The launcher's job when mpirun / srun started this process with more than one
// rank (rank 0 routes, the others are workers); null otherwise.
StatusOr<std::unique_ptr<comm::Bootstrap>> launcher_job();
// This binary's path, for the router to start workers with.
StatusOr<std::string> self_executable();

// The disaggregated deployment that the flags (deployment flags or --plan,
// --model, --kv-cache-mb) describe: a router with its workers, forked here or
// the launcher's other ranks. On a launcher's worker rank (worker_rank > 0)
// this process has served as that worker and finished: no router.
struct Deployment {
  runtime::WorkerConfig config;
  std::unique_ptr<runtime::Router> router;
  int worker_rank = 0;
  Status worker_status;
};
StatusOr<Deployment> start_deployment(const FlagSet& flags);
// True when the flags ask for a disaggregated deployment rather than the
// co-located engine (--attention-workers, --expert-workers or --plan).
bool deployment_requested(const FlagSet& flags);
// The exit code of a launcher's worker rank once it has served.
int worker_rank_exit_code(const Deployment& d);
// A random length of `bench serve --random-range-ratio R`: uniform in
// [base (1 - R), base (1 + R)], at least 1 (vLLM's random dataset).
int64_t random_length(std::mt19937_64& rng, int64_t base, double ratio);

// The engine's options from the flags (--kv-cache-mb, --micro-batches,
// --max-num-batched-tokens, --device, --attention-cost, --block-size,
// --no-prefix-caching): the co-located engine's, and a deployment's
// WorkerConfig::engine. apply_engine_flags checks --attention-cost first.
runtime::EngineOptions engine_options_from_flags(const FlagSet& flags);

// "routing over N steps: experts max/mean X[, expert workers max/mean Y]"
// (no newline): the human summary of a RoutingStats document, as generate and
// bench serve print it.
std::string routing_summary(const Json& routing);

}  // namespace msinfer::cli
