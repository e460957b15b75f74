// `msinfer serve` end to end over real sockets on 127.0.0.1: the official
// openai npm client (completions and chat, streaming or not; greedy output
// equals `msinfer generate`), curl for the error statuses, a corpus of
// malformed requests, abrupt disconnects (the batch and the KV cache empty
// again), 429 when the queue is full, the API key, the Prometheus text, and
// SIGTERM (every worker process and shared-memory object gone). Every server
// a test starts is stopped by its destructor, also when the test fails.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "../common/loopback_http.h"
#include "../common/prometheus_text.h"
#include "../common/serve_process.h"
#include "../common/shm_objects.h"
#include "../common/subprocess.h"
#include "msinfer/core/json.h"

namespace msinfer {
namespace {

namespace fs = std::filesystem;
using testing::clock_type;
using testing::curl;
using testing::HttpResult;
using testing::kBin;
using testing::model_dir;
using testing::node_modules;
using testing::post;
using testing::raw_exchange;
using testing::Server;
using testing::source_dir;

using testing::metric;
using testing::parse_metrics;

// Waits (polling /metrics, up to 15 s) until a sample whose name starts with `prefix` appears.
bool wait_for_metric(const Server& s, const std::string& prefix) {
  const auto deadline = clock_type::now() + std::chrono::seconds(15);
  while (clock_type::now() < deadline) {
    if (metric(parse_metrics(curl(s.url() + "/metrics").body), prefix) >= 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Waits (polling /metrics) until the batch and the KV cache are empty.
bool wait_drained(const Server& s, std::chrono::seconds limit) {
  const auto deadline = clock_type::now() + limit;
  while (clock_type::now() < deadline) {
    auto m = parse_metrics(curl(s.url() + "/metrics").body);
    if (metric(m, "msinfer:num_requests_running{") == 0 &&
        metric(m, "msinfer:num_requests_waiting{") == 0 &&
        metric(m, "msinfer:kv_cache_usage_perc{") == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

Json generate_json(const std::string& prompt, int max_tokens, const std::string& deployment = "") {
  const std::string out =
      testing::run_capture(kBin + " generate --model " + model_dir().string() + " --prompt '" +
                           prompt + "' --max-tokens " + std::to_string(max_tokens) +
                           " --ignore-eos --json " + deployment + " 2>/dev/null");
  return out.empty() ? Json() : Json::parse(out);
}

Json run_openai(const Server& s, const std::string& prompt, int max_tokens,
                const fs::path& model = model_dir()) {
  const std::string out = testing::run_capture(
      "node " + (source_dir() / "tests" / "server" / "openai_client.js").string() + " " +
      node_modules().string() + " " + s.url() + " " + model.filename().string() + " '" +
      prompt + "' " + std::to_string(max_tokens));
  return out.empty() ? Json() : Json::parse(out);
}

// The bytes a logprob token stands for: "bytes:\\xNN..." or the text itself.
std::string logprob_token_bytes(const std::string& tok) {
  if (tok.rfind("bytes:", 0) != 0) return tok;
  std::string out;
  for (size_t i = 6; i + 3 < tok.size() + 1; i += 4) {
    out += static_cast<char>(std::stoi(tok.substr(i + 2, 2), nullptr, 16));
  }
  return out;
}

// Text as the server writes it into JSON (an ill-formed byte becomes U+FFFD).
std::string as_written(const std::string& bytes) {
  return Json(bytes).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Logprobs of every token (issue 47): the completion's tokens join into its
// text and the chat's bytes into its content, as the server writes both;
// text_offset is where each token's characters start in the text; each
// token's top_logprobs has up to 3 distinct entries.
void check_logprobs_join(const Json& r, int max_tokens) {
  const Json& c = r["logprob_completion"];
  ASSERT_TRUE(c["logprobs"].is_object()) << c;
  const Json& tokens = c["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), static_cast<size_t>(max_tokens));
  std::string joined;
  for (const Json& t : tokens) joined += logprob_token_bytes(t.get<std::string>());
  EXPECT_EQ(as_written(joined), as_written(c["text"].get<std::string>())) << c;
  const std::string text = c["text"].get<std::string>();
  if (text.find("\xef\xbf\xbd") == std::string::npos) {  // no U+FFFD: offsets by character
    std::vector<size_t> starts;  // byte index of each character
    for (size_t i = 0; i < text.size(); ++i) {
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts.push_back(i);
    }
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string tok = tokens[k].get<std::string>();
      const auto off = c["logprobs"]["text_offset"][k].get<size_t>();
      if (tok.rfind("bytes:", 0) == 0 || tok.empty()) continue;
      ASSERT_LT(off, starts.size()) << c;
      EXPECT_EQ(text.compare(starts[off], tok.size(), tok), 0) << "token " << k << ": " << c;
    }
  }
  for (const Json& top : c["logprobs"]["top_logprobs"]) {
    EXPECT_GE(top.size(), 1u);
    EXPECT_LE(top.size(), 3u);
  }
  const Json& h = r["logprob_chat"];
  ASSERT_TRUE(h["logprobs"].is_object()) << h;
  ASSERT_EQ(h["logprobs"]["content"].size(), static_cast<size_t>(max_tokens));
  std::string bytes;
  for (const Json& e : h["logprobs"]["content"]) {
    std::string b;
    for (const Json& v : e["bytes"]) b += static_cast<char>(v.get<int>());
    EXPECT_EQ(logprob_token_bytes(e["token"].get<std::string>()), b) << e;
    bytes += b;
    std::set<std::string> distinct;
    for (const Json& alt : e["top_logprobs"]) distinct.insert(alt["token"].get<std::string>());
    EXPECT_GE(e["top_logprobs"].size(), 1u);
    EXPECT_LE(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(distinct.size(), e["top_logprobs"].size()) << e;
  }
  EXPECT_EQ(as_written(bytes), as_written(h["text"].get<std::string>())) << h;
}

void check_openai(const Json& r, const Json& gen, int max_tokens) {
  ASSERT_FALSE(r.is_null()) << "the openai client failed";
  ASSERT_FALSE(r.contains("fatal")) << r["fatal"];
  ASSERT_FALSE(gen.is_null()) << "msinfer generate failed";
  // Greedy over HTTP equals generate for the same prompt.
  EXPECT_EQ(r["completion"]["text"], gen["text"]);
  EXPECT_EQ(r["completion"]["finish_reason"], "length");
  EXPECT_EQ(r["completion"]["usage"]["completion_tokens"], max_tokens);
  EXPECT_EQ(r["completion"]["usage"]["prompt_tokens"], gen["prompt_ids"].size());
  EXPECT_EQ(r["completion"]["usage"]["total_tokens"], max_tokens + gen["prompt_ids"].size());
  // Streaming gives the same text, the usage at the end.
  EXPECT_EQ(r["stream_completion"]["text"], gen["text"]);
  EXPECT_EQ(r["stream_completion"]["finish_reason"], "length");
  EXPECT_EQ(r["stream_completion"]["usage"]["completion_tokens"], max_tokens);
  EXPECT_GE(r["stream_completion"]["chunks"].get<int>(), 3);
  // Chat, through the model's chat template.
  EXPECT_EQ(r["chat"]["role"], "assistant");
  EXPECT_EQ(r["chat"]["finish_reason"], "length");
  EXPECT_EQ(r["chat"]["usage"]["completion_tokens"], max_tokens);
  EXPECT_GT(r["chat"]["usage"]["prompt_tokens"].get<int>(),
            r["completion"]["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(r["stream_chat"]["text"], r["chat"]["text"]);
  EXPECT_EQ(r["stream_chat"]["usage"], r["chat"]["usage"]);
  // Logprobs: one token with its top 2.
  ASSERT_TRUE(r["logprobs"].is_object());
  EXPECT_EQ(r["logprobs"]["tokens"].size(), 1u);
  EXPECT_LE(r["logprobs"]["token_logprobs"][0].get<double>(), 0.0);
  EXPECT_EQ(r["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(r["models"], Json::array({model_dir().filename().string()}));
  EXPECT_EQ(r["bad_request"]["status"], 400);
  check_logprobs_join(r, max_tokens);
}

class ServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(model_dir() / "config.json")) << "make-model failed";
  }
};

TEST_F(ServeTest, OpenAiClientCoLocatedGreedyEqualsGenerate) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  Server s("");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const Json r = run_openai(s, "Hello, experts", 12);
  check_openai(r, generate_json("Hello, experts", 12), 12);
  // The counters saw it: every request a success with reason length.
  auto m = parse_metrics(curl(s.url() + "/metrics").body);
  EXPECT_GE(metric(m, "msinfer:request_success_total{model_name=\"" +
                          model_dir().filename().string() + "\",finished_reason=\"length\"}"),
            5);
  EXPECT_GE(metric(m, "msinfer:generation_tokens_total{"), 4 * 12 + 1);
  EXPECT_GE(metric(m, "msinfer:time_to_first_token_seconds_count{"), 5);
  // The loop's own CPU time: some after five requests, never going back.
  const double loop_cpu = metric(m, "msinfer:http_loop_cpu_seconds_total{");
  EXPECT_GT(loop_cpu, 0);
  // The routing window reaches /metrics (refreshed about once a second).
  EXPECT_TRUE(wait_for_metric(s, "msinfer:expert_balance{"));
  m = parse_metrics(curl(s.url() + "/metrics").body);
  EXPECT_GE(metric(m, "msinfer:http_loop_cpu_seconds_total{"), loop_cpu);
  EXPECT_GE(metric(m, "msinfer:expert_balance{"), 1.0);
  EXPECT_GT(metric(m, "msinfer:expert_window_tokens{"), -1);
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
}

// Prefill/decode disaggregation through serve (issue 50): the official
// client's completions and chat completions, streamed and not, each prompt
// prefilled on the prefill worker and its K/V moved to the attention worker:
// the co-located engine's greedy text.
TEST_F(ServeTest, OpenAiClientWithPrefillWorkersGreedyEqualsGenerate) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  Server s("--attention-workers 1 --expert-workers 1 --prefill-workers 1");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  EXPECT_NE(s.stderr_text().find("prefill worker 0: pid"), std::string::npos) << s.stderr_text();
  const Json r = run_openai(s, "Hello, experts", 12);
  check_openai(r, generate_json("Hello, experts", 12), 12);
  EXPECT_EQ(s.stderr_text().find("prefilled again"), std::string::npos) << s.stderr_text();
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

TEST_F(ServeTest, OpenAiClientDisaggregatedGreedyEqualsGenerate) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  const std::string deployment = "--attention-workers 1 --expert-workers 2 --micro-batches 2";
  // It stays up after the death below (ServeHealthTest covers the default exit).
  Server s(deployment + " --no-exit-on-failure");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  std::vector<pid_t> workers;
  const std::string err = s.stderr_text();
  const std::regex worker_pid("worker [0-9]+: pid ([0-9]+)");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), worker_pid);
       it != std::sregex_iterator(); ++it) {
    workers.push_back(std::stoi((*it)[1]));
  }
  EXPECT_EQ(workers.size(), 3u) << err;
  const Json r = run_openai(s, "Hello, experts", 12);
  check_openai(r, generate_json("Hello, experts", 12, deployment), 12);
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
  auto metrics = parse_metrics(curl(s.url() + "/metrics").body);
  EXPECT_GE(metric(metrics, "msinfer:worker_busy_fraction{"), 0);
  // Every token of every layer went to top_k experts: per-expert rows add up.
  double routed = 0;
  for (const auto& [k, v] : metrics) {
    if (k.rfind("msinfer:expert_routed_tokens_total{", 0) == 0) routed += v;
  }
  EXPECT_GT(routed, 0);
  // The routing window, with the expert workers' side too.
  EXPECT_TRUE(wait_for_metric(s, "msinfer:expert_worker_balance{"));
  metrics = parse_metrics(curl(s.url() + "/metrics").body);
  EXPECT_GE(metric(metrics, "msinfer:expert_worker_balance{"), 1.0);
  EXPECT_GE(metric(metrics, "msinfer:expert_balance{"), 1.0);
  EXPECT_EQ(metric(metrics, "msinfer:expert_placement_switches_total{"), 0);  // not rebalancing
  // A worker dies mid-stream: the stream ends with an error event naming it,
  // then [DONE]; /health turns 503; the server does not hang.
  ASSERT_EQ(workers.size(), 3u);
  const std::string body =
      R"({"prompt": "Hello", "max_tokens": 3000, "ignore_eos": true, "stream": true})";
  const int fd = testing::send_request(s.port(), testing::post_request("/v1/completions", body));
  ASSERT_GE(fd, 0);
  // Its first token: the request is in the deployment, mid-stream. (Killing
  // before that is the other case: the router finds the death while adding
  // it; SchedulerTest covers that one.)
  std::string stream = testing::read_from(fd, std::chrono::seconds(30), "\"text\"");
  ASSERT_NE(stream.find("\"text\""), std::string::npos) << stream;
  ::kill(workers[2], SIGKILL);  // expert worker 1
  stream += testing::read_from(fd, std::chrono::seconds(60), "[DONE]");
  ::close(fd);
  EXPECT_NE(stream.find("\"error\""), std::string::npos)
      << stream.substr(stream.size() > 600 ? stream.size() - 600 : 0);
  EXPECT_NE(stream.find("expert worker 1"), std::string::npos);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(curl(s.url() + "/health").status, 503);
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status, 503);
  // The operator reads why in the server's log, once, with the stream it failed.
  const std::string log = s.stderr_text();
  EXPECT_NE(log.find("server: serving stopped: expert worker 1"), std::string::npos) << log;
  EXPECT_NE(log.find("(1 request(s) in flight failed)"), std::string::npos) << log;
  EXPECT_EQ(log.find("serving stopped"), log.rfind("serving stopped")) << log;
  // SIGTERM: exit 0, no worker left, no shared-memory object left.
  const pid_t server_pid = s.pid();
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  for (pid_t w : workers) {
    EXPECT_NE(::kill(w, 0), 0) << "worker " << w << " outlived the server";
    EXPECT_TRUE(testing::shm_objects_of(w).empty());
  }
  EXPECT_TRUE(testing::shm_objects_of(server_pid).empty());
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

// A preset served disaggregated: a greedy completion equals the co-located
// `generate`, and a chat completion through the preset's ChatML template
// equals `generate` of the rendered prompt. SIGTERM stops the server and its
// workers.
void expect_served_disaggregated_equals_generate(
    const std::string& preset,
    const std::string& deployment = "--attention-workers 1 --expert-workers 2 --micro-batches 2") {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("msinfer-serve-" + preset + "-" + std::to_string(::getpid()));
  testing::run_capture(kBin + " make-model --preset " + preset + " --out " + dir.string() +
                       " >/dev/null 2>&1");
  ASSERT_TRUE(fs::exists(dir / "config.json")) << "make-model failed";
  auto generate = [&](const std::string& prompt) {
    const std::string out = testing::run_capture(kBin + " generate --model " + dir.string() +
                                                 " --prompt '" + prompt +
                                                 "' --max-tokens 8 --ignore-eos --json 2>/dev/null");
    return out.empty() ? Json() : Json::parse(out);
  };
  const Json gen = generate("Hello, experts");
  const Json gen_chat = generate("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_FALSE(gen.is_null());
  ASSERT_FALSE(gen_chat.is_null());
  Server s(deployment, dir);
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  HttpResult r = post(s, "/v1/completions",
                      R"({"prompt": "Hello, experts", "max_tokens": 8, "temperature": 0,
                          "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], gen["text"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], gen["prompt_ids"].size());
  r = post(s, "/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
               "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], gen_chat["text"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], gen_chat["prompt_ids"].size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  // Logprob tokens join into the text on this byte-level tokenizer too
  // (tiny-mixtral's is a SentencePiece one: ServeTest.OpenAiClient...).
  const Json o = run_openai(s, "Hello, experts", 8, dir);
  ASSERT_FALSE(o.is_null()) << "the openai client failed";
  ASSERT_FALSE(o.contains("fatal")) << o["fatal"];
  check_logprobs_join(o, 8);
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  if (::testing::Test::HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

// DeepSeek-V3 (MLA, shared experts, a dense layer).
TEST_F(ServeTest, DeepSeekDisaggregatedGreedyEqualsGenerate) {
  expect_served_disaggregated_equals_generate("tiny-deepseek-v3");
}

// The same with the shared experts on the expert workers (--shared-experts
// expert: layer 1's on expert worker 1).
TEST_F(ServeTest, DeepSeekSharedExpertsOnExpertWorkersGreedyEqualsGenerate) {
  expect_served_disaggregated_equals_generate(
      "tiny-deepseek-v3",
      "--attention-workers 1 --expert-workers 2 --micro-batches 2 --shared-experts expert");
}

// GLM-4.5 (GQA with q/k/v biases and partial rotary, shared experts, a dense layer).
TEST_F(ServeTest, Glm4MoeDisaggregatedGreedyEqualsGenerate) {
  expect_served_disaggregated_equals_generate("tiny-glm4-moe");
}

// An attention worker dies under serve (docs/RUNTIME.md, "Failures"): the
// request it held ends with an SSE error event naming it, the other stream
// finishes, /health stays 200 and new requests are served; with --resubmit
// both streams finish. Then the expert worker dies while nothing runs: /health
// turns 503 without waiting for a request. Raw sockets on loopback, and curl.
TEST_F(ServeTest, ADeadAttentionWorkerFailsOnlyItsOwnStream) {
  for (const bool resubmit : {false, true}) {
    SCOPED_TRACE(resubmit ? "--resubmit" : "without --resubmit");
    Server s(std::string("--attention-workers 2 --expert-workers 1 --micro-batches 1 "
                         "--no-exit-on-failure") +
             (resubmit ? " --resubmit" : ""));
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    const std::string err = s.stderr_text();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(err, m, std::regex("attention worker 1: pid ([0-9]+)"))) << err;
    const pid_t victim = std::stoi(m[1]);
    // Equal loads: the first request goes to attention worker 0, the second to 1.
    const std::string body =
        R"({"prompt": "Hello", "max_tokens": 400, "ignore_eos": true, "stream": true})";
    std::vector<int> fds;
    std::vector<std::string> streams(2);
    for (int i = 0; i < 2; ++i) {
      fds.push_back(
          testing::send_request(s.port(), testing::post_request("/v1/completions", body)));
      ASSERT_GE(fds.back(), 0);
      // Its first token: the request is on a worker.
      streams[i] = testing::read_from(fds.back(), std::chrono::seconds(30), "\"text\"");
      ASSERT_NE(streams[i].find("\"text\""), std::string::npos) << streams[i];
    }
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    int errors = 0;
    for (int i = 0; i < 2; ++i) {
      streams[i] += testing::read_from(fds[i], std::chrono::seconds(60), "[DONE]");
      ::close(fds[i]);
      EXPECT_NE(streams[i].find("data: [DONE]"), std::string::npos) << streams[i];
      if (streams[i].find("\"error\"") != std::string::npos) {
        ++errors;
        EXPECT_NE(streams[i].find("attention worker 1"), std::string::npos) << streams[i];
      }
    }
    EXPECT_EQ(errors, resubmit ? 0 : 1);
    EXPECT_EQ(curl(s.url() + "/health").status, 200);
    EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status, 200);
    if (resubmit) {
      // The expert worker dies with no request in flight: /health turns 503
      // and names it within a stats interval or two, before any request.
      ASSERT_TRUE(std::regex_search(err, m, std::regex("expert worker 0: pid ([0-9]+)"))) << err;
      ASSERT_EQ(::kill(std::stoi(m[1]), SIGKILL), 0);
      HttpResult health = curl(s.url() + "/health");
      for (int i = 0; i < 300 && health.status == 200; ++i) {
        ::usleep(100000);
        health = curl(s.url() + "/health");
      }
      EXPECT_EQ(health.status, 503);
      EXPECT_NE(health.body.find("expert worker 0"), std::string::npos) << health.body;
      // The log line follows the router's stop by moments (/health may see
      // the stop first).
      std::string log = s.stderr_text();
      for (int i = 0; i < 100 && log.find("serving stopped") == std::string::npos; ++i) {
        ::usleep(50000);
        log = s.stderr_text();
      }
      EXPECT_NE(log.find("server: serving stopped: expert worker 0"), std::string::npos) << log;
      EXPECT_NE(log.find("(0 request(s) in flight failed)"), std::string::npos) << log;
    } else {
      // One attention worker's death is not the deployment's.
      EXPECT_EQ(s.stderr_text().find("serving stopped"), std::string::npos) << s.stderr_text();
    }
    EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
    EXPECT_NE(::kill(victim, 0), 0);
    if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
  }
}

// An expert worker whose experts all have replicas dies under serve with
// --respawn: the stream in flight finishes without an error and with the
// greedy text of the same request before the death (the worker is dropped in
// place, the step it was in runs again), /health stays 200, and a
// replacement joins the running workers.
TEST_F(ServeTest, ADeadExpertWorkerWithReplicasFailsNoStream) {
  const std::string placement =
      ::testing::TempDir() + "/serve_both_" + std::to_string(::getpid()) + ".json";
  {
    Json experts = Json::array();
    for (int e = 0; e < 8; ++e) experts.push_back(Json::array({{0, 0.5}, {1, 0.5}}));
    std::ofstream(placement) << Json{{"expert_workers", 2}, {"experts", experts}}.dump();
  }
  Server s("--attention-workers 1 --expert-workers 2 --micro-batches 2 --respawn --placement " +
           placement);
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string err = s.stderr_text();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("expert worker 1: pid ([0-9]+)"))) << err;
  const pid_t victim = std::stoi(m[1]);
  // Greedy: a request without a seed samples from a fresh one at temperature 1.
  const std::string req =
      R"("prompt": "Hello", "max_tokens": 300, "ignore_eos": true, "temperature": 0)";
  const HttpResult plain = post(s, "/v1/completions", "{" + req + "}");
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string want = Json::parse(plain.body)["choices"][0]["text"].get<std::string>();
  const int fd = testing::send_request(
      s.port(), testing::post_request("/v1/completions", "{" + req + R"(, "stream": true})"));
  ASSERT_GE(fd, 0);
  std::string stream = testing::read_from(fd, std::chrono::seconds(30), "\"text\"");
  ASSERT_NE(stream.find("\"text\""), std::string::npos) << stream;
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  stream += testing::read_from(fd, std::chrono::seconds(60), "[DONE]");
  ::close(fd);
  EXPECT_EQ(stream.find("\"error\""), std::string::npos) << stream;
  std::istringstream lines(stream.substr(stream.find("\r\n\r\n") + 4));
  std::string line, got;
  bool done = false;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    got += Json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
  }
  EXPECT_TRUE(done) << stream;
  EXPECT_EQ(got, want);
  EXPECT_EQ(curl(s.url() + "/health").status, 200);
  // The replacement joins between steps of the next requests.
  for (int i = 0; i < 50 && s.stderr_text().find("expert worker 1 is back") == std::string::npos;
       ++i) {
    EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 8})").status, 200);
  }
  EXPECT_NE(s.stderr_text().find("expert worker 1 is back"), std::string::npos) << s.stderr_text();
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  EXPECT_NE(::kill(victim, 0), 0);
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

// --stream-interval N: the first text arrives at once (the time to the first
// token does not wait for the interval), the rest in chunks of N tokens (the
// last may be shorter), and it adds up to the same greedy text as one JSON
// answer.
// Prefix caching through serve (issue 50): a prompt that shares a long
// prefix with an earlier one reports the tokens found in the cache as
// OpenAI does (usage.prompt_tokens_details.cached_tokens: whole blocks of
// 128, at most the prompt less its last token), in a plain and a streaming
// completion's usage and a chat's; /metrics counts the prompt tokens looked
// up and found. With --no-prefix-caching nothing is found.
TEST_F(ServeTest, ASharedPrefixIsReportedAsCachedTokens) {
  std::string ids;
  for (int i = 0; i < 300; ++i) ids += (i ? "," : "") + std::to_string(3 + (i * 37) % 200);
  const auto completion = [&](const Server& s, const std::string& last, const std::string& more) {
    return post(s, "/v1/completions",
                R"({"prompt": [)" + ids + "," + last + R"(], "max_tokens": 3, "ignore_eos": true)" +
                    more + "}");
  };
  const auto cached = [](const HttpResult& r) {
    const Json j = Json::parse(r.body);
    return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  const std::string long_text = [] {
    std::string t;
    for (int i = 0; i < 80; ++i) t += "the quick brown fox " + std::to_string(i) + " ";
    return t;
  }();
  const auto chat = [&](const Server& s, const std::string& question) {
    return post(s, "/v1/chat/completions",
                R"({"messages": [{"role": "system", "content": ")" + long_text +
                    R"("}, {"role": "user", "content": ")" + question +
                    R"("}], "max_tokens": 3, "ignore_eos": true})");
  };
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "prefix caching" : "--no-prefix-caching");
    Server s(on ? "" : "--no-prefix-caching");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    const HttpResult first = completion(s, "5", "");
    ASSERT_EQ(first.status, 200) << first.body;
    EXPECT_EQ(cached(first), 0);
    const HttpResult second = completion(s, "6", "");
    ASSERT_EQ(second.status, 200) << second.body;
    EXPECT_EQ(cached(second), on ? 256 : 0);  // 301 tokens: 2 full blocks before the last token
    // The streaming answer's final usage chunk.
    const HttpResult stream =
        completion(s, "7", R"(, "stream": true, "stream_options": {"include_usage": true})");
    ASSERT_EQ(stream.status, 200) << stream.body;
    const std::string want =
        std::string(R"("prompt_tokens_details":{"cached_tokens":)") + (on ? "256" : "0") + "}";
    EXPECT_NE(stream.body.find(want), std::string::npos) << stream.body;
    const HttpResult c1 = chat(s, "first?");
    ASSERT_EQ(c1.status, 200) << c1.body;
    const HttpResult c2 = chat(s, "second?");
    ASSERT_EQ(c2.status, 200) << c2.body;
    const int64_t prompt = Json::parse(c2.body)["usage"]["prompt_tokens"].get<int64_t>();
    ASSERT_GT(prompt, 256);
    if (on) {
      EXPECT_GE(cached(c2), 128);
      EXPECT_EQ(cached(c2) % 128, 0);
      EXPECT_LT(cached(c2), prompt);
    } else {
      EXPECT_EQ(cached(c2), 0);
    }
    EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
    auto m = parse_metrics(curl(s.url() + "/metrics").body);
    const int64_t prompts =
        3 * 301 + Json::parse(c1.body)["usage"]["prompt_tokens"].get<int64_t>() + prompt;
    EXPECT_EQ(metric(m, "msinfer:prefix_cache_queries_total"), prompts);
    EXPECT_EQ(metric(m, "msinfer:prefix_cache_hits_total"),
              on ? 2 * 256 + cached(c1) + cached(c2) : 0);
  }
}

