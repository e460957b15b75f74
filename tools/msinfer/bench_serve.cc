// msinfer bench serve: drives a fixed offline workload through a deployment
// (co-located engine, or router + workers) and reports what the router and
// every worker measured.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "commands.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/stats.h"
#include "msinfer/core/table.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/planner/cpu_plan.h"
#include "msinfer/planner/perf_model.h"
#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/router.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

// The planner's prediction (docs/PLANNER.md section 3b) for this deployment during
// decode, from a measured profile: k1..k4 from `msinfer profile`, the
// transfer model from `msinfer bench m2n --profile-into`.
StatusOr<Json> predict(const ModelConfig& mc, const runtime::WorkerConfig& c, int64_t requests,
                       const std::string& profile_path) {
  MSI_ASSIGN_OR_RETURN(planner::Profile prof, planner::load_profile(profile_path));
  if (!prof.k1 || !prof.k2 || !prof.k3 || !prof.k4) {
    return invalid_argument(profile_path +
                            ": needs k1..k4 (write it with `msinfer profile --out`)");
  }
  MSI_ASSIGN_OR_RETURN(planner::UtilCurve flat, planner::UtilCurve::make({{1.0, 1.0}}, "flat"));
  planner::DeploymentShape shape;  // tp 1: the GPU entries are not used
  planner::StageModel sm =
      planner::build_stage_model(mc, shape, 0, prof.nic_util.value_or(flat), &prof);
  // This runtime moves fp32 rows (the planner's default assumes bf16).
  sm.dispatch_bytes_per_token = 4.0 * mc.hidden * mc.top_k;
  sm.expert_bytes_per_token = 4.0 * mc.hidden;
  const double A = c.attention_workers, m = c.engine.micro_batches;
  const double b_a = static_cast<double>(requests) / A / m;  // decode tokens per micro-batch
  planner::StageTimes t;
  t.t_a = sm.t_attention(b_a);
  // Uniform routing: expert e gets A * b_a * K / E rows, split over its replicas
  // by share; an expert worker runs one GEMM per expert it holds.
  double rows_max = 0;
  for (int w = 0; w < c.expert_workers; ++w) {
    double te = 0, rows = 0;
    for (int e : c.placement.experts_on(w)) {
      for (auto [ww, share] : c.placement.replicas[e]) {
        if (ww != w) continue;
        const double b_e = A * b_a * mc.top_k / mc.experts * share;
        te += sm.t_expert(b_e);
        rows += b_e;
      }
    }
    t.t_e = std::max(t.t_e, te);
    rows_max = std::max(rows_max, rows);
  }
  Json j{{"b_a", b_a}, {"t_a_s", t.t_a}, {"t_e_s", t.t_e}, {"source", profile_path}};
  if (prof.nic_bandwidth) {
    // One attention worker sends b_a * K rows (over all destinations); the
    // busiest expert worker receives rows_max (from all attention workers).
    t.t_c = sm.t_comm(b_a, rows_max);
    j["t_c_s"] = t.t_c;
  }
  const double T = planner::iteration_time(t, c.engine.micro_batches, mc.layers);
  j["iteration_s"] = T;
  j["decode_tokens_per_s"] = static_cast<double>(requests) / T;
  j["full_overlap"] = planner::full_overlap(t, c.engine.micro_batches);
  return j;
}

double mean_over(const std::vector<Json>& workers, const std::string& role, const char* key) {
  double s = 0;
  int n = 0;
  for (const auto& w : workers) {
    if (w["role"] == role && w.contains(key)) {
      s += w[key].get<double>();
      ++n;
    }
  }
  return n > 0 ? s / n : 0;
}

double max_over(const std::vector<Json>& workers, const std::string& role, const char* key) {
  double s = 0;
  for (const auto& w : workers) {
    if (w["role"] == role && w.contains(key)) s = std::max(s, w[key].get<double>());
  }
  return s;
}

}  // namespace

int64_t random_length(std::mt19937_64& rng, int64_t base, double ratio) {
  if (ratio <= 0) return base;
  const auto lo = static_cast<int64_t>(std::floor(static_cast<double>(base) * (1 - ratio)));
  const auto hi = static_cast<int64_t>(std::ceil(static_cast<double>(base) * (1 + ratio)));
  return std::max<int64_t>(1, std::uniform_int_distribution<int64_t>(lo, hi)(rng));
}

