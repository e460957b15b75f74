// msinfer bench serve --base-url: the online benchmark against a running
// OpenAI-compatible server (msinfer serve, or any other), reporting what users
// of `vllm bench serve` expect.
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "commands.h"
#include "msinfer/core/flags.h"
#include "msinfer/core/stats.h"
#include "msinfer/server/bench_client.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

StatusOr<std::vector<server::BenchPrompt>> load_dataset(const FlagSet& flags, bool chat) {
  const std::string ds = flags.get_string("dataset");
  if (ds == "multi-turn") {
    return invalid_argument(
        "--dataset multi-turn: runs offline (--offline --model DIR), where a "
        "chat's next turn follows its answer");
  }
  const int64_t n = flags.get_int("num-prompts"), in = flags.get_int("input-len"),
                out = flags.get_int("output-len");
  std::vector<server::BenchPrompt> prompts;
  if (ds == "random") {
    std::mt19937_64 rng(static_cast<uint64_t>(flags.get_int("seed")));
    // Ids below 259 exist in every tokenizer here (byte fallback or byte level).
    std::uniform_int_distribution<int32_t> id(3, 258);
    std::uniform_int_distribution<int> letter('a', 'z');
    const double ratio = flags.get_double("random-range-ratio");
    for (int64_t i = 0; i < n; ++i) {
      server::BenchPrompt p;
      p.output_len = random_length(rng, out, ratio);
      p.prompt_len = random_length(rng, in, ratio);
      const int64_t len = p.prompt_len;
      if (chat) {
        std::string text;
        for (int64_t w = 0; w < len; ++w) {
          text += w ? " " : "";
          for (int c = 0; c < 4; ++c) text += static_cast<char>(letter(rng));
        }
        p.prompt = text;
      } else {
        Json ids = Json::array();
        for (int64_t t = 0; t < len; ++t) ids.push_back(id(rng));
        p.prompt = ids;
      }
      prompts.push_back(std::move(p));
    }
    return prompts;
  }
  // A JSON-lines file: {"prompt": text or ids, "output_len": n (optional)} per line.
  std::ifstream f(ds);
  if (!f) return not_found("--dataset " + ds + ": cannot open (give 'random' or a .jsonl file)");
  std::string line;
  int ln = 0;
  while (std::getline(f, line) && static_cast<int64_t>(prompts.size()) < n) {
    ++ln;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    MSI_ASSIGN_OR_RETURN(Json j, parse_json(line, ds + ":" + std::to_string(ln)));
    if (!j.is_object() || !j.contains("prompt") ||
        !(j["prompt"].is_string() || j["prompt"].is_array())) {
      return invalid_argument(ds + ":" + std::to_string(ln) +
                              ": expected {\"prompt\": text or ids}");
    }
    if (chat && !j["prompt"].is_string()) {
      return invalid_argument(ds + ":" + std::to_string(ln) + ": chat prompts must be text");
    }
    server::BenchPrompt p;
    p.prompt = j["prompt"];
    p.output_len = j.value("output_len", out);
    if (p.output_len < 1)
      return invalid_argument(ds + ":" + std::to_string(ln) + ": output_len must be >= 1");
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return invalid_argument("--dataset " + ds + ": no prompts");
  // Fewer lines than --num-prompts: cycle.
  for (size_t i = 0; static_cast<int64_t>(prompts.size()) < n; ++i) prompts.push_back(prompts[i]);
  return prompts;
}

// "ttft:500 tpot:50 e2el:3000" (spaces or commas): SLOs in ms.
StatusOr<std::map<std::string, double>> parse_goodput(const std::string& s) {
  std::map<std::string, double> slo;
  std::string spec = s;
  for (char& c : spec) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(spec);
  std::string item;
  while (in >> item) {
    const size_t colon = item.find(':');
    char* end = nullptr;
    const std::string key = item.substr(0, colon);
    const double v = colon == std::string::npos ? -1 : std::strtod(item.c_str() + colon + 1, &end);
    if ((key != "ttft" && key != "tpot" && key != "e2el") || !(v > 0) || *end != '\0') {
      return invalid_argument("--goodput: expected ttft:MS tpot:MS e2el:MS, got '" + item + "'");
    }
    slo[key] = v;
  }
  return slo;
}

void raise_fd_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

Json summary(const std::vector<double>& s_values) {
  std::vector<double> ms;
  for (double v : s_values) ms.push_back(v * 1e3);
  if (ms.empty())
    return Json{{"mean", nullptr}, {"p50", nullptr}, {"p90", nullptr}, {"p99", nullptr}};
  return Json{{"mean", mean(ms)},
              {"p50", percentile(ms, 0.5)},
              {"p90", percentile(ms, 0.9)},
              {"p99", percentile(ms, 0.99)}};
}

}  // namespace