TEST_F(ServeTest, StreamIntervalGroupsTokens) {
  Server s("--stream-interval 4");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string req = R"("prompt": "Hello, experts", "max_tokens": 18, "ignore_eos": true,
                            "temperature": 0)";
  const HttpResult plain = post(s, "/v1/completions", "{" + req + "}");
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string want = Json::parse(plain.body)["choices"][0]["text"].get<std::string>();
  // The greedy answer's first text: the shortest prefix of tokens that makes
  // any (a token may be part of a UTF-8 character).
  std::string first_text;
  for (int k = 1; k <= 4 && first_text.empty(); ++k) {
    const HttpResult r = post(s, "/v1/completions",
                              R"({"prompt": "Hello, experts", "temperature": 0, "ignore_eos": true,
                                  "max_tokens": )" +
                                  std::to_string(k) + "}");
    ASSERT_EQ(r.status, 200) << r.body;
    first_text = Json::parse(r.body)["choices"][0]["text"].get<std::string>();
  }
  ASSERT_FALSE(first_text.empty());
  const HttpResult streamed = post(s, "/v1/completions", "{" + req + R"(, "stream": true})");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::istringstream lines(streamed.body);
  std::string line, got, first_chunk;
  int text_chunks = 0;
  bool done = false;
  while (std::getline(lines, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    const Json j = Json::parse(line.substr(6));
    const std::string t = j["choices"][0]["text"].get<std::string>();
    if (!t.empty() && text_chunks++ == 0) first_chunk = t;
    got += t;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(got, want);
  EXPECT_EQ(first_chunk, first_text);
  // 18 tokens: the first (or first few, until they make text) at once, the
  // rest in at most ceil(17 / 4) = 5 chunks (fewer only if some tokens made
  // no text yet), at least 2 in all.
  EXPECT_LE(text_chunks, 6);
  EXPECT_GE(text_chunks, 2);
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
}

// --busy-poll-us: while streams are in flight the loop takes the engine's
// rounds by polling (the engine thread does not wake it), and after the
// window with nothing to do it sleeps again. With a long window (it polls
// through every step) and a 1 us one (it falls asleep between rounds, and a
// round can come as it stops polling): every stream gets all its text,
// many at once too, a stream cut off is cancelled, SIGTERM stops it.
TEST_F(ServeTest, BusyPollLosesNothingAndStops) {
  for (const char* window : {"5000", "1"}) {
    SCOPED_TRACE(std::string("--busy-poll-us ") + window);
    Server s(std::string("--busy-poll-us ") + window);
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    const std::string req = R"("prompt": "Hello, experts", "max_tokens": 24, "ignore_eos": true,
                              "temperature": 0)";
    const HttpResult plain = post(s, "/v1/completions", "{" + req + "}");
    ASSERT_EQ(plain.status, 200) << plain.body;
    const HttpResult streamed = post(s, "/v1/completions", "{" + req + R"(, "stream": true})");
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    std::istringstream lines(streamed.body);
    std::string line, got;
    bool done = false;
    while (std::getline(lines, line)) {
      if (line == "data: [DONE]") done = true;
      if (line.rfind("data: {", 0) != 0) continue;
      got += Json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
    }
    EXPECT_TRUE(done);
    EXPECT_EQ(got, Json::parse(plain.body)["choices"][0]["text"].get<std::string>());
    const std::string out = testing::run_capture(
        kBin + " bench serve --base-url " + s.url() +
        " --num-prompts 16 --max-concurrency 16 --input-len 8 --output-len 32 --json 2>/dev/null");
    ASSERT_FALSE(out.empty());
    const Json j = Json::parse(out);
    EXPECT_EQ(j["completed"], 16) << j.dump();
    EXPECT_EQ(j["total_output_tokens"], 16 * 32) << j.dump();
    // A stream cut off after its first text.
    const int fd = testing::send_request(
        s.port(),
        testing::post_request("/v1/completions", R"({"prompt": "Hello", "max_tokens": 4000,
                                                               "ignore_eos": true, "stream": true})"));
    ASSERT_GE(fd, 0);
    const std::string first = testing::read_from(fd, std::chrono::seconds(30), "\"text\"");
    EXPECT_NE(first.find("\"text\""), std::string::npos) << first;
    linger l{1, 0};  // RST: abrupt
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(fd);
    EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
    EXPECT_EQ(curl(s.url() + "/health").status, 200);
    EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
    if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
  }
}

