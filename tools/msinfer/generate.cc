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

}  // namespace

int run_generate(int argc, char** argv) {
  FlagSet flags("generate",
                "Generates text for one prompt with the co-located engine (all experts in this\n"
                "process), streaming tokens as they are produced, then prints TTFT, time\n"
                "between tokens and decode tokens/s.");
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
  Status s = flags.parse(argc, argv, 2);
  if (!s.ok()) return report_error("generate", s);
  if (flags.help_requested()) {
    std::cout << flags.usage();
    return 0;
  }
  if (!flags.positional().empty()) {
    return report_error(
        "generate", invalid_argument("unexpected argument '" + flags.positional().front() + "'"));
  }
  if (flags.get_string("model").empty()) {
    return report_error("generate", invalid_argument("--model is required"));
  }
  if (flags.was_set("prompt") == flags.was_set("prompt-ids")) {
    return report_error("generate",
                        invalid_argument("give exactly one of --prompt and --prompt-ids"));
  }
  // Every flag is checked before the model loads (issue 12 item 7).
  if (!(flags.get_double("top-p") > 0)) {
    return report_error("generate", invalid_argument("--top-p must be in (0, 1]"));
  }
  std::vector<int32_t> prompt_ids, stop_ids;
  if (flags.was_set("prompt-ids")) {
    auto ids = parse_ids(flags.get_string("prompt-ids"), "--prompt-ids");
    if (!ids.ok()) return report_error("generate", ids.status());
    prompt_ids = *ids;
    if (prompt_ids.empty())
      return report_error("generate", invalid_argument("--prompt-ids: empty"));
  }
  if (!flags.get_string("stop-ids").empty()) {
    auto ids = parse_ids(flags.get_string("stop-ids"), "--stop-ids");
    if (!ids.ok()) return report_error("generate", ids.status());
    stop_ids = *ids;
  }
  s = check_deployment_flags(flags);
  if (s.ok()) s = check_kv_cache_fits_memory(flags.get_int("kv-cache-mb"));
  if (s.ok()) s = check_model_dir(flags);
  if (!s.ok()) return report_error("generate", s);
  auto weight_format = apply_engine_flags(flags);
  if (!weight_format.ok()) return report_error("generate", weight_format.status());
  const std::string dir = flags.get_string("model");
  const bool disaggregated = deployment_requested(flags);
  std::shared_ptr<const model::ModelWeights> w;
  if (!disaggregated) {
    model::LoadOptions lo;
    lo.weights = *weight_format;
    auto weights =
        model::ModelWeights::load(dir, runtime::host_load_options(lo, flags.get_string("device")));
    if (!weights.ok()) return report_error("generate", weights.status());
    w = std::move(weights).value();
  }
  auto tok = model::Tokenizer::load(dir);
  if (!tok.ok() && flags.was_set("prompt")) return report_error("generate", tok.status());

  runtime::GenerationRequest req;
  req.id = 1;
  if (flags.was_set("prompt")) {
    req.prompt = tok->encode(flags.get_string("prompt"));
  } else {
    req.prompt = prompt_ids;
  }
  runtime::SamplingParams& sp = req.sampling;
  sp.max_tokens = static_cast<int>(flags.get_int("max-tokens"));
  sp.temperature = static_cast<float>(flags.get_double("temperature"));
  sp.top_k = static_cast<int>(flags.get_int("top-k"));
  sp.top_p = static_cast<float>(flags.get_double("top-p"));
  sp.seed = static_cast<uint64_t>(flags.get_int("seed"));
  sp.ignore_eos = flags.get_bool("ignore-eos");
  sp.stop_token_ids = stop_ids;
  sp.logprobs = static_cast<int>(flags.get_int("logprobs"));
  std::unique_ptr<runtime::Engine> engine;
  std::unique_ptr<runtime::Router> router;
  if (disaggregated) {
    auto d = start_deployment(flags);
    if (!d.ok()) return report_error("generate", d.status());
    if (d->worker_rank > 0) return worker_rank_exit_code(*d);
    router = std::move(d->router);
    s = router->add(req);
  } else {
    auto e = runtime::Engine::create(w, colocated_engine_options(flags));
    if (!e.ok()) return report_error("generate", e.status());
    engine = std::move(e).value();
    s = engine->add(req);
  }
  // A request that does not fit the context or the KV cache is bad input
  // (--prompt, --max-tokens, --kv-cache-mb), exit 2, not a run-time failure.
  if (s.code() == StatusCode::kResourceExhausted) s = invalid_argument(s.message());
  if (!s.ok()) return report_error("generate", s);
  auto step = [&]() { return router ? router->step() : engine->step(); };
  auto idle = [&]() { return router ? router->idle() : engine->idle(); };

  const bool json = flags.get_bool("json");
  std::unique_ptr<model::StreamingDecoder> stream;
  if (tok.ok()) stream = std::make_unique<model::StreamingDecoder>(*tok);
  std::vector<int32_t> out_ids;
  std::vector<double> token_times;
  Json logprobs = Json::array();  // with --logprobs: one entry per generated token
  std::string finish_reason;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int64_t steps = 0;
  Progress progress("generate");
  while (!idle()) {
    auto events = step();
    if (!events.ok()) {
      return report_error("generate",
                          events.status().with_context("request " + std::to_string(req.id)));
    }
    ++steps;
    if (router && steps % 16 == 0) {
      std::fprintf(stderr, "msinfer: step %lld\n", static_cast<long long>(steps));
    } else if (!router && (json || !stream)) {
      // Text streams to stdout; without it (--json, no tokenizer) progress goes to stderr.
      progress.update("step " + std::to_string(steps) + ", " + std::to_string(out_ids.size()) +
                      " tokens generated");
    }
    for (const auto& ev : *events) {
      if (ev.finish_reason == "error") {
        return report_error("generate", Status(StatusCode::kUnavailable, ev.error));
      }
      token_times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
      out_ids.push_back(ev.token);
      if (sp.logprobs >= 0) {
        logprobs.push_back({{"token", ev.token}, {"logprob", ev.logprob}, {"top", Json::array()}});
        for (const auto& [id, lp] : ev.top_logprobs) logprobs.back()["top"].push_back({id, lp});
      }
      if (stream && !json) {
        std::string piece = stream->push(ev.token);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      if (ev.finished) finish_reason = ev.finish_reason;
    }
  }
  if (stream && !json) {
    std::string rest = stream->finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  const double ttft = token_times.empty() ? 0 : token_times.front();
  std::vector<double> gaps;
  for (size_t i = 1; i < token_times.size(); ++i)
    gaps.push_back(token_times[i] - token_times[i - 1]);
  const double tbt_mean = mean(gaps);
  const double tbt_p50 = percentile(gaps, 0.5);
  const double decode_s = token_times.size() > 1 ? token_times.back() - token_times.front() : 0;
  const double tps = decode_s > 0 ? (token_times.size() - 1) / decode_s : 0;
  std::string text = tok.ok() ? tok->decode(out_ids, true) : "";
  const ProcessMemory mem = read_process_memory();
  // Rows routed per (layer, expert) and per expert worker, with max / mean.
  StatusOr<runtime::RoutingStats> routing = runtime::RoutingStats();
  if (router) {
    auto ws = router->stats(/*reset=*/false);
    auto mc = load_model_config(dir);
    if (!ws.ok()) return report_error("generate", ws.status());
    if (!mc.ok()) return report_error("generate", mc.status());
    routing = router->routing(*ws, mc->layers, mc->experts);
  } else {
    routing = runtime::RoutingStats::from_window(*engine->routing());
  }
  if (!routing.ok()) return report_error("generate", routing.status());
  if (json) {
    Json j{{"prompt_ids", req.prompt},
           {"token_ids", out_ids},
           {"text", Json(text)},
           {"finish_reason", finish_reason},
           {"ttft_ms", ttft * 1e3},
           {"tbt_ms_mean", tbt_mean * 1e3},
           {"tbt_ms_p50", tbt_p50 * 1e3},
           // The longest stall between two tokens (a worker's death, a restart).
           {"tbt_ms_max", gaps.empty() ? 0.0 : *std::max_element(gaps.begin(), gaps.end()) * 1e3},
           {"decode_tokens_per_s", tps},
           {"rss_mb", mem.rss_bytes / 1048576.0},
           {"peak_rss_mb", mem.peak_rss_bytes / 1048576.0},
           {"weights_packed_mb", w ? w->packed_bytes() / 1048576.0 : 0.0},
           {"kv_cache_mb", static_cast<double>(flags.get_int("kv-cache-mb"))},
           {"isa", kernels::cpu::isa_name(kernels::cpu::active_isa())},
           {"weights", kernels::cpu::weight_format_name(*weight_format)},
           {"routing", routing->to_json()}};
    if (sp.logprobs >= 0) j["logprobs"] = logprobs;
    // Invalid UTF-8 (a random model may emit half a character) must not break the JSON.
    std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  } else {
    std::printf(
        "\n\n%zu prompt tokens, %zu generated (%s); TTFT %.1f ms, TBT %.2f ms mean / %.2f "
        "ms p50, %.1f tokens/s decode; RSS %.0f MiB (%s weights %.0f MiB, KV budget %lld "
        "MiB); CPU kernels %s\n",
        req.prompt.size(), out_ids.size(), finish_reason.c_str(), ttft * 1e3, tbt_mean * 1e3,
        tbt_p50 * 1e3, tps, mem.rss_bytes / 1048576.0,
        kernels::cpu::weight_format_name(*weight_format), w ? w->packed_bytes() / 1048576.0 : 0.0,
        static_cast<long long>(flags.get_int("kv-cache-mb")),
        kernels::cpu::isa_description().c_str());
    std::printf("%s (--json for the counts)\n", routing_summary(routing->to_json()).c_str());
    for (size_t i = 0; i < logprobs.size(); ++i) {
      const Json& e = logprobs[i];
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
  return 0;
}

}  // namespace msinfer::cli