namespace {

void add_bench_serve_flags(FlagSet& flags) {
  flags.add_string("model", "", "model directory");
  flags.add_bool("offline", "all prompts submitted at once to a deployment this command starts");
  flags.add_string("base-url", "",
                   "online mode: the server to load, e.g. http://127.0.0.1:8000,\n"
                   "http://localhost:8000 or http://[::1]:8000 (streaming requests; no --model\n"
                   "needed)");
  flags.add_string("endpoint", "/v1/completions",
                   "online: /v1/completions or /v1/chat/completions");
  flags.add_double("request-rate", 0, 0, 1e6, "online: requests per second (0: all at once)");
  flags.add_double("burstiness", 1.0, 0.01, 100,
                   "online: gamma shape of the arrival gaps (1 = Poisson)");
  flags.add_int("max-concurrency", 0, 0, 1000000,
                "online: requests in flight at most (0: no limit)");
  flags.add_int("num-warmups", 0, 0, 100000,
                "requests run and discarded before the measured run (vLLM's): the first\n"
                "prompt, N times. Online: under --max-concurrency, and the connections they\n"
                "open are kept alive for the run, as clients that reuse connections see the\n"
                "server. Offline: the run finds the engine warm, as a running server's is\n"
                "(the co-located engine's routing figures then include the warm-ups)");
  flags.add_string("dataset", "random",
                   "random; online also a JSON-lines file of {\"prompt\", \"output_len\"};\n"
                   "offline also multi-turn: --users chats of --turns turns each, every prompt\n"
                   "a shared system prompt of --system-len tokens, then the chat so far (each\n"
                   "earlier turn's --input-len user tokens and its answer), then --input-len new\n"
                   "tokens; a user's next turn is sent when its answer ends (TTFT from then);\n"
                   "offline also mixed: --num-prompts decoding requests, and once every one of\n"
                   "them has its first token --long-prompts prompts of --long-input-len tokens,\n"
                   "one every --long-interval steps (the TBT of the decoding requests is\n"
                   "reported apart: what a long prefill costs them)");
  flags.add_int("users", 32, 1, 100000, "multi-turn: chats, run at once");
  flags.add_int("turns", 8, 1, 10000, "multi-turn: turns per chat");
  flags.add_int("system-len", 256, 0, 1 << 20, "multi-turn: tokens of the shared system prompt");
  flags.add_int("long-prompts", 4, 1, 100000, "mixed: long prompts sent among the decoding ones");
  flags.add_int("long-input-len", 4096, 1, 1 << 20, "mixed: tokens of each long prompt");
  flags.add_int("long-output-len", 16, 1, 1 << 20, "mixed: tokens generated for each long prompt");
  flags.add_int("long-interval", 8, 0, 1 << 20, "mixed: steps between two long prompts");
  flags.add_string("goodput", "",
                   "online: SLOs a good request meets, e.g. 'ttft:500 tpot:50 e2el:5000' (ms)");
  flags.add_string("served-model-name", "", "online: the model name to send (default: none)");
  flags.add_string("api-key", "", "online: bearer key", "MSINFER_API_KEY");
  flags.add_int("num-prompts", 8, 1, 100000, "requests");
  flags.add_int("input-len", 32, 1, 1 << 20, "prompt tokens per request");
  flags.add_int("output-len", 32, 1, 1 << 20, "generated tokens per request");
  flags.add_double("random-range-ratio", 0, 0, 0.999,
                   "random prompts: input and output lengths uniform in [L (1 - R), L (1 + R)]\n"
                   "around --input-len / --output-len (vLLM's; 0: all equal)");
  flags.add_int("seed", 0, 0, INT64_MAX, "seed of the random prompts");
  flags.add_int("kv-cache-mb", 256, 1, 1 << 20, "KV cache budget in MiB (per attention worker)");
  flags.add_bool("json", "print one JSON object");
  flags.add_double("idle-seconds", 1, 0, 3600,
                   "after the workload, leave the deployment idle this long and report each "
                   "worker's CPU use meanwhile (0: skip)");
  flags.add_string("profile", "",
                   "profile JSON (msinfer profile, + bench m2n --profile-into): also print the "
                   "planner's predicted T_a, T_e, T_c and decode tokens/s, and their error");
  add_step_budget_flag(flags);
  add_engine_flags(flags);
  add_deployment_flags(flags);
  flags.add_string("plan", "", "plan document from `msinfer plan --out` (sets n_a and m)");
  flags.set_epilog(
      "examples:\n"
      "  msinfer bench serve --offline --model /tmp/m --num-prompts 16 --input-len 64 --output-len "
      "32\n"
      "  msinfer bench serve --offline --model /tmp/m --attention-workers 1 --expert-workers 1 "
      "--micro-batches 2 --json\n"
      "  msinfer bench serve --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 20 "
      "--max-concurrency 64 --input-len 32 --output-len 64 --goodput 'ttft:500 tpot:50'");
}

// What an offline run asks for, checked before the deployment starts. The
// deployment and engine flags stay in the FlagSet: start_deployment and
// engine_options_from_flags read them there.
struct BenchServeOptions {
  std::string model_dir;
  std::string dataset;  // random | multi-turn | mixed
  bool multi_turn = false;
  int64_t users = 0, turns = 0, system_len = 0;
  // mixed: the long prompts, sent once every decoding request has its first
  // token, one each `long_interval` steps.
  bool mixed = false;
  int64_t long_prompts = 0, long_input_len = 0, long_output_len = 0, long_interval = 0;
  int64_t prompts = 0;   // P: requests (multi-turn: users x turns; mixed: decoding + long)
  int64_t decoding = 0;  // requests sent at the start (mixed: the decoding ones)
  int64_t input_len = 0, output_len = 0;  // I, O
  double ratio = 0;                       // --random-range-ratio
  uint64_t seed = 0;
  int64_t warmups = 0;
  double idle_s = 0;
  bool json = false;
  std::string profile;           // --profile: the planner's prediction beside the run
  std::string plan;              // --plan
  std::optional<Json> cpu_plan;  // --plan, when it is a CPU plan document
  kernels::cpu::WeightFormat weights{};
  bool disaggregated = false;
  ModelConfig model;
};

// A CPU plan (msinfer plan --devices cpu) is run as planned: its global
// batch and workload unless the flags say otherwise, and its prediction is
// put beside what this run measures.
void apply_cpu_plan_workload(const FlagSet& flags, BenchServeOptions& o) {
  auto plan_int = [&](const char* flag, const char* section, const char* key) -> int64_t {
    if (!o.cpu_plan || flags.was_set(flag)) return flags.get_int(flag);
    const Json& sec = (*o.cpu_plan)[section];
    if (sec.is_object() && sec.contains(key) && sec[key].is_number()) {
      const double v = sec[key].get<double>();
      if (v >= 1 && v <= (1 << 20)) return static_cast<int64_t>(std::llround(v));
    }
    return flags.get_int(flag);
  };
  o.prompts = o.multi_turn ? o.users * o.turns : plan_int("num-prompts", "plan", "global_batch");
  o.input_len = flags.get_int("input-len");
  o.output_len = flags.get_int("output-len");
  if (o.cpu_plan && (*o.cpu_plan)["search"].contains("workload")) {
    const Json& w = (*o.cpu_plan)["search"]["workload"];
    auto len = [&](const char* flag, const char* key, int64_t fallback) {
      if (flags.was_set(flag) || !w.contains(key) || !w[key].is_number()) return fallback;
      const double v = w[key].get<double>();
      return v >= 1 && v <= (1 << 20) ? static_cast<int64_t>(std::llround(v)) : fallback;
    };
    o.input_len = len("input-len", "input_len", o.input_len);
    o.output_len = len("output-len", "output_len", o.output_len);
  }
}

StatusOr<BenchServeOptions> bench_serve_options(const FlagSet& flags) {
  BenchServeOptions o;
  o.model_dir = flags.get_string("model");
  if (o.model_dir.empty()) return invalid_argument("--model is required (or --base-url)");
  // Ranges (--num-prompts 1..100000, ...) are checked by the flag parser.
  o.dataset = flags.get_string("dataset");
  o.multi_turn = o.dataset == "multi-turn";
  o.mixed = o.dataset == "mixed";
  if (!o.multi_turn && !o.mixed && o.dataset != "random") {
    return invalid_argument("--dataset " + o.dataset +
                            ": offline runs random, multi-turn or mixed");
  }
  o.long_prompts = o.mixed ? flags.get_int("long-prompts") : 0;
  o.long_input_len = flags.get_int("long-input-len");
  o.long_output_len = flags.get_int("long-output-len");
  o.long_interval = flags.get_int("long-interval");
  o.users = flags.get_int("users");
  o.turns = flags.get_int("turns");
  o.system_len = flags.get_int("system-len");
  o.plan = flags.get_string("plan");
  if (!o.plan.empty()) {
    auto j = read_json_file(o.plan);
    if (!j.ok()) return j.status().with_context("--plan");
    if (planner::is_cpu_plan_document(*j)) o.cpu_plan = std::move(j).value();
  }
  apply_cpu_plan_workload(flags, o);
  o.decoding = o.prompts;
  o.prompts += o.long_prompts;
  o.ratio = flags.get_double("random-range-ratio");
  o.seed = static_cast<uint64_t>(flags.get_int("seed"));
  o.warmups = flags.get_int("num-warmups");
  o.idle_s = flags.get_double("idle-seconds");
  o.json = flags.get_bool("json");
  o.profile = flags.get_string("profile");
  MSI_RETURN_IF_ERROR(check_deployment_flags(flags));
  MSI_RETURN_IF_ERROR(check_model_dir(flags));
  MSI_ASSIGN_OR_RETURN(o.weights, apply_engine_flags(flags));
  MSI_ASSIGN_OR_RETURN(o.model, load_model_config(o.model_dir));
  if (!o.profile.empty()) {  // a bad profile fails now, not after the run
    MSI_RETURN_IF_ERROR(planner::load_profile(o.profile).status().with_context("--profile"));
  }
  o.disaggregated = deployment_requested(flags);
  if (!o.profile.empty() && !o.disaggregated) {
    return invalid_argument(
        "--profile predicts a disaggregated deployment: give --attention-workers and "
        "--expert-workers");
  }
  return o;
}

// The deployment under test: the co-located engine or a router with its
// workers, and the calls the run makes on either.
struct Deployed {
  std::unique_ptr<runtime::Engine> engine;
  std::unique_ptr<runtime::Router> router;
  std::optional<runtime::WorkerConfig> config;
  std::string description;  // "co-located engine, m=1; CPU kernels ..."