Json run_openai_sampling(const Server& s, const std::string& prompt, const Json& greedy_ids,
                         const std::string& mode = "") {
  const std::string out = testing::run_capture(
      "node " + (source_dir() / "tests" / "server" / "openai_sampling.js").string() + " " +
      node_modules().string() + " " + s.url() + " " + model_dir().filename().string() + " '" +
      prompt + "' '" + greedy_ids.dump() + "' " + mode);
  return out.empty() ? Json() : Json::parse(out);
}

// Three samples at temperature 1 without a seed: 24 tokens each from a
// vocabulary of hundreds, so two equal by chance is negligible.
void check_seeds(const Json& r) {
  ASSERT_FALSE(r.is_null()) << "the openai client failed";
  ASSERT_FALSE(r.contains("fatal")) << r["fatal"];
  for (const char* k : {"unseeded", "chat_unseeded"}) {
    std::set<std::string> distinct;
    for (const auto& t : r[k]) distinct.insert(t.get<std::string>());
    EXPECT_GE(distinct.size(), 2u) << k << ": " << r[k];
  }
  EXPECT_EQ(r["seeded"][0], r["seeded"][1]);
}

// Issue 47 through the official openai client: unseeded sampling varies, a
// seed repeats; stop_token_ids (the stop token's text left out unless
// include_stop_str_in_output; an id beyond the vocabulary a 400), min_tokens,
// include_stop_str_in_output with a stop string, max_completion_tokens on
// /v1/completions, min_p and repetition_penalty accepted, a refused vLLM
// field; system_fingerprint, random ids, GET /v1/models/{id}.
TEST_F(ServeTest, OpenAiClientSamplingFields) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  const Json gen = generate_json("Hello, experts", 8);
  ASSERT_FALSE(gen.is_null()) << "msinfer generate failed";
  Server s("");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const Json r = run_openai_sampling(s, "Hello, experts", gen["token_ids"]);
  check_seeds(r);
  if (HasFailure()) return;
  const int k = r["stop_index"].get<int>();
  // Stopped by the k-th token: k + 1 tokens, the text of the first k.
  EXPECT_EQ(r["stop"]["finish_reason"], "stop");
  EXPECT_EQ(r["stop"]["completion_tokens"], k + 1);
  EXPECT_EQ(r["stop"]["text"], r["greedy_k"]["text"]);
  EXPECT_EQ(r["stop_included"]["text"], r["greedy_k1"]["text"]);
  EXPECT_EQ(r["stop_out_of_vocab"]["status"], 400);
  EXPECT_EQ(r["stop_out_of_vocab"]["param"], "stop_token_ids");
  // min_tokens: the first token stops at once; with min_tokens 4 it cannot
  // come before the fifth.
  EXPECT_EQ(r["stop_first"]["completion_tokens"], 1);
  EXPECT_EQ(r["stop_first"]["finish_reason"], "stop");
  EXPECT_GE(r["min_tokens"]["completion_tokens"].get<int>(), 4);
  if (r["min_tokens"]["finish_reason"] == "stop") {
    EXPECT_GE(r["min_tokens"]["completion_tokens"].get<int>(), 5);
  }
  if (!r["stop_str"].is_null()) {
    // The text up to and with the first occurrence of the stop string.
    const std::string text8 = r["text8"], stop = r["stop_str"];
    EXPECT_EQ(r["stop_str_included"]["text"], text8.substr(0, text8.find(stop) + stop.size()));
    EXPECT_EQ(r["stop_str_included"]["finish_reason"], "stop");
  }
  EXPECT_EQ(r["max_completion_tokens"]["completion_tokens"], 5);
  EXPECT_EQ(r["max_completion_tokens"]["finish_reason"], "length");
  EXPECT_EQ(r["min_p"]["completion_tokens"], 6);
  EXPECT_EQ(r["repetition_penalty"]["completion_tokens"], 16);
  EXPECT_EQ(r["min_p_refused"], "accepted");
  EXPECT_EQ(r["guided_json"]["status"], 400);
  EXPECT_EQ(r["guided_json"]["param"], "guided_json");
  // Fingerprint and ids.
  const std::string fp = r["stop"]["system_fingerprint"];
  EXPECT_TRUE(std::regex_match(fp, std::regex("fp_[0-9a-f]{12}"))) << fp;
  EXPECT_EQ(r["chat_fingerprint"], fp);
  EXPECT_TRUE(std::regex_match(r["stop"]["id"].get<std::string>(), std::regex("cmpl-[0-9a-f]{32}")))
      << r["stop"]["id"];
  EXPECT_TRUE(
      std::regex_match(r["chat_id"].get<std::string>(), std::regex("chatcmpl-[0-9a-f]{32}")))
      << r["chat_id"];
  EXPECT_NE(r["stop"]["id"], r["stop_included"]["id"]);
  EXPECT_EQ(r["model"]["id"], model_dir().filename().string());
  EXPECT_EQ(r["model"]["object"], "model");
  EXPECT_EQ(r["missing_model"]["status"], 404);
  // The first answer's id of a restarted server is not the first one's again
  // (they were "cmpl-<unix time>-1" both, within the same second).
  const std::string body = R"({"prompt": "Hi", "max_tokens": 1})";
  const Json first = Json::parse(post(s, "/v1/completions", body).body);
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  Server again("");
  ASSERT_GT(again.port(), 0) << again.stderr_text();
  const Json second = Json::parse(post(again, "/v1/completions", body).body);
  EXPECT_TRUE(first.contains("id") && second.contains("id"));
  EXPECT_NE(first["id"], second["id"]);
  if (HasFailure()) ADD_FAILURE() << "client output: " << r.dump();
}