int run_bench_serve_online(const FlagSet& flags) {
  server::OnlineBenchOptions o;
  Status s = server::parse_base_url(flags.get_string("base-url"), &o.host, &o.port);
  if (!s.ok()) return report_error("bench serve", s);
  o.endpoint = flags.get_string("endpoint");
  if (o.endpoint != "/v1/completions" && o.endpoint != "/v1/chat/completions") {
    return report_error(
        "bench serve",
        invalid_argument("--endpoint must be /v1/completions or /v1/chat/completions"));
  }
  if (flags.get_int("num-prompts") < 1 || flags.get_int("input-len") < 1 ||
      flags.get_int("output-len") < 1) {
    return report_error(
        "bench serve",
        invalid_argument("--num-prompts, --input-len and --output-len must be >= 1"));
  }
  if (flags.get_int("max-concurrency") < 0) {
    return report_error("bench serve", invalid_argument("--max-concurrency must be >= 0"));
  }
  auto goodput = parse_goodput(flags.get_string("goodput"));
  if (!goodput.ok()) return report_error("bench serve", goodput.status());
  auto prompts = load_dataset(flags, o.endpoint.find("chat") != std::string::npos);
  if (!prompts.ok()) return report_error("bench serve", prompts.status());
  o.prompts = std::move(prompts).value();
  o.model = flags.get_string("served-model-name");
  o.api_key = flags.get_string("api-key");
  o.request_rate = flags.get_double("request-rate");
  o.burstiness = flags.get_double("burstiness");
  o.max_concurrency = flags.get_int("max-concurrency");
  o.seed = static_cast<uint64_t>(flags.get_int("seed"));
  o.num_warmups = flags.get_int("num-warmups");
  raise_fd_limit();
  auto rep = server::run_online_bench(o);
  if (!rep.ok()) return report_error("bench serve", rep.status());

  int64_t ok = 0, failed = 0, rejected = 0, in_tokens = 0, out_tokens = 0, good = 0;
  int64_t cached_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::map<std::string, int64_t> errors;
  for (const auto& r : rep->results) {
    if (!r.ok) {
      ++failed;
      if (r.http_status == 429) ++rejected;
      ++errors[r.error.substr(0, 120)];
      continue;
    }
    ++ok;
    in_tokens += r.prompt_tokens;
    cached_tokens += r.cached_tokens;
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    const double t =
        r.output_tokens > 1 ? (r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1) : 0;
    if (r.output_tokens > 1) tpot.push_back(t);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    bool meets = true;
    for (const auto& [k, ms] : *goodput) {
      const double v = k == "ttft" ? r.ttft_s : k == "tpot" ? t : r.e2e_s;
      meets = meets && v * 1e3 <= ms;
    }
    good += meets ? 1 : 0;
  }
  const double d = rep->duration_s;
  Json j{{"base_url", flags.get_string("base-url")},
         {"endpoint", o.endpoint},
         {"num_prompts", static_cast<int64_t>(o.prompts.size())},
         {"request_rate",
          std::isinf(o.request_rate) || o.request_rate <= 0 ? Json("inf") : Json(o.request_rate)},
         {"burstiness", o.burstiness},
         {"max_concurrency", o.max_concurrency},
         {"completed", ok},
         {"failed", failed},
         {"rejected_429", rejected},
         {"duration_s", d},
         {"total_input_tokens", in_tokens},
         {"total_output_tokens", out_tokens},
         {"prefix_cache_hit_tokens", cached_tokens},
         {"request_throughput", ok / d},
         {"output_throughput", out_tokens / d},
         {"total_token_throughput", (in_tokens + out_tokens) / d},
         {"max_in_flight", rep->max_in_flight},
         {"num_warmups", o.num_warmups},
         {"connections_opened", rep->connections_opened},
         {"ttft_ms", summary(ttft)},
         {"tpot_ms", summary(tpot)},
         {"itl_ms", summary(itl)},
         {"e2el_ms", summary(e2e)}};
  if (!goodput->empty()) j["goodput"] = good / d;
  if (!errors.empty()) j["errors"] = errors;
  if (flags.get_bool("json")) {
    std::cout << j.dump(2) << "\n";
    return failed == static_cast<int64_t>(o.prompts.size()) ? 1 : 0;
  }
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %lld\n", "Successful requests:", static_cast<long long>(ok));
  std::printf("%-40s %lld (429: %lld)\n", "Failed requests:", static_cast<long long>(failed),
              static_cast<long long>(rejected));
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", d);
  std::printf("%-40s %lld\n", "Total input tokens:", static_cast<long long>(in_tokens));
  std::printf("%-40s %lld\n", "Total generated tokens:", static_cast<long long>(out_tokens));
  std::printf("%-40s %lld\n",
              "Prompt tokens from the prefix cache:", static_cast<long long>(cached_tokens));
  std::printf("%-40s %.2f\n", "Request throughput (req/s):", ok / d);
  if (!goodput->empty()) std::printf("%-40s %.2f\n", "Request goodput (req/s):", good / d);
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s):", out_tokens / d);
  std::printf("%-40s %.2f\n", "Total token throughput (tok/s):", (in_tokens + out_tokens) / d);
  std::printf("%-40s %lld\n",
              "Max concurrent requests:", static_cast<long long>(rep->max_in_flight));
  std::printf("%-40s %lld (warm-up requests: %lld)\n",
              "Connections opened:", static_cast<long long>(rep->connections_opened),
              static_cast<long long>(o.num_warmups));
  for (const auto& [name, key] : {std::pair{"Time to First Token", "ttft_ms"},
                                  {"Time per Output Token (excl. 1st token)", "tpot_ms"},
                                  {"Inter-token Latency", "itl_ms"},
                                  {"End-to-end Latency", "e2el_ms"}}) {
    std::printf("%s\n", (std::string("---------------") + name + "---------------").c_str());
    for (const char* q : {"mean", "p50", "p90", "p99"}) {
      const Json& v = j[key][q];
      std::printf("%-40s %s\n", (std::string(q) + " (ms):").c_str(),
                  v.is_null() ? "-" : std::to_string(v.get<double>()).c_str());
    }
  }
  for (const auto& [e, n] : errors)
    std::printf("error x%lld: %s\n", static_cast<long long>(n), e.c_str());
  std::printf("==================================================\n");
  return failed == static_cast<int64_t>(o.prompts.size()) ? 1 : 0;
}

}  // namespace msinfer::cli