  Status add(const runtime::GenerationRequest& r) {
    return router ? router->add(r) : engine->add(r);
  }
  bool busy() const { return router ? !router->idle() : !engine->idle(); }
  runtime::EngineCounters counters() const {
    return router ? router->counters() : engine->counters();
  }
  // One step; a lost request fails it (a benchmark with a lost request has
  // no figures).
  StatusOr<std::vector<runtime::TokenEvent>> step() {
    auto events = router ? router->step() : engine->step();
    if (!events.ok()) return events.status();
    for (const auto& ev : *events) {
      if (ev.finish_reason == runtime::FinishReason::kError)
        return Status(StatusCode::kUnavailable, ev.error);
    }
    return events;
  }
};

// Starts the deployment. On a launcher's worker rank the process has served
// as a worker by the time this returns: *worker_exit holds its exit code.
StatusOr<Deployed> start_deployed(const FlagSet& flags, const BenchServeOptions& o,
                                  std::optional<int>* worker_exit) {
  Deployed d;
  if (o.disaggregated) {
    MSI_ASSIGN_OR_RETURN(Deployment dep, start_deployment(flags));
    if (dep.worker_rank > 0) {
      *worker_exit = worker_rank_exit_code(dep);
      return d;
    }
    d.router = std::move(dep.router);
    d.config = dep.config;
    d.description = "disaggregated: " + std::to_string(d.config->attention_workers) +
                    " attention + " + std::to_string(d.config->expert_workers) +
                    " expert workers, m=" + std::to_string(d.config->engine.micro_batches);
  } else {
    model::LoadOptions lo;
    lo.weights = o.weights;
    MSI_ASSIGN_OR_RETURN(
        auto w, model::ModelWeights::load(
                    o.model_dir, runtime::host_load_options(lo, flags.get_string("device"))));
    const runtime::EngineOptions eo = engine_options_from_flags(flags);
    MSI_ASSIGN_OR_RETURN(d.engine, runtime::Engine::create(std::move(w), eo));
    d.description = "co-located engine, m=" + std::to_string(eo.micro_batches);
  }
  d.description += std::string("; CPU kernels ") + kernels::cpu::isa_description() + ", " +
                   kernels::cpu::weight_format_name(o.weights) + " weights";
  return d;
}

// The requests of the run: random prompts, or multi-turn chats whose next
// turn is made when the previous answer ends.
class Workload {
 public:
  explicit Workload(const BenchServeOptions& o)
      : o_(o), rng_(o.seed), token_(0, o.model.vocab - 1) {
    if (o.multi_turn) {
      for (int64_t t = 0; t < o.system_len; ++t) system_prompt_.push_back(token_(rng_));
      chats_.assign(static_cast<size_t>(o.users), system_prompt_);
      for (int64_t u = 0; u < o.users; ++u) reqs_.push_back(next_turn(u, 0));
    }
    for (int64_t i = 0; i < (o.multi_turn ? 0 : o.decoding); ++i) {
      runtime::GenerationRequest req;
      req.id = i + 1;
      const int64_t in = random_length(rng_, o.input_len, o.ratio),
                    out = random_length(rng_, o.output_len, o.ratio);
      for (int64_t t = 0; t < in; ++t) req.prompt.push_back(token_(rng_));
      req.sampling.max_tokens = static_cast<int>(out);
      total_in_ += in;
      req.sampling.ignore_eos = true;
      reqs_.push_back(std::move(req));
    }
    for (int64_t i = 0; i < o.long_prompts; ++i) {
      runtime::GenerationRequest req;
      req.id = o.decoding + i + 1;
      for (int64_t t = 0; t < o.long_input_len; ++t) req.prompt.push_back(token_(rng_));
      req.sampling.max_tokens = static_cast<int>(o.long_output_len);
      req.sampling.ignore_eos = true;
      total_in_ += o.long_input_len;
      long_.push_back(std::move(req));
    }
  }