// Disaggregated: unseeded samples vary and seeds repeat there too (the seed
// is drawn by the server and carried to the attention worker), and min_p,
// repetition_penalty and min_tokens reach the attention worker's sampler:
// the greedy answers with them equal the co-located server's.
TEST_F(ServeTest, OpenAiClientSeedsDisaggregated) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  const Json gen = generate_json("Hello, experts", 8);
  ASSERT_FALSE(gen.is_null()) << "msinfer generate failed";
  Json colocated;
  {
    Server c("");
    ASSERT_GT(c.port(), 0) << c.stderr_text();
    colocated = run_openai_sampling(c, "Hello, experts", gen["token_ids"], "seeds-only");
  }
  Server s("--attention-workers 1 --expert-workers 1 --micro-batches 1");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const Json r = run_openai_sampling(s, "Hello, experts", gen["token_ids"], "seeds-only");
  check_seeds(r);
  if (HasFailure()) return;
  ASSERT_FALSE(colocated.is_null() || colocated.contains("fatal")) << colocated;
  EXPECT_EQ(r["min_p_refused"], "accepted");
  EXPECT_EQ(r["min_p"]["completion_tokens"], 6);
  EXPECT_EQ(r["repetition_penalty"]["text"], colocated["repetition_penalty"]["text"]);
  // The same seed samples the same text on both (the same logits), and
  // min_p changes it, so a min_p left behind by the router shows.
  EXPECT_EQ(r["min_p"]["text"], colocated["min_p"]["text"]);
  EXPECT_NE(colocated["min_p"]["text"], colocated["sampled"]["text"]);
  EXPECT_EQ(r["min_tokens"]["text"], colocated["min_tokens"]["text"]);
  EXPECT_EQ(r["min_tokens"]["completion_tokens"], colocated["min_tokens"]["completion_tokens"]);
  EXPECT_GE(r["min_tokens"]["completion_tokens"].get<int>(), 4);
}

Json run_openai_n(const Server& s, const std::string& prompt, int max_tokens, int max_n) {
  const std::string out = testing::run_capture(
      "node " + (source_dir() / "tests" / "server" / "openai_client.js").string() + " " +
      node_modules().string() + " " + s.url() + " " + model_dir().filename().string() + " '" +
      prompt + "' " + std::to_string(max_tokens) + " n " + std::to_string(max_n));
  return out.empty() ? Json() : Json::parse(out);
}

