// msinfer generate: run a prompt through the engine and stream the text.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <sstream>

#include "commands.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/process.h"
#include "msinfer/core/stats.h"
#include "msinfer/core/table.h"
#include "msinfer/kernels/cpu/isa.h"
#include "msinfer/model/tokenizer.h"
#include "msinfer/runtime/balance.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/router.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

StatusOr<std::vector<int32_t>> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const bool digits = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
    long v = digits ? std::strtol(item.c_str(), &end, 10) : -1;
    if (!digits || v < 0 || v > (1L << 30)) {
      return invalid_argument(flag + ": expected comma-separated token ids, got '" + item + "'");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void add_generate_flags(FlagSet& flags) {
  flags.add_string("model", "", "model directory (config.json, *.safetensors, tokenizer.json)");
  flags.add_string("prompt", "", "prompt text (tokenised with the model's tokenizer)");
  flags.add_string("prompt-ids", "", "prompt as comma-separated token ids");
  flags.add_int("max-tokens", 16, 1, 1 << 24, "tokens to generate at most");
  flags.add_double("temperature", 0, 0, 100, "0 for greedy");
  flags.add_int("top-k", 0, 0, 1 << 24, "sample from the k most likely tokens (0: all)");
  flags.add_double("top-p", 1, 0, 1, "nucleus sampling mass (> 0)");
  flags.add_int("seed", 0, 0, INT64_MAX, "sampling seed");
  flags.add_string("stop-ids", "", "comma-separated token ids that end generation");
  flags.add_bool("ignore-eos", "keep going past the end-of-sequence token");
  flags.add_int("kv-cache-mb", 256, 1, 1 << 20,
                "KV cache budget in MiB (at most this machine's memory)", "MSINFER_KV_CACHE_MB");
  flags.add_bool("json", "print one JSON object (token_ids, text, timings) at the end");
  flags.add_int("logprobs", -1, -1, 20,
                "N >= 0: report each generated token's log-probability and the N most\n"
                "likely tokens' (after the prompt and every token; -1: off)");
  add_step_budget_flag(flags);
  add_engine_flags(flags);
  add_deployment_flags(flags);
  flags.add_string("plan", "",
                   "plan document from `msinfer plan --out`: its attention_nodes and "
                   "micro_batches (one expert worker per expert) set the deployment");
  flags.set_epilog(
      "examples:\n"
      "  msinfer make-model --preset tiny-mixtral --out /tmp/m\n"
      "  msinfer generate --model /tmp/m --prompt \"Hello\" --max-tokens 16\n"
      "  msinfer generate --model /tmp/m --prompt-ids 1,2,3 --temperature 0.8 --seed 7 --json\n"
      "  msinfer generate --model /tmp/m --prompt Hi --attention-workers 2 --expert-workers 4 "
      "--micro-batches 2\n\n"
      "With --attention-workers, the router (this process) starts attention and expert worker\n"
      "processes joined by the M2N library and stops them on exit (docs/RUNTIME.md).");
}

// What the flags ask for, checked before the model loads (issue 12 item 7).
// The deployment and engine flags stay in the FlagSet: start_deployment and
// engine_options_from_flags read them there.
struct GenerateOptions {
  std::string model_dir;
  std::string prompt;               // text, or
  std::vector<int32_t> prompt_ids;  // ids (exactly one of the two)
  runtime::SamplingParams sampling;
  kernels::cpu::WeightFormat weights{};
  bool disaggregated = false;
  bool json = false;
  int64_t kv_cache_mb = 0;
};

StatusOr<GenerateOptions> generate_options(const FlagSet& flags) {
  GenerateOptions o;
  o.model_dir = flags.get_string("model");
  if (o.model_dir.empty()) return invalid_argument("--model is required");
  if (flags.was_set("prompt") == flags.was_set("prompt-ids")) {
    return invalid_argument("give exactly one of --prompt and --prompt-ids");
  }
  if (!(flags.get_double("top-p") > 0)) return invalid_argument("--top-p must be in (0, 1]");
  if (flags.was_set("prompt-ids")) {
    MSI_ASSIGN_OR_RETURN(o.prompt_ids, parse_ids(flags.get_string("prompt-ids"), "--prompt-ids"));
    if (o.prompt_ids.empty()) return invalid_argument("--prompt-ids: empty");
  } else {
    o.prompt = flags.get_string("prompt");
  }
  runtime::SamplingParams& sp = o.sampling;
  if (!flags.get_string("stop-ids").empty()) {
    MSI_ASSIGN_OR_RETURN(sp.stop_token_ids, parse_ids(flags.get_string("stop-ids"), "--stop-ids"));
  }
  sp.max_tokens = static_cast<int>(flags.get_int("max-tokens"));
  sp.temperature = static_cast<float>(flags.get_double("temperature"));
  sp.top_k = static_cast<int>(flags.get_int("top-k"));
  sp.top_p = static_cast<float>(flags.get_double("top-p"));
  sp.seed = static_cast<uint64_t>(flags.get_int("seed"));
  sp.ignore_eos = flags.get_bool("ignore-eos");
  sp.logprobs = static_cast<int>(flags.get_int("logprobs"));
  o.kv_cache_mb = flags.get_int("kv-cache-mb");
  o.json = flags.get_bool("json");
  o.disaggregated = deployment_requested(flags);
  MSI_RETURN_IF_ERROR(check_deployment_flags(flags));
  MSI_RETURN_IF_ERROR(check_kv_cache_fits_memory(o.kv_cache_mb));
  MSI_RETURN_IF_ERROR(check_model_dir(flags));
  MSI_ASSIGN_OR_RETURN(o.weights, apply_engine_flags(flags));
  return o;
}

// The request's tokens as they came, with their times (seconds from the start).
struct Generated {
  std::vector<int32_t> ids;
  std::vector<double> times;
  Json logprobs = Json::array();  // with logprobs >= 0: one entry per token
  runtime::FinishReason finish_reason = runtime::FinishReason::kNone;
};

// Steps `step` until `idle`, streaming text to stdout unless --json (or no
// tokenizer: `stream` null), progress to stderr.
template <typename Step, typename Idle>
StatusOr<Generated> run_to_end(const GenerateOptions& o, int64_t request_id, bool deployment,
                               model::StreamingDecoder* stream, Step step, Idle idle) {
  Generated g;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int64_t steps = 0;
  Progress progress("generate");
  while (!idle()) {
    auto events = step();
    if (!events.ok()) return events.status().with_context("request " + std::to_string(request_id));
    ++steps;
    if (deployment && steps % 16 == 0) {
      std::fprintf(stderr, "msinfer: step %lld\n", static_cast<long long>(steps));
    } else if (!deployment && (o.json || stream == nullptr)) {
      // Text streams to stdout; without it (--json, no tokenizer) progress goes to stderr.
      progress.update("step " + std::to_string(steps) + ", " + std::to_string(g.ids.size()) +
                      " tokens generated");
    }
    for (const auto& ev : *events) {
      if (ev.finish_reason == runtime::FinishReason::kError)
        return Status(StatusCode::kUnavailable, ev.error);
      g.times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
      g.ids.push_back(ev.token);
      if (o.sampling.logprobs >= 0) {
        g.logprobs.push_back(
            {{"token", ev.token}, {"logprob", ev.logprob}, {"top", Json::array()}});
        for (const auto& [id, lp] : ev.top_logprobs) g.logprobs.back()["top"].push_back({id, lp});
      }
      if (stream != nullptr && !o.json) {
        std::string piece = stream->push(ev.token);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      if (ev.finished) g.finish_reason = ev.finish_reason;
    }
  }
  if (stream != nullptr && !o.json) {
    std::string rest = stream->finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  return g;
}

// The run's figures: --json's object, or the summary lines.
void print_report(const GenerateOptions& o, const std::vector<int32_t>& prompt, const Generated& g,
                  const std::string& text, const model::ModelWeights* w,
                  const runtime::RoutingStats& routing) {
  const double ttft = g.times.empty() ? 0 : g.times.front();
  std::vector<double> gaps;
  for (size_t i = 1; i < g.times.size(); ++i) gaps.push_back(g.times[i] - g.times[i - 1]);
  const double tbt_mean = mean(gaps);
  const double tbt_p50 = percentile(gaps, 0.5);
  const double decode_s = g.times.size() > 1 ? g.times.back() - g.times.front() : 0;
  const double tps = decode_s > 0 ? (g.times.size() - 1) / decode_s : 0;
  const ProcessMemory mem = read_process_memory();
  const double weights_mb = w ? w->packed_bytes() / 1048576.0 : 0.0;
  if (o.json) {
    Json j{{"prompt_ids", prompt},
           {"token_ids", g.ids},
           {"text", Json(text)},
           {"finish_reason", runtime::finish_reason_name(g.finish_reason)},
           {"ttft_ms", ttft * 1e3},
           {"tbt_ms_mean", tbt_mean * 1e3},
           {"tbt_ms_p50", tbt_p50 * 1e3},
           // The longest stall between two tokens (a worker's death, a restart).
           {"tbt_ms_max", gaps.empty() ? 0.0 : *std::max_element(gaps.begin(), gaps.end()) * 1e3},
           {"decode_tokens_per_s", tps},
           {"rss_mb", mem.rss_bytes / 1048576.0},
           {"peak_rss_mb", mem.peak_rss_bytes / 1048576.0},
           {"weights_packed_mb", weights_mb},
           {"kv_cache_mb", static_cast<double>(o.kv_cache_mb)},
           {"isa", kernels::cpu::isa_name(kernels::cpu::active_isa())},
           {"weights", kernels::cpu::weight_format_name(o.weights)},
           {"routing", routing.to_json()}};
    if (o.sampling.logprobs >= 0) j["logprobs"] = g.logprobs;
    // Invalid UTF-8 (a random model may emit half a character) must not break the JSON.
    std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    return;
  }
  std::printf(
      "\n\n%zu prompt tokens, %zu generated (%s); TTFT %.1f ms, TBT %.2f ms mean / %.2f "
      "ms p50, %.1f tokens/s decode; RSS %.0f MiB (%s weights %.0f MiB, KV budget %lld "
      "MiB); CPU kernels %s\n",
      prompt.size(), g.ids.size(), runtime::finish_reason_name(g.finish_reason), ttft * 1e3,
      tbt_mean * 1e3, tbt_p50 * 1e3, tps, mem.rss_bytes / 1048576.0,
      kernels::cpu::weight_format_name(o.weights), weights_mb,
      static_cast<long long>(o.kv_cache_mb), kernels::cpu::isa_description().c_str());
  std::printf("%s (--json for the counts)\n", routing_summary(routing.to_json()).c_str());
  for (size_t i = 0; i < g.logprobs.size(); ++i) {
    const Json& e = g.logprobs[i];
    std::printf("token %zu: id %d logprob %.4f", i, e["token"].get<int>(),
                e["logprob"].get<double>());
    const char* sep = "; top:";
    for (const auto& t : e["top"]) {
      std::printf("%s %d %.4f", sep, t[0].get<int>(), t[1].get<double>());
      sep = ",";
    }
    std::printf("\n");
  }
}

}  // namespace

int run_generate(int argc, char** argv) {
  FlagSet flags("generate",
                "Generates text for one prompt with the co-located engine (all experts in this\n"
                "process), streaming tokens as they are produced, then prints TTFT, time\n"
                "between tokens and decode tokens/s.");
  add_generate_flags(flags);
  if (auto done = parse_command_line(flags, "generate", argc, argv, 2)) return *done;
  auto opts = generate_options(flags);
  if (!opts.ok()) return report_error("generate", opts.status());
  const GenerateOptions& o = *opts;
  std::shared_ptr<const model::ModelWeights> w;
  if (!o.disaggregated) {
    model::LoadOptions lo;
    lo.weights = o.weights;
    auto weights = model::ModelWeights::load(
        o.model_dir, runtime::host_load_options(lo, flags.get_string("device")));
    if (!weights.ok()) return report_error("generate", weights.status());
    w = std::move(weights).value();
  }
  auto tok = model::Tokenizer::load(o.model_dir);
  if (!tok.ok() && o.prompt_ids.empty()) return report_error("generate", tok.status());

  runtime::GenerationRequest req;
  req.id = 1;
  req.prompt = o.prompt_ids.empty() ? tok->encode(o.prompt) : o.prompt_ids;
  req.sampling = o.sampling;
  std::unique_ptr<runtime::Engine> engine;
  std::unique_ptr<runtime::Router> router;
  Status s;
  if (o.disaggregated) {
    auto d = start_deployment(flags);
    if (!d.ok()) return report_error("generate", d.status());
    if (d->worker_rank > 0) return worker_rank_exit_code(*d);
    router = std::move(d->router);
    s = router->add(req);
  } else {
    auto e = runtime::Engine::create(w, engine_options_from_flags(flags));
    if (!e.ok()) return report_error("generate", e.status());
    engine = std::move(e).value();
    s = engine->add(req);
  }
  // A request that does not fit the context or the KV cache is bad input
  // (--prompt, --max-tokens, --kv-cache-mb), exit 2, not a run-time failure.
  if (s.code() == StatusCode::kResourceExhausted) s = invalid_argument(s.message());
  if (!s.ok()) return report_error("generate", s);

  std::unique_ptr<model::StreamingDecoder> stream;
  if (tok.ok()) stream = std::make_unique<model::StreamingDecoder>(*tok);
  auto generated = run_to_end(
      o, req.id, router != nullptr, stream.get(),
      [&] { return router ? router->step() : engine->step(); },
      [&] { return router ? router->idle() : engine->idle(); });
  if (!generated.ok()) return report_error("generate", generated.status());
  const std::string text = tok.ok() ? tok->decode(generated->ids, true) : "";
  // Rows routed per (layer, expert) and per expert worker, with max / mean.
  StatusOr<runtime::RoutingStats> routing = runtime::RoutingStats();
  if (router) {
    auto ws = router->stats(/*reset=*/false);
    auto mc = load_model_config(o.model_dir);
    if (!ws.ok()) return report_error("generate", ws.status());
    if (!mc.ok()) return report_error("generate", mc.status());
    routing = router->routing(*ws, mc->layers, mc->experts);
  } else {
    routing = runtime::RoutingStats::from_window(*engine->routing());
  }
  if (!routing.ok()) return report_error("generate", routing.status());
  print_report(o, req.prompt, *generated, text, w.get(), *routing);
  return 0;
}

}  // namespace msinfer::cli