  // The requests sent at the start.
  const std::vector<runtime::GenerationRequest>& initial() const { return reqs_; }
  // Warm-up `w`: the first prompt (multi-turn: one of its own, not one the
  // run will find cached).
  runtime::GenerationRequest warmup(int64_t w) {
    runtime::GenerationRequest req = reqs_[0];
    req.id = o_.prompts + 1 + w;
    if (o_.multi_turn) {
      for (int32_t& t : req.prompt) t = token_(rng_);
    }
    return req;
  }
  // Multi-turn: request user * turns + turn + 1 is turn `turn` of chat
  // `user`; its answer's tokens join the chat. The user's next turn when
  // `ev` ends the answer and the chat has one.
  std::optional<runtime::GenerationRequest> on_token(const runtime::TokenEvent& ev) {
    const int64_t user = (ev.request_id - 1) / o_.turns, turn = (ev.request_id - 1) % o_.turns;
    chats_[static_cast<size_t>(user)].push_back(ev.token);
    if (ev.finished && turn + 1 < o_.turns) return next_turn(user, turn + 1);
    return std::nullopt;
  }
  int64_t total_in() const { return total_in_; }
  // Mixed: the long prompt due `steps` steps after every decoding request
  // had its first token (one each long_interval steps), if one is.
  std::optional<runtime::GenerationRequest> due_long(int64_t steps) {
    if (next_long_ >= long_.size() || steps < static_cast<int64_t>(next_long_) * o_.long_interval) {
      return std::nullopt;
    }
    return long_[next_long_++];
  }