// A stream's chunks (run_openai_n's [index, text, finish_reason] triples):
// every index 0..n-1 has its text (role markers left out) and exactly one
// finish_reason, in its last chunk; the texts are returned by index.
std::vector<std::string> check_stream_choices(const Json& chunks, int n, const char* what) {
  std::vector<std::string> text(static_cast<size_t>(n));
  std::vector<int> finishes(static_cast<size_t>(n), 0);
  std::vector<size_t> first(static_cast<size_t>(n), SIZE_MAX), last(static_cast<size_t>(n), 0);
  for (size_t k = 0; k < chunks.size(); ++k) {
    const int i = chunks[k][0].get<int>();
    EXPECT_TRUE(i >= 0 && i < n) << what << ": chunk " << k << " has index " << i;
    if (i < 0 || i >= n) continue;
    const auto u = static_cast<size_t>(i);
    EXPECT_EQ(finishes[u], 0) << what << ": index " << i << " has a chunk after its finish";
    std::string t = chunks[k][1].get<std::string>();
    if (t.rfind("<assistant>", 0) == 0) t = t.substr(11);
    text[u] += t;
    if (!chunks[k][2].is_null()) {
      ++finishes[u];
      EXPECT_EQ(chunks[k][2], "length") << what;
    }
    first[u] = std::min(first[u], k);
    last[u] = k;
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(finishes[static_cast<size_t>(i)], 1)
        << what << ": index " << i << " finished " << finishes[static_cast<size_t>(i)] << " times";
  }
  // Interleaved by index, as OpenAI's streams are: index 1's first chunk
  // comes before index 0's last one (one choice after the other would not).
  if (n > 1) {
    EXPECT_LT(first[1], last[0]) << what << ": " << chunks;
  }
  return text;
}

double logprob_sum(const Json& choice) {
  double s = 0;
  for (const Json& v : choice["logprobs"]) s += v.get<double>();
  return s;
}

// n > 1 and best_of through the official openai client (issue 47): see
// samplesN in openai_client.js for the requests.
void check_n(const Json& r, int max_tokens, int max_n) {
  ASSERT_FALSE(r.is_null()) << "the openai client failed";
  ASSERT_FALSE(r.contains("fatal")) << r["fatal"];
  // Seeded n = 3: three choices, indices 0..2, each its own sample (seeds
  // seed + i), the same in a second call.
  const Json& seeded = r["seeded"][0];
  ASSERT_EQ(seeded.size(), 3u) << r;
  std::set<std::string> distinct;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seeded[i]["index"], i);
    EXPECT_EQ(seeded[i]["finish_reason"], "length");
    distinct.insert(seeded[i]["text"].get<std::string>());
  }
  EXPECT_EQ(distinct.size(), 3u) << "the choices are not samples of their own: " << seeded;
  EXPECT_EQ(r["seeded"][1], seeded) << "the same seed gave other choices";
  // Usage: the prompt once, the completions summed.
  const Json& usage = r["seeded_usage"];
  EXPECT_EQ(usage["completion_tokens"], 3 * max_tokens);
  EXPECT_EQ(usage["total_tokens"].get<int>(), usage["prompt_tokens"].get<int>() + 3 * max_tokens);
  // The same request streamed: each index's chunks join into its text.
  const auto streamed = check_stream_choices(r["stream"]["chunks"], 3, "stream");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(streamed[static_cast<size_t>(i)], seeded[i]["text"]);
  EXPECT_EQ(r["stream"]["usage"], usage);
  // Unseeded: fresh samples for each choice.
  distinct.clear();
  for (const Json& c : r["unseeded"]) distinct.insert(c["text"].get<std::string>());
  EXPECT_EQ(distinct.size(), 3u) << r["unseeded"];
  // Greedy n = 2: both choices are the greedy answer of n = 1.
  ASSERT_EQ(r["greedy_n"].size(), 2u);
  for (const Json& c : r["greedy_n"]) EXPECT_EQ(c["text"], r["greedy_one"][0]["text"]);
  // Chat n = 2, and its stream: each index starts with the role, joins
  // into the same text, and ends once.
  const Json& chat = r["chat"]["choices"];
  ASSERT_EQ(chat.size(), 2u);
  EXPECT_EQ(r["chat"]["usage"]["completion_tokens"], 2 * max_tokens);
  const auto chat_streamed = check_stream_choices(r["chat_stream"]["chunks"], 2, "chat stream");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(chat[i]["index"], i);
    EXPECT_EQ(chat_streamed[static_cast<size_t>(i)], chat[i]["text"]);
    bool role_first = false;
    for (const Json& c : r["chat_stream"]["chunks"]) {
      if (c[0] != i) continue;
      role_first = c[1].get<std::string>().rfind("<assistant>", 0) == 0;
      break;
    }
    EXPECT_TRUE(role_first) << "chat stream index " << i << " does not start with the role";
  }
  EXPECT_EQ(r["chat_stream"]["usage"], r["chat"]["usage"]);
  // best_of 3, n 1: the candidate (n 3, same seed) with the highest
  // cumulative logprob, with or without logprobs asked for.
  const Json& cands = r["best_of_candidates"];
  ASSERT_EQ(cands.size(), 3u);
  size_t best = 0;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(cands[i]["logprobs"].size(), static_cast<size_t>(max_tokens)) << cands[i];
    if (logprob_sum(cands[i]) > logprob_sum(cands[best])) best = i;
  }
  ASSERT_EQ(r["best_of"].size(), 1u);
  EXPECT_EQ(r["best_of"][0]["index"], 0);
  EXPECT_EQ(r["best_of"][0]["text"], cands[best]["text"]) << "candidates: " << cands;
  EXPECT_NEAR(logprob_sum(r["best_of"][0]), logprob_sum(cands[best]), 1e-4);
  ASSERT_EQ(r["best_of_no_logprobs"].size(), 1u);
  EXPECT_EQ(r["best_of_no_logprobs"][0]["text"], cands[best]["text"]);
  EXPECT_TRUE(r["best_of_no_logprobs"][0]["logprobs"].is_null());
  EXPECT_EQ(r["best_of_usage"]["completion_tokens"], max_tokens);
  // The bounds: n beyond --max-n, best_of < n, a stream with best_of != n.
  for (const char* k : {"too_many", "too_many_chat"}) {
    EXPECT_EQ(r[k]["status"], 400) << k << ": " << r[k];
    EXPECT_EQ(r[k]["param"], "n") << k;
    EXPECT_NE(r[k]["message"].get<std::string>().find(std::to_string(max_n)), std::string::npos);
  }
  EXPECT_EQ(r["at_bound"], "accepted");
  for (const char* k : {"best_of_below_n", "best_of_stream"}) {
    EXPECT_EQ(r[k]["status"], 400) << k << ": " << r[k];
    EXPECT_EQ(r[k]["param"], "best_of") << k;
  }
}

// n samples of one prompt, co-located: prefilled once, the prompt's KV
// blocks shared (EngineTest checks the blocks); here what a client sees.
TEST_F(ServeTest, OpenAiClientNChoicesAndBestOf) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  Server s("--max-n 4");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const Json r = run_openai_n(s, "Hello, experts", 10, 4);
  check_n(r, 10, 4);
  // Every sequence's KV released: nothing running, the cache empty.
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  if (HasFailure())
    ADD_FAILURE() << "client output: " << r.dump() << "\nserver stderr:\n" << s.stderr_text();
}

// The same disaggregated: the attention worker forks the sequences (n and
// their indices cross the control protocol), and the seeded choices are the
// co-located server's (the same logits, the same per-sequence seeds).
TEST_F(ServeTest, OpenAiClientNChoicesDisaggregated) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  Json colocated;
  {
    Server c("--max-n 4");
    ASSERT_GT(c.port(), 0) << c.stderr_text();
    colocated = run_openai_n(c, "Hello, experts", 10, 4);
  }
  Server s("--max-n 4 --attention-workers 1 --expert-workers 2 --micro-batches 2");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const Json r = run_openai_n(s, "Hello, experts", 10, 4);
  check_n(r, 10, 4);
  if (HasFailure()) return;
  ASSERT_FALSE(colocated.is_null() || colocated.contains("fatal")) << colocated;
  EXPECT_EQ(r["seeded"][0], colocated["seeded"][0]);
  EXPECT_EQ(r["chat"]["choices"], colocated["chat"]["choices"]);
  EXPECT_EQ(r["best_of"][0]["text"], colocated["best_of"][0]["text"]);
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

TEST_F(ServeTest, ErrorStatusesWithOpenAiBodies) {
  Server s("--max-body-kb 64");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string model = model_dir().filename().string();
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/completions", "[1, 2]", 400, ""},
      {"/v1/completions", R"({"prompt": "hi", "temperature": -1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "hi", "temperature": "hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "hi", "top_p": 0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "hi", "top_p": 1.5})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 100000000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2, 99999999]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [-1]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "hi", "n": 9})", 400, "n"},  // beyond --max-n (8)
      {"/v1/completions", R"({"prompt": "hi", "n": 2, "best_of": 1})", 400, "best_of"},
      {"/v1/completions", R"({"prompt": "hi", "logit_bias": {"1": 5}})", 400, "logit_bias"},
      {"/v1/completions", R"({"prompt": "hi", "stream": "yes"})", 400, "stream"},
      {"/v1/completions", R"({"max_tokens": 4})", 400, "prompt"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400,
       "messages[0].role"},
      {"/v1/completions", R"({"model": "no-such-model", "prompt": "hi"})", 404, "model"},
      {"/v1/nothing", R"({})", 404, ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    HttpResult r = post(s, c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    Json j = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_EQ(j["error"]["code"], c.status);
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param);
    }
  }
  EXPECT_EQ(curl(s.url() + "/v1/completions").status, 405);  // GET
  EXPECT_NE(curl(s.url() + "/v1/completions").headers.find("Allow: POST"), std::string::npos);
  EXPECT_EQ(post(s, "/health", "{}").status, 405);
  EXPECT_EQ(
      post(s, "/v1/completions", R"({"prompt": "hi"})", "-H 'Content-Type: text/plain'").status,
      415);
  EXPECT_EQ(
      post(s, "/v1/completions", "{\"prompt\": \"" + std::string(100 << 10, 'a') + "\"}").status,
      413);
  // Nothing above disturbed the server.
  EXPECT_EQ(curl(s.url() + "/health").status, 200);
  HttpResult ok =
      post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 3, "temperature": 0})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  // Stop strings are never emitted; a same-seed sample repeats.
  const std::string text = Json::parse(ok.body)["choices"][0]["text"];
  size_t at = 1;  // an ASCII character after the first: a whole UTF-8 character
  while (at < text.size() && static_cast<unsigned char>(text[at]) >= 0x80) ++at;
  if (at < text.size()) {
    const std::string stop = text.substr(at, 1);
    HttpResult st = post(s, "/v1/completions",
                         R"({"prompt": "hi", "max_tokens": 3, "temperature": 0, "stop": )" +
                             Json(stop).dump() + "}");
    Json j = Json::parse(st.body);
    EXPECT_EQ(j["choices"][0]["text"], text.substr(0, text.find(stop)));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  }
  const std::string seeded =
      R"({"prompt": "hi", "max_tokens": 8, "temperature": 1.0, "seed": 42, "ignore_eos": true})";
  EXPECT_EQ(Json::parse(post(s, "/v1/completions", seeded).body)["choices"][0]["text"],
            Json::parse(post(s, "/v1/completions", seeded).body)["choices"][0]["text"]);
}

