// The online load generator of `msinfer bench serve --base-url`: streaming
// requests to an OpenAI-compatible server at Poisson (gamma, with burstiness)
// arrival times, at most max_concurrency at once, each timed from its send to
// its first token, between tokens and to its end. One Asio event loop drives
// every connection, so a thousand concurrent streams need one thread. A
// connection the server keeps alive carries the next request; one it closed
// while idle is replaced and the request sent again, once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"

namespace msinfer::server {

struct BenchPrompt {
  Json prompt;             // completions: a string or token ids; chat: the user message (a string)
  int64_t prompt_len = 0;  // tokens, as the dataset says (the server's usage is what is reported)
  int64_t output_len = 16;
};

struct OnlineBenchOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                         // "" : not sent
  std::string api_key;
  std::vector<BenchPrompt> prompts;  // one request each
  double request_rate = 0;           // requests/s; <= 0 or inf: all at once
  double burstiness = 1.0;           // gamma shape; 1 = Poisson
  int64_t max_concurrency = 0;       // 0: no limit
  uint64_t seed = 0;
  // Requests sent (the first prompt each, all at once under max_concurrency)
  // and discarded before the measured run, as vLLM's --num-warmups: the
  // connections they open stay open for it.
  int64_t num_warmups = 0;
  std::chrono::seconds timeout{600};  // each phase (warm-up, run)
};

struct RequestResult {
  bool ok = false;
  int http_status = 0;
  std::string error;
  double send_s = 0;  // since the run's start
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;                     // gaps between chunks that carried text
  int64_t prompt_tokens = 0, output_tokens = 0;  // from the server's usage
  int64_t cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens (prefix cache)
};

struct OnlineBenchReport {
  std::vector<RequestResult> results;
  double duration_s = 0;
  int64_t max_in_flight = 0;
  int64_t connections_opened = 0;  // during the measured run (the rest were kept alive)
};

// INVALID_ARGUMENT for bad options, UNAVAILABLE when a warm-up request fails;
// the measured run itself always reports per request.
StatusOr<OnlineBenchReport> run_online_bench(const OnlineBenchOptions& o);

// What one SSE `data:` payload of an OpenAI completions or chat stream tells
// the benchmark: the end ([DONE]), whether it carries generated text (a
// non-empty `text`, `delta.content` or `delta.reasoning_content`, which a
// harmony model streams first, as vLLM's benchmark counts it), the usage
// counts, an error message.
// A token's chunk is read without building a JSON document: the load
// generator shares the machine with the server it measures, and a full parse
// per token cost it more CPU than the server's whole HTTP loop. Payloads with
// an escaped quote, that mention usage or an error, or whose text field is
// not in the compact form (`"text":"`) are parsed in full.
struct StreamEvent {
  bool done = false, text = false, has_usage = false;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::string error;
};
StreamEvent read_stream_event(std::string_view data);

// Splits "http://HOST:PORT[/...]" into host and port (http only).
Status parse_base_url(const std::string& url, std::string* host, int* port);

}  // namespace msinfer::server