 private:
  runtime::GenerationRequest next_turn(int64_t user, int64_t turn) {
    runtime::GenerationRequest req;
    req.id = user * o_.turns + turn + 1;
    auto& chat = chats_[static_cast<size_t>(user)];
    const int64_t in = random_length(rng_, o_.input_len, o_.ratio),
                  out = random_length(rng_, o_.output_len, o_.ratio);
    for (int64_t t = 0; t < in; ++t) chat.push_back(token_(rng_));
    req.prompt = chat;
    req.sampling.max_tokens = static_cast<int>(out);
    req.sampling.ignore_eos = true;
    total_in_ += static_cast<int64_t>(req.prompt.size());
    return req;
  }

  const BenchServeOptions& o_;
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int32_t> token_;
  std::vector<runtime::GenerationRequest> reqs_;
  std::vector<std::vector<int32_t>> chats_;  // multi-turn: system prompt, turns, answers
  std::vector<int32_t> system_prompt_;
  std::vector<runtime::GenerationRequest> long_;  // mixed: ids after the decoding ones
  size_t next_long_ = 0;
  int64_t total_in_ = 0;  // prompt tokens of every request made
};

// Warm-ups (as online): run to the end and discarded, so the measured run
// finds the engine's memory (KV pages, allocator arenas) touched, as a
// server that has been running does.
Status run_warmups(const BenchServeOptions& o, Deployed& d, Workload& load) {
  for (int64_t w = 0; w < o.warmups; ++w) {
    MSI_RETURN_IF_ERROR(d.add(load.warmup(w)).with_context("warm-up request"));
  }
  while (o.warmups > 0 && d.busy()) {
    MSI_RETURN_IF_ERROR(d.step().status().with_context("warm-up"));
  }
  if (o.warmups > 0 && d.router) {
    MSI_RETURN_IF_ERROR(d.router->stats(/*reset=*/true).status());
  }
  return ok_status();
}

// What the measured run saw.
struct Measured {
  std::map<int64_t, std::vector<double>> times;  // request -> token times (s since t0)
  std::map<int64_t, double> sent;  // multi-turn, mixed's long: request -> when sent (s since t0)
  int64_t decode_tokens = 0, steps = 0;
  double decode_from = 0;  // when every request had its first token (s since t0)
  double end = 0;
  std::vector<Json> workers;  // a deployment's, decode phase
  runtime::RoutingStats routing;
  int64_t prefix_queries = 0, prefix_hits = 0;
};

// Submits the workload and steps the deployment until it is idle.
StatusOr<Measured> run_measured(const BenchServeOptions& o, Deployed& d, Workload& load) {
  using clock = std::chrono::steady_clock;
  Measured m;
  const runtime::EngineCounters counters0 = d.counters();
  const auto t0 = clock::now();
  for (const auto& req : load.initial()) {
    MSI_RETURN_IF_ERROR(d.add(req).with_context("request " + std::to_string(req.id)));
  }
  int64_t first_tokens = 0, decode_steps = 0;
  while (true) {
    if (m.decode_from > 0) {
      // Mixed: the long prompts go out among the decoding requests.
      while (auto next = load.due_long(decode_steps)) {
        m.sent[next->id] = std::chrono::duration<double>(clock::now() - t0).count();
        MSI_RETURN_IF_ERROR(d.add(*next).with_context("request " + std::to_string(next->id)));
      }
      ++decode_steps;
    }
    if (!d.busy()) break;
    MSI_ASSIGN_OR_RETURN(auto events, d.step());
    const double now = std::chrono::duration<double>(clock::now() - t0).count();
    for (const auto& ev : events) {
      auto& t = m.times[ev.request_id];
      if (t.empty())
        ++first_tokens;
      else if (m.decode_from > 0)
        ++m.decode_tokens;
      t.push_back(now);
      if (!o.multi_turn) continue;
      // The answer joins the chat; at its end the user's next turn goes out.
      if (auto next = load.on_token(ev)) {
        m.sent[next->id] = now;
        MSI_RETURN_IF_ERROR(d.add(*next).with_context("request " + std::to_string(next->id)));
      }
    }
    if (m.decode_from == 0 && first_tokens == o.decoding) {
      m.decode_from = now;  // every request has its first token: the decode phase starts
      if (d.router) MSI_RETURN_IF_ERROR(d.router->stats(/*reset=*/true).status());
    }
    if (++m.steps % 64 == 0) {
      std::fprintf(stderr, "msinfer bench serve: step %lld, %zu of %lld requests started\n",
                   static_cast<long long>(m.steps), m.times.size(),
                   static_cast<long long>(o.prompts));
    }
  }
  m.end = std::chrono::duration<double>(clock::now() - t0).count();
  // Routing: decode phase for a deployment (its stats were reset then), the
  // whole run for the co-located engine.
  if (d.router) {
    MSI_ASSIGN_OR_RETURN(m.workers, d.router->stats(/*reset=*/true));
    MSI_ASSIGN_OR_RETURN(m.routing, d.router->routing(m.workers, o.model.layers, o.model.experts));
  } else {
    m.routing = runtime::RoutingStats::from_window(*d.engine->routing());
  }
  // Nobody has work: the deployment should sleep.
  if (d.router && o.idle_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_s));
    MSI_ASSIGN_OR_RETURN(auto st, d.router->stats(/*reset=*/false));
    for (size_t i = 0; i < m.workers.size() && i < st.size(); ++i) {
      m.workers[i]["idle_cpu_fraction"] = st[i]["cpu_fraction"];
    }
  }
  m.prefix_queries = d.counters().prefix_queries - counters0.prefix_queries;
  m.prefix_hits = d.counters().prefix_hits - counters0.prefix_hits;
  return m;
}