TEST_F(ServeTest, MalformedRequestCorpusOverRealSockets) {
  Server s("--request-timeout 1");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string ok_headers =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  const std::vector<std::string> corpus = {
      "GARBAGE\r\n\r\n",
      "GET / HTTP/9.9\r\n\r\n",
      "\x01\x02\x03\xff\xfe binary\r\n\r\n",
      ok_headers + "Content-Length: 100\r\n\r\n{\"prompt\":",             // truncated body
      ok_headers + "Content-Length: abc\r\n\r\n{}",                       // bad length
      ok_headers + "Transfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n",      // bad chunk
      ok_headers + "X-Huge: " + std::string(64 << 10, 'h') + "\r\n\r\n",  // huge header
      "GET /health HTTP/1.1\r\nHost: x\r\n",                              // slowloris: never ends
      ok_headers + "Content-Length: 2\r\n\r\n[]",
      "GET /health HTTP/1.0\r\n\r\n",
  };
  for (const auto& bytes : corpus) {
    SCOPED_TRACE(bytes.substr(0, 60));
    bool closed = false;
    const std::string got = raw_exchange(s.port(), bytes, std::chrono::seconds(5), &closed);
    // Every request gets an HTTP answer or a closed connection.
    EXPECT_TRUE(got.rfind("HTTP/1.1 ", 0) == 0 || (got.empty() && closed)) << got;
    EXPECT_EQ(curl(s.url() + "/health").status, 200);
  }
}

// The sum of every sample whose name starts with `prefix` (0 if none).
double metric_sum(const std::map<std::string, double>& m, const std::string& prefix) {
  double sum = 0;
  for (const auto& [k, v] : m) {
    if (k.rfind(prefix, 0) == 0) sum += v;
  }
  return sum;
}

TEST_F(ServeTest, DisconnectsCancelAndFreeKvBlocks) {
  Server s("");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // Streaming and plain requests with a long generation, cut off abruptly
  // while they run. A request can still finish before the cut (4000 tokens of
  // tiny-mixtral take ~0.3 s, and a loaded machine can stall this test for
  // longer): its outcome is read from the counters, and a request that
  // finished instead of being cancelled is tried again.
  const auto outcomes = [&] {
    auto m = parse_metrics(curl(s.url() + "/metrics").body);
    return std::pair{metric_sum(m, "msinfer:request_aborted_total{"),
                     metric_sum(m, "msinfer:request_success_total{")};
  };
  int cancelled = 0, finished_first = 0;
  for (int i = 0; cancelled < 6 && finished_first < 20; ++i) {
    const bool stream = cancelled % 2 == 0;
    const auto [aborted_before, success_before] = outcomes();
    const std::string body =
        std::string(R"({"prompt": "Hello", "max_tokens": 4000, "ignore_eos": true, "stream": )") +
        (stream ? "true" : "false") + "}";
    const int fd = testing::send_request(s.port(), testing::post_request("/v1/completions", body));
    ASSERT_GE(fd, 0);
    if (stream) {
      // Wait for its first token, so the request is surely running (the
      // stream's headers go out when it is queued).
      const std::string first = testing::read_from(fd, std::chrono::seconds(30), "\"text\"");
      EXPECT_NE(first.find("\"text\""), std::string::npos) << first;
    } else {
      // Until it holds KV blocks, or its whole answer has come.
      const auto deadline = clock_type::now() + std::chrono::seconds(30);
      while (clock_type::now() < deadline &&
             !testing::readable_within(fd, std::chrono::milliseconds(0))) {
        auto m = parse_metrics(curl(s.url() + "/metrics").body);
        if (metric(m, "msinfer:kv_cache_usage_perc{") > 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    linger l{1, 0};  // RST: abrupt
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(fd);
    // The request ends one way or the other.
    const auto deadline = clock_type::now() + std::chrono::seconds(30);
    auto now = outcomes();
    while (now.first + now.second == aborted_before + success_before &&
           clock_type::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      now = outcomes();
    }
    ASSERT_GT(now.first + now.second, aborted_before + success_before) << "request " << i;
    if (now.first > aborted_before) {
      ++cancelled;
    } else {
      ++finished_first;
    }
  }
  std::cerr << cancelled << " requests cancelled, " << finished_first
            << " finished before they were cut off\n";
  EXPECT_EQ(cancelled, 6) << finished_first << " requests finished before they were cut off";
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
  EXPECT_EQ(curl(s.url() + "/health").status, 200);
}

// Starts a chat stream of max_tokens with 20 log-probabilities a token
// (~1.7 KB a token) on a connection with a 4 KiB receive window that reads
// nothing yet; its socket, or -1.
int start_heavy_stream(const Server& s, int max_tokens) {
  const int fd = testing::connect_loopback(s.port(), 4096);
  if (fd < 0) return -1;
  const std::string req = testing::post_request(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": )" +
          std::to_string(max_tokens) +
          R"(, "ignore_eos": true, "stream": true, "logprobs": true, "top_logprobs": 20})");
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A client that stops reading is cut off once --max-pending-kb is queued for
// it (its request cancelled, its connection closed) while another client's
// stream goes on to its end: with an engine step's writes sent together
// through io_uring (the full socket's write fails with EAGAIN there and is
// finished by itself) and with a send() each.
void check_slow_reader_is_cut_off(const std::string& flags) {
  // 256 KiB: more than the other client's whole stream (~60 KB), so that a
  // busy machine delaying it cannot get it cut off too. One kernel thread:
  // the cut-off needs ~2,000 tokens generated within the wait below, and
  // on a machine whose cores other tests keep busy the engine's every-core
  // default stalls at OpenMP's barriers (both tests failed in CI's ASan pass
  // at two threads, the reader never cut off within 60 s).
  Server s("--max-pending-kb 256 --threads 1 " + flags);
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // The slow reader reads nothing: 3900 tokens (~6.5 MB) outgrow what the
  // kernel buffers for a connection (its send buffer grows to
  // net.ipv4.tcp_wmem's 4 MB), and the server's queue fills. The engine
  // (~13,000 tokens/s here) is at most 256 steps ahead of the HTTP loop, so
  // a loop short of cpu finds the reader slow while its request runs (the
  // kernel takes ~2,000 tokens, the queue ~150 more): before that bound, a
  // loop starved for a fifth of a second let the request finish.
  const int slow = start_heavy_stream(s, 3900);
  ASSERT_GE(slow, 0);
  // A reader that keeps up gets its whole stream meanwhile.
  const HttpResult r = post(
      s, "/v1/completions",
      R"({"prompt": "Hello", "max_tokens": 300, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})");
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300) << s.stderr_text();
  EXPECT_NE(r.body.find("\"completion_tokens\":300"), std::string::npos) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  // The slow one is cut off before its tokens are out.
  const auto deadline = clock_type::now() + std::chrono::seconds(60);
  double aborted = 0;
  while (clock_type::now() < deadline) {
    aborted =
        metric(parse_metrics(curl(s.url() + "/metrics").body), "msinfer:request_aborted_total{");
    if (aborted >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(aborted, 1);
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
  bool closed = false;
  const std::string got = testing::read_from(slow, std::chrono::seconds(30), "", SIZE_MAX, &closed);
  ::close(slow);
  EXPECT_TRUE(closed);
  EXPECT_NE(got.find(" 200 OK"), std::string::npos) << got.substr(0, 200);
  EXPECT_EQ(got.find("[DONE]"), std::string::npos);
  auto m = parse_metrics(curl(s.url() + "/metrics").body);
  EXPECT_EQ(metric(m, "msinfer:request_success_total{model_name=\"" +
                          model_dir().filename().string() + "\",finished_reason=\"length\"}"),
            1);
  const double batched = metric(m, "msinfer:http_batched_writes_total{");
  const double submits = metric(m, "msinfer:http_batch_submits_total{");
  if (flags.find("--no-io-uring") != std::string::npos) {
    EXPECT_EQ(batched, 0);
    EXPECT_EQ(submits, 0);
  } else if (s.stderr_text().find("no io_uring") != std::string::npos) {
    // The kernel refused it (the server said so): a send() each.
    EXPECT_EQ(batched, 0);
  } else {
    // The streams' writes after their headers went in batches (the loop
    // folds the rounds it is late for into one write a stream).
    EXPECT_GE(batched, 1);
    EXPECT_GE(submits, 1);
    EXPECT_LE(submits, batched);
  }
  EXPECT_EQ(curl(s.url() + "/health").status, 200);
}

// A reader that is slow but reads on gets every byte of its stream, in order:
// the writes the kernel takes only part of (or none of) are finished later.
void check_slow_reader_gets_every_byte(const std::string& flags) {
  Server s("--max-pending-kb 65536 " + flags);
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const int fd = start_heavy_stream(s, 3000);
  ASSERT_GE(fd, 0);
  // Not reading while the tokens come: the socket fills, the server queues.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // 3000 tokens with 20 alternatives each took 60-65 s under TSan on a busy
  // 2-core machine; a stream that stops still fails here.
  const std::string got = testing::read_from(fd, std::chrono::seconds(240), "data: [DONE]");
  ::close(fd);
  ASSERT_NE(got.find("data: [DONE]"), std::string::npos) << got.size() << " bytes";
  // One entry with its top_logprobs per token, each once, in one piece.
  size_t entries = 0;
  for (size_t at = got.find("\"top_logprobs\":["); at != std::string::npos;
       at = got.find("\"top_logprobs\":[", at + 1)) {
    ++entries;
  }
  EXPECT_EQ(entries, 3000u);
  EXPECT_NE(got.find("\"finish_reason\":\"length\""), std::string::npos);
  // Every SSE event is whole JSON.
  size_t events = 0;
  for (size_t at = got.find("data: {"); at != std::string::npos; at = got.find("data: {", at + 1)) {
    const size_t end = got.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    EXPECT_TRUE(Json::accept(got.substr(at + 6, end - at - 6))) << got.substr(at, 200);
    ++events;
  }
  EXPECT_GE(events, 3000u);
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
}

TEST_F(ServeTest, ASlowReaderIsCutOffAndStallsNoOne) { check_slow_reader_is_cut_off(""); }

TEST_F(ServeTest, ASlowReaderIsCutOffAndStallsNoOneWithASendEach) {
  check_slow_reader_is_cut_off("--no-io-uring");
}

TEST_F(ServeTest, ASlowReaderThatReadsOnGetsEveryByte) { check_slow_reader_gets_every_byte(""); }

TEST_F(ServeTest, ASlowReaderThatReadsOnGetsEveryByteWithASendEach) {
  check_slow_reader_gets_every_byte("--no-io-uring");
}

// Co-located, the engine's kernels run on every CPU the server may use
// (OpenMP's default counts the affinity mask's, OMP_NUM_THREADS overrides it),
// not one fewer for the HTTP loop (issue 47: that halved a single stream's
// speed); --threads chooses.
TEST_F(ServeTest, TheColocatedEngineRunsOnEveryCpuUnlessToldOtherwise) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  int expected = CPU_COUNT(&set);
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && std::atoi(omp) > 0) {
    expected = std::atoi(omp);
  }
  {
    Server s("");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    EXPECT_NE(s.ready_line().find("kernel threads " + std::to_string(expected) + ")"),
              std::string::npos)
        << s.ready_line();
  }
  Server one("--threads 1");
  ASSERT_GT(one.port(), 0) << one.stderr_text();
  EXPECT_NE(one.ready_line().find("kernel threads 1)"), std::string::npos) << one.ready_line();
}

// The server's OpenMP threads spin only briefly before they sleep (libgomp's
// 300,000 spins held the cores other work needed: cli_common.h): msinfer runs
// itself again with GOMP_SPINCOUNT set, unless the environment chose.
std::string environment_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ");
  std::string env(std::istreambuf_iterator<char>(f), {});
  std::replace(env.begin(), env.end(), '\0', '\n');
  return "\n" + env;
}

TEST_F(ServeTest, OpenmpThreadsSpinBrieflyUnlessTheEnvironmentChooses) {
  std::map<std::string, std::string> saved;
  for (const char* v : {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"}) {
    if (const char* x = std::getenv(v)) saved[v] = x;
    ::unsetenv(v);
  }
  {
    Server s("--threads 1");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    const std::string env = environment_of(s.pid());
    EXPECT_NE(env.find("\nGOMP_SPINCOUNT=10000\n"), std::string::npos) << env;
    EXPECT_EQ(env.find("\nOMP_WAIT_POLICY="), std::string::npos);
    EXPECT_EQ(curl(s.url() + "/health").status, 200);
  }
  ::setenv("GOMP_SPINCOUNT", "1234", 1);
  {
    Server s("--threads 1");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    EXPECT_NE(environment_of(s.pid()).find("\nGOMP_SPINCOUNT=1234\n"), std::string::npos);
  }
  ::unsetenv("GOMP_SPINCOUNT");
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  {
    Server s("--threads 1");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    EXPECT_EQ(environment_of(s.pid()).find("\nGOMP_SPINCOUNT="), std::string::npos);
  }
  ::unsetenv("OMP_WAIT_POLICY");
  {
    // A disaggregated server's workers sleep at once (OMP_WAIT_POLICY
    // PASSIVE, as docs/RUNTIME.md measured it): the server's own bounded
    // spin would win over it in libgomp, so they do not inherit it.
    Server s("--attention-workers 1 --expert-workers 1 --micro-batches 1");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    EXPECT_NE(environment_of(s.pid()).find("\nGOMP_SPINCOUNT=10000\n"), std::string::npos);
    std::ifstream f("/proc/" + std::to_string(s.pid()) + "/task/" + std::to_string(s.pid()) +
                    "/children");
    int workers = 0;
    for (pid_t child = 0; f >> child;) {
      const std::string env = environment_of(child);
      if (env.find("\nMSINFER_RANK=") == std::string::npos) continue;  // not a worker
      ++workers;
      EXPECT_NE(env.find("\nOMP_WAIT_POLICY=PASSIVE\n"), std::string::npos) << env;
      EXPECT_EQ(env.find("\nGOMP_SPINCOUNT="), std::string::npos) << env;
    }
    EXPECT_EQ(workers, 2);
  }
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

TEST_F(ServeTest, FullQueueGets429AndApiKeyIsEnforced) {
  Server s("--max-num-seqs 1 --max-queue 0 --api-key sekrit");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string auth = "-H 'Content-Type: application/json' -H 'Authorization: Bearer sekrit'";
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status, 401);
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})",
                 "-H 'Content-Type: application/json' -H 'Authorization: Bearer wrong'")
                .status,
            401);
  EXPECT_EQ(curl(s.url() + "/health").status, 200);   // open
  EXPECT_EQ(curl(s.url() + "/metrics").status, 200);  // open
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", auth).status, 200);
  // One long request takes the only seat; the next gets 429 with Retry-After.
  const std::string body =
      R"({"prompt": "Hello", "max_tokens": 4000, "ignore_eos": true, "stream": true})";
  const int fd = testing::send_request(
      s.port(), testing::post_request("/v1/completions", body, "Authorization: Bearer sekrit\r\n"));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::readable_within(fd, std::chrono::seconds(30)));
  // It has the seat: the seat of the request answered just before was free
  // when that answer went out (it was once given back after it, and a
  // client as quick as this one got 429 here).
  char head[13] = {};
  ASSERT_EQ(::recv(fd, head, 12, MSG_PEEK), 12);
  ASSERT_STREQ(head, "HTTP/1.1 200");
  // The second request goes out at once over a raw socket (a curl process
  // could start after the first stream ended on a loaded machine).
  const int busy_fd = testing::send_request(
      s.port(), testing::post_request("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})",
                                      "Authorization: Bearer sekrit\r\nConnection: close\r\n"));
  ASSERT_GE(busy_fd, 0);
  const std::string busy = testing::read_from(busy_fd, std::chrono::seconds(30));
  ::close(busy_fd);
  EXPECT_EQ(busy.rfind("HTTP/1.1 429 ", 0), 0u) << busy;
  EXPECT_NE(busy.find("Retry-After: "), std::string::npos) << busy;
  ::close(fd);
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(30)));
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", auth).status, 200);
}