// The run's figures as --json prints them.
StatusOr<Json> report(const BenchServeOptions& o, const Deployed& d, const Workload& load,
                      const Measured& m) {
  std::vector<double> ttft, tbt;
  std::vector<double> decoding_tbt, long_ttft;  // mixed: the two kinds apart
  int64_t generated = 0;
  for (const auto& [id, t] : m.times) {
    auto at = m.sent.find(id);
    ttft.push_back(t.front() - (at == m.sent.end() ? 0.0 : at->second));
    const bool is_long = o.mixed && id > o.decoding;
    if (is_long) long_ttft.push_back(ttft.back());
    for (size_t i = 1; i < t.size(); ++i) {
      tbt.push_back(t[i] - t[i - 1]);
      if (o.mixed && !is_long) decoding_tbt.push_back(tbt.back());
    }
    generated += static_cast<int64_t>(t.size());
  }
  const double end = m.end;
  const double decode_tps = end > m.decode_from ? m.decode_tokens / (end - m.decode_from) : 0;
  Json out{{"deployment", d.description},
           {"isa", kernels::cpu::isa_name(kernels::cpu::active_isa())},
           {"weights", kernels::cpu::weight_format_name(o.weights)},
           {"num_prompts", o.prompts},
           {"input_len", o.input_len},
           {"output_len", o.output_len},
           {"random_range_ratio", o.ratio},
           {"input_tokens", load.total_in()},
           {"steps", m.steps},
           {"num_warmups", o.warmups},
           {"seconds", end},
           {"generated_tokens", generated},
           {"output_tokens_per_s", generated / end},
           {"decode_tokens_per_s", decode_tps},
           {"ttft_ms_p50", percentile(ttft, 0.5) * 1e3},
           {"ttft_ms_p99", percentile(ttft, 0.99) * 1e3},
           {"tbt_ms_p50", percentile(tbt, 0.5) * 1e3},
           {"tbt_ms_p99", percentile(tbt, 0.99) * 1e3},
           {"dataset", o.dataset},
           {"prefix_cache_query_tokens", m.prefix_queries},
           {"prefix_cache_hit_tokens", m.prefix_hits},
           {"prefill_tokens_computed", m.prefix_queries - m.prefix_hits},
           {"workers", m.workers},
           {"routing", m.routing.to_json()}};
  if (d.router && d.config->prefill_workers > 0) {
    // Prefill/decode disaggregation: what moved from the prefill workers.
    const auto& k = d.router->kv_transfers();
    out["prefill_workers"] = d.config->prefill_workers;
    out["kv_transfers"] = {
        {"sequences", k.sequences},
        {"into_pool", k.into_pool},
        {"bytes", k.bytes},
        {"writes", k.writes},
        {"write_s", k.write_s},
        {"ms_per_sequence", k.sequences > 0 ? k.write_s * 1e3 / k.sequences : 0.0},
        {"transfer_s", k.transfer_s},
        {"transfer_ms_per_sequence", k.sequences > 0 ? k.transfer_s * 1e3 / k.sequences : 0.0},
        {"fallbacks", k.fallbacks}};
  }
  if (o.mixed) {
    out["long_prompts"] = o.long_prompts;
    out["long_input_len"] = o.long_input_len;
    out["long_interval"] = o.long_interval;
    out["decoding_tbt_ms_p50"] = percentile(decoding_tbt, 0.5) * 1e3;
    out["decoding_tbt_ms_p99"] = percentile(decoding_tbt, 0.99) * 1e3;
    out["decoding_tbt_ms_max"] =
        decoding_tbt.empty() ? 0.0
                             : *std::max_element(decoding_tbt.begin(), decoding_tbt.end()) * 1e3;
    out["long_ttft_ms_p50"] = percentile(long_ttft, 0.5) * 1e3;
    out["long_ttft_ms_max"] =
        long_ttft.empty() ? 0.0 : *std::max_element(long_ttft.begin(), long_ttft.end()) * 1e3;
  }
  // max / mean predicted attention time of a step's micro-batches (m > 1).
  if (d.engine) {
    out["micro_batch_balance"] = d.engine->micro_batch_balance();
  } else if (const double b = mean_over(m.workers, "attention", "micro_batch_balance"); b > 0) {
    out["micro_batch_balance"] = b;
  }
  if (o.cpu_plan && (*o.cpu_plan)["predicted"].is_object()) {
    // The plan's prediction against this run: decode tokens/s and the time
    // between tokens (p50), and the relative error of each.
    const Json& pp = (*o.cpu_plan)["predicted"];
    const double ptps = pp.value("throughput_tokens_per_s", 0.0), ptbt = pp.value("tbt_ms", 0.0);
    const double mtbt = out["tbt_ms_p50"].get<double>();
    out["plan_prediction"] = pp;
    out["plan_vs_measured"] = {
        {"predicted_tokens_per_s", ptps},
        {"measured_tokens_per_s", decode_tps},
        {"tokens_per_s_error", decode_tps > 0 ? (ptps - decode_tps) / decode_tps : 0.0},
        {"predicted_tbt_ms", ptbt},
        {"measured_tbt_ms_p50", mtbt},
        {"tbt_error", mtbt > 0 ? (ptbt - mtbt) / mtbt : 0.0}};
  }
  if (!o.profile.empty()) {
    MSI_ASSIGN_OR_RETURN(Json p, predict(o.model, *d.config, o.prompts, o.profile));
    Json measured{{"t_a_s", mean_over(m.workers, "attention", "t_a_mean_s")},
                  {"t_e_s", max_over(m.workers, "expert", "t_e_mean_s")},
                  {"t_c_s", mean_over(m.workers, "expert", "t_c_mean_s")},
                  {"decode_tokens_per_s", decode_tps}};
    out["prediction"] = p;
    out["measured"] = measured;
  }
  return out;
}

void print_workers(const Json& out, double decode_s) {
  const auto& workers = out["workers"];
  if (workers.empty()) return;
  std::printf("\nworkers, decode phase (%.2f s):\n", decode_s);
  Table t({"worker", "busy", "network wait", "GEMM GFLOP/s", "T_a ms", "T_e ms", "T_c ms",
           "CPU when idle"});
  auto ms = [](const Json& w, const char* key) {
    return w.contains(key) ? fmt(w[key].get<double>() * 1e3, 3) : std::string("");
  };
  for (const auto& w : workers) {
    t.add_row(
        {w["role"].get<std::string>() + " " + std::to_string(w["index"].get<int>()) +
             (w.contains("tp_rank") ? " tp " + std::to_string(w["tp_rank"].get<int>()) : ""),
         fmt_pct(w["busy_fraction"].get<double>()), fmt_pct(w["wait_fraction"].get<double>()),
         fmt(w["gemm_gflops_per_s"].get<double>(), 1), ms(w, "t_a_mean_s"), ms(w, "t_e_mean_s"),
         ms(w, "t_c_mean_s"),
         w.contains("idle_cpu_fraction") ? fmt_pct(w["idle_cpu_fraction"].get<double>()) : ""});
  }
  std::cout << t.to_string();
}

void print_predictions(const Json& out, const std::string& plan_path) {
  if (out.contains("plan_vs_measured")) {
    const Json& v = out["plan_vs_measured"];
    std::printf(
        "\nplan %s: predicted %.1f decode tokens/s, TBT %.2f ms; measured %.1f, TBT p50 "
        "%.2f ms (errors %s, %s)\n",
        plan_path.c_str(), v["predicted_tokens_per_s"].get<double>(),
        v["predicted_tbt_ms"].get<double>(), v["measured_tokens_per_s"].get<double>(),
        v["measured_tbt_ms_p50"].get<double>(),
        fmt_pct(v["tokens_per_s_error"].get<double>()).c_str(),
        fmt_pct(v["tbt_error"].get<double>()).c_str());
  }
  if (out.contains("prediction")) {
    const Json& p = out["prediction"];
    const Json& m = out["measured"];
    std::printf("\nplanner prediction (%s, b_a %.1f, %s):\n",
                p["source"].get<std::string>().c_str(), p["b_a"].get<double>(),
                p["full_overlap"].get<bool>() ? "full overlap" : "no full overlap");
    Table t({"quantity", "predicted", "measured", "error"});
    for (const auto& [key, label, scale] : {std::tuple{"t_a_s", "T_a ms", 1e3},
                                            {"t_e_s", "T_e ms (slowest worker)", 1e3},
                                            {"t_c_s", "T_c ms", 1e3},
                                            {"decode_tokens_per_s", "decode tokens/s", 1.0}}) {
      if (!p.contains(key)) continue;
      const double pv = p[key].get<double>(), mv = m[key].get<double>();
      t.add_row({label, fmt(pv * scale, 3), fmt(mv * scale, 3),
                 mv > 0 ? fmt_pct((pv - mv) / mv) : std::string("")});
    }
    std::cout << t.to_string();
  }
}