// Resident memory and threads of a process (/proc/PID/status).
std::pair<double, int> rss_mb_and_threads(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  double rss = 0;
  int threads = 0;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) threads = std::atoi(line.c_str() + 8);
  }
  return {rss, threads};
}

TEST_F(ServeTest, OnlineBenchAgainstTheServer) {
  Server s("");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string out =
      testing::run_capture(kBin + " bench serve --base-url " + s.url() +
                           " --num-prompts 12 --request-rate 40 --burstiness 0.5 "
                           "--max-concurrency 4 --input-len 6 --output-len 5 --goodput 'ttft:60000 "
                           "tpot:60000' --json 2>/dev/null");
  ASSERT_FALSE(out.empty());
  const Json j = Json::parse(out);
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_output_tokens"], 12 * 5);
  EXPECT_EQ(j["total_input_tokens"], 12 * 6);  // token-id prompts: no BOS added
  EXPECT_LE(j["max_in_flight"].get<int>(), 4);
  EXPECT_GT(j["goodput"].get<double>(), 0);
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) {
    EXPECT_GT(j[k]["p50"].get<double>(), 0) << k;
    EXPECT_GE(j[k]["p99"].get<double>(), j[k]["p50"].get<double>()) << k;
  }
  EXPECT_LE(j["connections_opened"].get<int>(), 4);  // the server keeps streams' connections
  // Warm-ups open the run's connections: the measured requests reuse them.
  const std::string warm =
      testing::run_capture(kBin + " bench serve --base-url " + s.url() +
                           " --num-prompts 8 --max-concurrency 4 --num-warmups 4 --input-len 6 "
                           "--output-len 5 --json 2>/dev/null");
  ASSERT_FALSE(warm.empty());
  const Json w = Json::parse(warm);
  EXPECT_EQ(w["completed"], 8);
  EXPECT_EQ(w["total_output_tokens"], 8 * 5);
  EXPECT_EQ(w["connections_opened"], 0);
  // The chat endpoint too.
  const std::string chat = testing::run_capture(kBin + " bench serve --base-url " + s.url() +
                                                " --endpoint /v1/chat/completions --num-prompts 3 "
                                                "--input-len 4 --output-len 3 --json 2>/dev/null");
  ASSERT_FALSE(chat.empty());
  EXPECT_EQ(Json::parse(chat)["completed"], 3);
}