// The summary lines and tables (without --json).
void print_report(const BenchServeOptions& o, const Json& out, const Measured& m) {
  const auto P = out["num_prompts"].get<long long>();
  const auto generated = out["generated_tokens"].get<long long>();
  const double end = out["seconds"].get<double>();
  std::printf(
      "%s: %lld requests, %lld tokens in %.2f s (%lld steps)\n"
      "TTFT p50 %.1f ms, p99 %.1f ms; TBT p50 %.2f ms, p99 %.2f ms; decode %.1f tokens/s, "
      "output %.1f tokens/s\n",
      out["deployment"].get<std::string>().c_str(), P, generated, end,
      out["steps"].get<long long>(), out["ttft_ms_p50"].get<double>(),
      out["ttft_ms_p99"].get<double>(), out["tbt_ms_p50"].get<double>(),
      out["tbt_ms_p99"].get<double>(), out["decode_tokens_per_s"].get<double>(),
      static_cast<double>(generated) / end);
  const auto queries = out["prefix_cache_query_tokens"].get<long long>();
  const auto hits = out["prefix_cache_hit_tokens"].get<long long>();
  std::printf(
      "prefill: %lld prompt tokens admitted, %lld from the prefix cache (%.1f%%), %lld "
      "computed\n",
      queries, hits,
      queries > 0 ? 100.0 * static_cast<double>(hits) / static_cast<double>(queries) : 0.0,
      queries - hits);
  if (o.mixed) {
    std::printf(
        "mixed: decoding requests' TBT p50 %.2f ms, p99 %.2f ms, max %.2f ms; %lld long prompts of "
        "%lld tokens: TTFT p50 %.1f ms, max %.1f ms\n",
        out["decoding_tbt_ms_p50"].get<double>(), out["decoding_tbt_ms_p99"].get<double>(),
        out["decoding_tbt_ms_max"].get<double>(), static_cast<long long>(o.long_prompts),
        static_cast<long long>(o.long_input_len), out["long_ttft_ms_p50"].get<double>(),
        out["long_ttft_ms_max"].get<double>());
  }
  std::printf("%s\n", routing_summary(out["routing"]).c_str());
  if (out.contains("micro_batch_balance") && out["micro_batch_balance"].get<double>() > 0) {
    std::printf("micro-batches: max/mean predicted attention time %.3f (1 = equal)\n",
                out["micro_batch_balance"].get<double>());
  }
  print_workers(out, m.end - m.decode_from);
  print_predictions(out, o.plan);
}

// The offline benchmark: options, deployment, warm-ups, the measured run, report.
int run_bench_serve_offline(const FlagSet& flags) {
  auto opts = bench_serve_options(flags);
  if (!opts.ok()) return report_error("bench serve", opts.status());
  const BenchServeOptions& o = *opts;
  std::optional<int> worker_exit;
  auto d = start_deployed(flags, o, &worker_exit);
  if (!d.ok()) return report_error("bench serve", d.status());
  if (worker_exit) return *worker_exit;
  std::fprintf(stderr, "msinfer bench serve: %s; %lld prompts x %lld tokens in, %lld out\n",
               d->description.c_str(), static_cast<long long>(o.prompts),
               static_cast<long long>(o.input_len), static_cast<long long>(o.output_len));
  Workload load(o);
  if (Status s = run_warmups(o, *d, load); !s.ok()) return report_error("bench serve", s);
  auto m = run_measured(o, *d, load);
  if (!m.ok()) return report_error("bench serve", m.status());
  auto out = report(o, *d, load, *m);
  if (!out.ok()) return report_error("bench serve", out.status());
  if (o.json) {
    std::cout << out->dump(2) << "\n";
    return 0;
  }
  print_report(o, *out, *m);
  return 0;
}

}  // namespace

int run_bench_serve(int argc, char** argv) {
  FlagSet flags("bench serve",
                "Offline serving benchmark: submits --num-prompts random prompts of --input-len\n"
                "tokens at once, each generating exactly --output-len tokens, runs them to the\n"
                "end and reports TTFT and time between tokens (p50/p99 over every request),\n"
                "decode tokens/s, and for a disaggregated deployment each worker's busy and\n"
                "network-wait fractions, achieved GEMM GFLOP/s and mean T_a / T_e / T_c\n"
                "(per micro-batch slot and layer with --json). Worker figures cover the\n"
                "decode phase: from the moment every request has its first token.");
  add_bench_serve_flags(flags);
  if (auto done = parse_command_line(flags, "bench serve", argc, argv, 3)) return *done;
  if (!flags.get_string("base-url").empty()) {
    if (flags.get_bool("offline")) {
      return report_error("bench serve", invalid_argument("give one of --offline and --base-url"));
    }
    return run_bench_serve_online(flags);
  }
  return run_bench_serve_offline(flags);
}

}  // namespace msinfer::cli