// 1,000 concurrent streaming clients on loopback: none is lost (each completes
// or gets 429), the server's threads stay bounded, and its memory returns to
// the idle level afterwards.
TEST_F(ServeTest, ThousandConcurrentStreamingClients) {
  Server s("--max-num-seqs 256 --max-queue 600");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string load =
      kBin + " bench serve --base-url " + s.url() +
      " --num-prompts 1000 --max-concurrency 1000 --input-len 8 --output-len 8 --json 2>/dev/null";
  // A first burst warms up what stays (KV pages first touched, allocator
  // arenas); the level after it is the idle level the second must return to.
  ASSERT_FALSE(testing::run_capture(load).empty());
  ASSERT_TRUE(wait_drained(s, std::chrono::seconds(60)));
  // The engine hands freed pages back once idle for 2 s
  // (SchedulerOptions::trim_after_idle): the idle level is after that.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto [idle_rss, idle_threads] = rss_mb_and_threads(s.pid());
  std::atomic<bool> running{true};
  double peak_rss = 0;
  int peak_threads = 0;
  std::thread sampler([&] {
    while (running) {
      auto [r, t] = rss_mb_and_threads(s.pid());
      peak_rss = std::max(peak_rss, r);
      peak_threads = std::max(peak_threads, t);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const std::string out = testing::run_capture(load);
  running = false;
  sampler.join();
  ASSERT_FALSE(out.empty());
  const Json j = Json::parse(out);
  EXPECT_EQ(j["max_in_flight"], 1000);
  // 256 in the batch + 600 queued are taken; the rest may be refused, never lost.
  EXPECT_EQ(j["completed"].get<int>() + j["rejected_429"].get<int>(), 1000) << j.dump();
  EXPECT_EQ(j["failed"], j["rejected_429"]) << j.dump();
  EXPECT_GE(j["completed"].get<int>(), 856);
  EXPECT_LE(peak_threads, idle_threads);  // no thread per connection
  EXPECT_TRUE(wait_drained(s, std::chrono::seconds(60)));
  // Back to the idle level within the trim delay (polled: no fixed wait).
  auto after = rss_mb_and_threads(s.pid());
  for (int i = 0; i < 100 && after.first > idle_rss + 8.0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    after = rss_mb_and_threads(s.pid());
  }
  std::fprintf(
      stderr,
      "server RSS: idle %.1f MiB, peak %.1f MiB, after %.1f MiB; threads idle %d, peak %d\n",
      idle_rss, peak_rss, after.first, idle_threads, peak_threads);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // Memory goes back after the clients leave. Not under the sanitizers: ASan's
  // quarantine keeps freed memory resident by design (its leak check at exit
  // covers what this would), and TSan's shadow of touched memory stays.
  EXPECT_LE(after.first, idle_rss + 8.0);
#endif
  EXPECT_EQ(curl(s.url() + "/health").status, 200);
}

// SIGTERM drains: /health and new requests answer 503 while a running stream
// finishes normally, then the server exits 0.
TEST_F(ServeTest, SigtermDrainsRunningRequests) {
  // Six long streams, one at a time (--max-num-seqs 1): the drain lasts
  // six generations of up to 4,000 tokens, long enough for the checks below
  // (one stream of the tiny model can end within a few hundred ms, and the
  // server with it, before a request that should get 503 is sent).
  // One kernel thread: the test is about the drain, and on a machine that
  // other processes keep busy the tiny model's short steps on every core
  // stall at OpenMP barriers (116 s of the 120 s drain at load 10 on the
  // 2-core VM, against 2.9 s on one thread).
  Server s("--drain-timeout 120 --max-num-seqs 1 --threads 1");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // Under TSan a step is ~20x slower: 500 tokens each keep the six within
  // the read limit there (4,000 each took over 120 s) and still drain for
  // many seconds.
#if defined(__SANITIZE_THREAD__)
  const std::string max_tokens = "500";
#else
  const std::string max_tokens = "4000";
#endif
  const std::string body = R"({"prompt": "Hello", "max_tokens": )" + max_tokens +
                           R"(, "ignore_eos": true, "stream": true})";
  constexpr int kStreams = 6;
  std::vector<int> fds;
  for (int i = 0; i < kStreams; ++i) {
    fds.push_back(testing::send_request(s.port(), testing::post_request("/v1/completions", body)));
    ASSERT_GE(fds.back(), 0);
  }
  // All six are in: one running, five waiting (else the drain would refuse
  // those it has not read yet, with 503).
  bool all_in = false;
  for (auto until = clock_type::now() + std::chrono::seconds(30);
       !all_in && clock_type::now() < until;) {
    auto m = parse_metrics(curl(s.url() + "/metrics").body);
    all_in =
        metric(m, "msinfer:num_requests_running{") + metric(m, "msinfer:num_requests_waiting{") ==
        kStreams;
  }
  ASSERT_TRUE(all_in);
  // The streams are read as they come (a client that stops reading would be
  // cut off as a slow reader), each on its own thread.
  std::vector<std::string> streams(kStreams);
  std::vector<std::thread> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.emplace_back(
        [&, i] { streams[i] = testing::read_from(fds[i], std::chrono::seconds(240), "[DONE]"); });
  }
  ::kill(s.pid(), SIGTERM);
  // Draining: /health turns 503 (wait for it), new work is refused.
  bool saw_503 = false;
  const auto until = clock_type::now() + std::chrono::seconds(30);
  while (!saw_503 && clock_type::now() < until) saw_503 = curl(s.url() + "/health").status == 503;
  EXPECT_TRUE(saw_503);
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status, 503);
  // The running stream and those queued behind it still end normally.
  for (auto& r : readers) r.join();
  for (int fd : fds) ::close(fd);
  for (const std::string& stream : streams) {
    EXPECT_NE(stream.find("\"finish_reason\":\"length\""), std::string::npos);
    EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  }
  // It exits by itself once drained. A second SIGTERM here would race its
  // exit: once the HTTP loop is gone, that signal kills it (status 143).
  EXPECT_EQ(s.wait_exit(std::chrono::seconds(60)), 0) << s.stderr_text();
}

// --host and --base-url take names and IPv6 addresses, as vLLM users write
// them: the ready line's URL works with curl and with bench serve.
void expect_served_at(const Server& s, const std::string& url) {
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  EXPECT_EQ(s.url(), url + ":" + std::to_string(s.port()));
  EXPECT_EQ(testing::run_capture("curl -s -g " + s.url() + "/health"), R"({"status":"ok"})");
  const std::string out = testing::run_capture(kBin + " bench serve --base-url " + s.url() +
                                               " --num-prompts 3 --input-len 4 --output-len 3 "
                                               "--json 2>&1");
  const Json j = Json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["completed"], 3) << out;
  EXPECT_EQ(j["total_output_tokens"], 9) << out;
}

TEST_F(ServeTest, HostNamesAndIpv6) {
  Server named("--host localhost");
  expect_served_at(named, "http://localhost");
  // IPv6 loopback where the machine has it (a container may not).
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool v6 = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) ::close(fd);
  if (!v6) GTEST_SKIP() << "no IPv6 loopback here";
  Server six("--host ::1");
  expect_served_at(six, "http://[::1]");
}

TEST_F(ServeTest, BadFlagsExitTwo) {
  const std::string m = "--port 0 --model " + model_dir().string();
  // tiny-qwen3moe: 768 bytes of KV a token, so 1 MiB holds 1,360 of its 4,096.
  const fs::path qwen =
      fs::path(::testing::TempDir()) / ("msinfer-serve-qwen-" + std::to_string(::getpid()));
  ASSERT_EQ(std::system((kBin + " make-model --preset tiny-qwen3moe --out " + qwen.string() +
                         " >/dev/null 2>&1")
                            .c_str()),
            0);
  const std::string q = "--port 0 --model " + qwen.string();
  // Each is refused before the server starts, with exit 2 and its reason (a
  // server that starts instead is stopped by `timeout`: exit 124).
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "--model is required"},
      {"--port 0 --model /nonexistent", "/nonexistent"},
      {"--model " + model_dir().string() + " --port 70000", "--port must be in 0..65535"},
      {m + " --max-num-seqs 0", "--max-num-seqs: 0 is out of range"},
      // The step's token budget (issue 47): at least 1, at least one decode
      // token for every sequence of the batch, and disaggregated within what
      // an M2N message holds (tiny-mixtral, top_k 2: 32,767 tokens).
      {m + " --max-num-batched-tokens 0", "--max-num-batched-tokens: 0 is out of range"},
      {m + " --max-num-batched-tokens 100 --max-num-seqs 200",
       "--max-num-batched-tokens 100 is less than --max-num-seqs 200"},
      {m + " --attention-workers 1 --expert-workers 1 --max-num-batched-tokens 40000",
       "--max-num-batched-tokens 40000 is more than this deployment's M2N messages hold (at "
       "most 32767"},
      // Every limit has a range (issue 43): these used to disable the body
      // limit, make every POST a 413, close every connection unanswered, or
      // abort with std::bad_alloc.
      {m + " --max-body-kb -1", "--max-body-kb: -1 is out of range"},
      {m + " --max-body-kb 0", "--max-body-kb: 0 is out of range"},
      {m + " --request-timeout 0.0001", "--request-timeout: 0.0001 is out of range"},
      {m + " --kv-cache-mb 2147483647", "--kv-cache-mb: 2147483647 is out of range"},
      {m + " --kv-cache-mb 1048576", "is more than this machine's memory"},
      {m + " --max-connections 0", "--max-connections: 0 is out of range"},
      {m + " --max-connections-per-client -1", "--max-connections-per-client: -1 is out of range"},
      {m + " --tokenize-timeout 0", "--tokenize-timeout: 0 is out of range"},
      {m + " --max-header-kb 0", "--max-header-kb: 0 is out of range"},
      {m + " --max-queue -1", "--max-queue: -1 is out of range"},
      {m + " --no-such-flag", "--no-such-flag"},
      {m + " --max-model-len -3", "--max-model-len: -3 is out of range"},
      // More than the model's context: refused, not silently capped.
      {m + " --max-model-len 999999",
       "--max-model-len 999999 is beyond the model's context (max_position_embeddings 4096"},
      {q + " --kv-cache-mb 1 --max-model-len 4096",
       "--max-model-len 4096 does not fit the KV cache: --kv-cache-mb 1 holds 1360 tokens"},
  };
  for (const auto& [args, reason] : cases) {
    const std::string out =
        testing::run_capture("timeout -k 5 20 " + kBin + " serve " + args + " 2>&1; echo rc=$?");
    EXPECT_NE(out.find(reason), std::string::npos) << args << ": " << out;
    EXPECT_NE(out.find("rc=2"), std::string::npos) << args << ": " << out;
    EXPECT_EQ(out.find("ready at"), std::string::npos) << args << ": " << out;
  }
  fs::remove_all(qwen);
}

}  // namespace
}  // namespace msinfer
