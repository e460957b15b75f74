// `msinfer serve` when workers die (issue 47, "Health"), end to end over real
// sockets: a failure the deployment cannot recover from ends the streams in
// flight with an error and the server exits 1 leaving no worker and no
// shared-memory object (--exit-on-failure, the default), or keeps answering
// 503 with the failure in /health's body (--no-exit-on-failure); the gauges
// say what is true after the aborts; worker deaths, restarts and live workers
// reach /metrics and /health ("degraded" while a worker is down); the
// process_* family parses; and an attention worker killed under load from
// the official openai client is replaced (--respawn) with no request lost
// (--resubmit) and the greedy text of `msinfer generate`. Every server a test
// starts is stopped by its destructor, also when the test fails.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
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
using testing::metric;
using testing::model_dir;
using testing::node_modules;
using testing::parse_metrics;
using testing::post;
using testing::Server;
using testing::source_dir;

// "<role> worker <i>: pid <p>" lines of the server's log, as "<role><i>".
std::map<std::string, pid_t> worker_pids(const Server& s) {
  std::map<std::string, pid_t> pids;
  const std::string err = s.stderr_text();
  const std::regex line("(attention|expert|prefill) worker ([0-9]+): pid ([0-9]+)");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator();
       ++it) {
    pids[(*it)[1].str() + (*it)[2].str()] = std::stoi((*it)[3]);
  }
  return pids;
}

std::map<std::string, double> scrape(const Server& s) {
  return parse_metrics(curl(s.url() + "/metrics").body);
}

// The sample `name{model_name="...",role="R"}`, or -1.
double by_role(const std::map<std::string, double>& m, const std::string& name,
               const std::string& role) {
  return metric(
      m, name + "{model_name=\"" + model_dir().filename().string() + "\",role=\"" + role + "\"}");
}

// Polls /health until its body's "status" is `want` (up to `limit`); the last answer.
HttpResult wait_health(const Server& s, const std::string& want, std::chrono::seconds limit) {
  const auto deadline = clock_type::now() + limit;
  HttpResult h = curl(s.url() + "/health");
  while (clock_type::now() < deadline) {
    const Json j = Json::parse(h.body, nullptr, false);
    if (j.is_object() && j.value("status", "") == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    h = curl(s.url() + "/health");
  }
  return h;
}

// Polls /metrics until the sample `name{...,role="R"}` reads `want` (up to
// `limit`); whether it did.
bool wait_role_metric(const Server& s, const std::string& name, const std::string& role,
                      double want, std::chrono::seconds limit) {
  const auto deadline = clock_type::now() + limit;
  while (clock_type::now() < deadline) {
    if (by_role(scrape(s), name, role) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

Json workers_body(int attention_live, int attention, int expert_live, int expert) {
  return Json{{"attention", {{"live", attention_live}, {"expected", attention}}},
              {"expert", {{"live", expert_live}, {"expected", expert}}}};
}

// A streaming request that runs long enough to be killed under, on its own
// socket, read up to its first text: the request is in the deployment.
int start_stream(const Server& s, std::string* read) {
  const std::string body =
      R"({"prompt": "Hello", "max_tokens": 3000, "ignore_eos": true, "stream": true})";
  const int fd = testing::send_request(s.port(), testing::post_request("/v1/completions", body));
  if (fd >= 0) *read = testing::read_from(fd, std::chrono::seconds(30), "\"text\"");
  return fd;
}

class ServeHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(model_dir() / "config.json")) << "make-model failed";
  }
};

// The only expert worker dies (no replica, no --respawn): the stream in
// flight ends with an error event naming it, the server exits 1 within a
// bound saying why, and no worker process or /dev/shm object is left.
TEST_F(ServeHealthTest, AnUnrecoverableFailureEndsStreamsAndExitsOne) {
  Server s("--attention-workers 1 --expert-workers 1 --micro-batches 1");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const auto pids = worker_pids(s);
  ASSERT_EQ(pids.size(), 2u) << s.stderr_text();
  const pid_t server = s.pid();
  std::string stream;
  const int fd = start_stream(s, &stream);
  ASSERT_GE(fd, 0);
  ASSERT_NE(stream.find("\"text\""), std::string::npos) << stream;
  ASSERT_EQ(::kill(pids.at("expert0"), SIGKILL), 0);
  bool closed = false;
  stream += testing::read_from(fd, std::chrono::seconds(60), "", SIZE_MAX, &closed);
  ::close(fd);
  EXPECT_TRUE(closed) << "the server kept the connection open";
  EXPECT_NE(stream.find("\"error\""), std::string::npos)
      << stream.substr(stream.size() > 600 ? stream.size() - 600 : 0);
  EXPECT_NE(stream.find("expert worker 0"), std::string::npos);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(s.wait_exit(std::chrono::seconds(30)), 1) << s.stderr_text();
  const std::string log = s.stderr_text();
  EXPECT_NE(log.find("msinfer serve: exiting with status 1: the deployment failed and cannot "
                     "recover: expert worker 0"),
            std::string::npos)
      << log;
  for (const auto& [name, pid] : pids) {
    EXPECT_NE(::kill(pid, 0), 0) << name << " outlived the server";
    EXPECT_TRUE(testing::shm_objects_removed(pid)) << name;
  }
  EXPECT_TRUE(testing::shm_objects_of(server).empty());
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << log;
}

// The same failure with --no-exit-on-failure: the server stays up answering
// 503 with the failure and the workers in /health's body; the gauges read
// nothing running and no KV in use; the death is counted. SIGTERM then exits
// 0 and leaves nothing behind.
TEST_F(ServeHealthTest, WithoutExitOnFailureTheServerAnswers503) {
  Server s("--attention-workers 1 --expert-workers 1 --micro-batches 1 --no-exit-on-failure");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const auto pids = worker_pids(s);
  ASSERT_EQ(pids.size(), 2u) << s.stderr_text();
  HttpResult h = curl(s.url() + "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(Json::parse(h.body, nullptr, false),
            (Json{{"status", "ok"}, {"workers", workers_body(1, 1, 1, 1)}}))
      << h.body;
  std::string stream;
  const int fd = start_stream(s, &stream);
  ASSERT_GE(fd, 0);
  ASSERT_NE(stream.find("\"text\""), std::string::npos) << stream;
  auto m = scrape(s);
  EXPECT_EQ(metric(m, "msinfer:num_requests_running{"), 1);
  ASSERT_EQ(::kill(pids.at("expert0"), SIGKILL), 0);
  stream += testing::read_from(fd, std::chrono::seconds(60), "[DONE]");
  ::close(fd);
  EXPECT_NE(stream.find("\"error\""), std::string::npos);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  h = curl(s.url() + "/health");
  EXPECT_EQ(h.status, 503);
  const Json body = Json::parse(h.body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << h.body;
  EXPECT_EQ(body["status"], "failed") << h.body;
  EXPECT_NE(body.value("error", "").find("expert worker 0"), std::string::npos) << h.body;
  EXPECT_EQ(body["workers"], workers_body(0, 1, 0, 1)) << h.body;
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status, 503);
  // What is true after the abort.
  m = scrape(s);
  EXPECT_EQ(metric(m, "msinfer:num_requests_running{"), 0);
  EXPECT_EQ(metric(m, "msinfer:num_requests_waiting{"), 0);
  EXPECT_EQ(metric(m, "msinfer:kv_cache_usage_perc{"), 0);
  EXPECT_EQ(metric(m, "msinfer:request_aborted_total{"), 1);
  EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "expert"), 1);
  EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "attention"), 0);
  EXPECT_EQ(by_role(m, "msinfer:workers_live", "expert"), 0);
  EXPECT_EQ(by_role(m, "msinfer:workers_expected", "expert"), 1);
  EXPECT_EQ(::kill(s.pid(), 0), 0) << "the server exited";
  const pid_t server = s.pid();
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  for (const auto& [name, pid] : pids) {
    EXPECT_NE(::kill(pid, 0), 0) << name << " outlived the server";
    EXPECT_TRUE(testing::shm_objects_removed(pid)) << name;
  }
  EXPECT_TRUE(testing::shm_objects_of(server).empty());
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

// Every expert on both expert workers: the death of one is dropped in place.
std::string both_placement() {
  const std::string path =
      ::testing::TempDir() + "/serve_health_both_" + std::to_string(::getpid()) + ".json";
  Json experts = Json::array();
  for (int e = 0; e < 8; ++e) experts.push_back(Json::array({{0, 0.5}, {1, 0.5}}));
  std::ofstream(path) << Json{{"expert_workers", 2}, {"experts", experts}}.dump();
  return path;
}

// An expert worker with replicas dies: the deployment serves on, /health
// says "degraded" (200) with one expert worker of two live, and /metrics
// counts the death. With --respawn a replacement joins: the restart is
// counted and live returns to expected, /health to "ok".
TEST_F(ServeHealthTest, AWorkerDownIsDegradedAndARespawnRestoresIt) {
  const std::string deployment =
      "--attention-workers 1 --expert-workers 2 --micro-batches 2 --placement " + both_placement();
  for (const bool respawn : {false, true}) {
    SCOPED_TRACE(respawn ? "--respawn" : "without --respawn");
    Server s(deployment + (respawn ? " --respawn" : ""));
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    const auto pids = worker_pids(s);
    ASSERT_EQ(pids.size(), 3u) << s.stderr_text();
    auto m = scrape(s);
    EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "expert"), 0);
    EXPECT_EQ(by_role(m, "msinfer:worker_restarts_total", "expert"), 0);
    EXPECT_EQ(by_role(m, "msinfer:workers_live", "expert"), 2);
    EXPECT_EQ(by_role(m, "msinfer:workers_live", "attention"), 1);
    ASSERT_EQ(::kill(pids.at("expert1"), SIGKILL), 0);
    // Idle: the engine thread's stats refresh finds the death (about once a second).
    EXPECT_TRUE(
        wait_role_metric(s, "msinfer:worker_deaths_total", "expert", 1, std::chrono::seconds(30)));
    if (!respawn) {
      const HttpResult h = wait_health(s, "degraded", std::chrono::seconds(30));
      EXPECT_EQ(h.status, 200);
      EXPECT_EQ(Json::parse(h.body, nullptr, false),
                (Json{{"status", "degraded"}, {"workers", workers_body(1, 1, 1, 2)}}))
          << h.body;
      m = scrape(s);
      EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "expert"), 1);
      EXPECT_EQ(by_role(m, "msinfer:workers_live", "expert"), 1);
      EXPECT_EQ(by_role(m, "msinfer:worker_restarts_total", "expert"), 0);
      // It still serves.
      EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 4})").status, 200);
      EXPECT_EQ(curl(s.url() + "/health").status, 200);
    } else {
      // The replacement joins at the stats refreshes of the idle server.
      EXPECT_TRUE(
          wait_role_metric(s, "msinfer:workers_live", "expert", 2, std::chrono::seconds(60)));
      const HttpResult h = wait_health(s, "ok", std::chrono::seconds(60));
      EXPECT_EQ(h.status, 200);
      EXPECT_EQ(Json::parse(h.body, nullptr, false),
                (Json{{"status", "ok"}, {"workers", workers_body(1, 1, 2, 2)}}))
          << h.body;
      m = scrape(s);
      EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "expert"), 1);
      EXPECT_EQ(by_role(m, "msinfer:worker_restarts_total", "expert"), 1);
      EXPECT_EQ(by_role(m, "msinfer:workers_live", "expert"), 2);
      EXPECT_NE(s.stderr_text().find("expert worker 1 is back"), std::string::npos);
      EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 4})").status, 200);
    }
    EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
    if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
  }
}

// Prefill workers (issue 50) in /health and /metrics: their live and
// expected count beside the other roles, the K/V transfers counted; one
// killed is a death, /health says "degraded" (200), and the other goes on
// prefilling, its transfers counted on.
// Greedy requests: sampled at temperature 1, a request whose first token
// ends it finishes on the prefill worker and moves no K/V (the counts below
// came out one short in a CI run).
TEST_F(ServeHealthTest, PrefillWorkersReachHealthAndMetrics) {
  Server s("--attention-workers 1 --expert-workers 1 --prefill-workers 2");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const auto pids = worker_pids(s);
  ASSERT_EQ(pids.size(), 4u) << s.stderr_text();
  Json workers = workers_body(1, 1, 1, 1);
  workers["prefill"] = {{"live", 2}, {"expected", 2}};
  HttpResult h = curl(s.url() + "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(Json::parse(h.body, nullptr, false), (Json{{"status", "ok"}, {"workers", workers}}))
      << h.body;
  const std::string label = "{model_name=\"" + model_dir().filename().string() + "\"}";
  auto m = scrape(s);
  EXPECT_EQ(metric(m, "msinfer:kv_transfers_total" + label), 0);
  EXPECT_EQ(by_role(m, "msinfer:workers_live", "prefill"), 2);
  EXPECT_EQ(by_role(m, "msinfer:workers_expected", "prefill"), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi there", "max_tokens": 4, "temperature": 0})").status, 200);
  }
  m = scrape(s);
  EXPECT_EQ(metric(m, "msinfer:kv_transfers_total" + label), 2);
  EXPECT_GT(metric(m, "msinfer:kv_transfer_bytes_total" + label), 0);
  EXPECT_EQ(metric(m, "msinfer:kv_transfer_fallbacks_total" + label), 0);
  EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "prefill"), 0);

  ASSERT_EQ(::kill(pids.at("prefill1"), SIGKILL), 0);
  EXPECT_TRUE(
      wait_role_metric(s, "msinfer:worker_deaths_total", "prefill", 1, std::chrono::seconds(30)));
  h = wait_health(s, "degraded", std::chrono::seconds(30));
  EXPECT_EQ(h.status, 200);
  workers["prefill"] = {{"live", 1}, {"expected", 2}};
  EXPECT_EQ(Json::parse(h.body, nullptr, false),
            (Json{{"status", "degraded"}, {"workers", workers}}))
      << h.body;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi there", "max_tokens": 4, "temperature": 0})").status, 200);
  }
  m = scrape(s);
  EXPECT_EQ(metric(m, "msinfer:kv_transfers_total" + label), 4);
  EXPECT_EQ(by_role(m, "msinfer:workers_live", "prefill"), 1);
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << s.stderr_text();
}

// The process_* family is there, plausible, and parses as Prometheus text
// (prometheus_client's parser too, where Debian's python3-prometheus-client
// is installed).
TEST_F(ServeHealthTest, ProcessMetricsParse) {
  Server s("");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // /proc counts CPU time in 10 ms ticks: a plain build on a fast machine
  // served /metrics having used less than one (0 seconds). Completions give
  // it work until the counter moves, 50 at most.
  HttpResult r = curl(s.url() + "/metrics");
  ASSERT_EQ(r.status, 200);
  for (int i = 0; i < 50 && metric(parse_metrics(r.body), "process_cpu_seconds_total") == 0; ++i) {
    EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi there", "max_tokens": 16})").status,
              200);
    r = curl(s.url() + "/metrics");
    ASSERT_EQ(r.status, 200);
  }
  const auto m = parse_metrics(r.body);
  EXPECT_GT(metric(m, "process_cpu_seconds_total"), 0);
  EXPECT_GT(metric(m, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(metric(m, "process_virtual_memory_bytes"), metric(m, "process_resident_memory_bytes"));
  EXPECT_GT(metric(m, "process_open_fds"), 3);
  EXPECT_GE(metric(m, "process_max_fds"), metric(m, "process_open_fds"));
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(metric(m, "process_start_time_seconds"), now + 1);
  EXPECT_GE(metric(m, "process_start_time_seconds"), now - 600);
  EXPECT_NE(r.body.find("# TYPE process_cpu_seconds_total counter\n"), std::string::npos);
  EXPECT_NE(r.body.find("# TYPE process_open_fds gauge\n"), std::string::npos);
  // Co-located: no workers, no worker metrics; /health as before.
  EXPECT_EQ(r.body.find("msinfer:workers_live"), std::string::npos);
  EXPECT_EQ(curl(s.url() + "/health").body, R"({"status":"ok"})");
  if (std::system("/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null") != 0) {
    std::fprintf(stderr, "no prometheus_client for /usr/bin/python3: its parse is skipped\n");
    return;
  }
  const std::string py =
      "import sys; from prometheus_client.parser import text_string_to_metric_families as f\n"
      "fam = {x.name: x for x in f(sys.stdin.read())}\n"
      "s = {x.name: x.samples[0].value for x in fam.values() if x.samples}\n"
      "print(s['process_open_fds'] > 0, fam['process_cpu_seconds'].type,"
      " s['process_start_time_seconds'] > 1e9)\n";
  const std::string file = ::testing::TempDir() + "/metrics_" + std::to_string(::getpid());
  std::ofstream(file) << r.body;
  const std::string out =
      testing::run_capture("/usr/bin/python3 -c \"" + py + "\" < " + file + " 2>&1");
  EXPECT_EQ(out, "True counter True\n") << out;
}

Json generate_json(const std::string& prompt, int max_tokens) {
  const std::string out = testing::run_capture(
      kBin + " generate --model " + model_dir().string() + " --prompt '" + prompt +
      "' --max-tokens " + std::to_string(max_tokens) + " --ignore-eos --json 2>/dev/null");
  return out.empty() ? Json() : Json::parse(out);
}

// An attention worker dies under load from the official openai client (four
// greedy streams, two on each attention worker), with
// --resubmit --respawn: no request is lost, every text is `msinfer generate`'s
// greedy one (the killed worker's requests were resubmitted to the other),
// and a replacement joins: the death and the restart are counted, both
// attention workers are live again, and the requests after the join (some
// of which go to the replacement) give the same texts.
TEST_F(ServeHealthTest, AnAttentionWorkerKilledUnderLoadIsReplacedAndNoRequestIsLost) {
  if (!fs::exists(node_modules() / "openai")) GTEST_SKIP() << "run scripts/fetch-js-clients first";
  Server s("--attention-workers 2 --expert-workers 1 --micro-batches 1 --resubmit --respawn");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const auto pids = worker_pids(s);
  ASSERT_EQ(pids.size(), 3u) << s.stderr_text();
  // Long enough that the kill lands while every stream runs (the test checks
  // it); fewer under a sanitizer, where every step (and `generate`'s: 20 s
  // for 600 tokens under ASan) is many times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const int kMaxTokens = 150;
#else
  const int kMaxTokens = 600;
#endif
  std::vector<std::string> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back("Request " + std::to_string(i) + " says");
  const std::string started = ::testing::TempDir() + "/load_" + std::to_string(::getpid());
  std::string cmd = "node " + (source_dir() / "tests" / "server" / "openai_load.js").string() +
                    " " + node_modules().string() + " " + s.url() + " " +
                    model_dir().filename().string() + " " + std::to_string(kMaxTokens);
  for (const auto& p : prompts) cmd += " '" + p + "'";
  std::string out;
  std::atomic<bool> finished{false};
  std::thread load([&] {
    out = testing::run_capture(cmd + " 2>" + started);
    finished = true;
  });
  // Once every stream runs (the first text of each has come to the client,
  // and the server counts them all), the killed worker holds half of them.
  const auto deadline = clock_type::now() + std::chrono::seconds(60);
  size_t seen = 0;
  double running = 0;
  while ((seen < prompts.size() || running < prompts.size()) && !finished &&
         clock_type::now() < deadline) {
    std::ifstream f(started);
    const std::string text((std::istreambuf_iterator<char>(f)), {});
    seen = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    running = metric(scrape(s), "msinfer:num_requests_running{");
  }
  ASSERT_EQ(::kill(pids.at("attention1"), SIGKILL), 0);
  EXPECT_EQ(seen, prompts.size());
  EXPECT_EQ(running, prompts.size()) << "the streams did not all run at the kill";
  load.join();
  ASSERT_FALSE(out.empty()) << "the openai client failed";
  const Json r = Json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  ASSERT_FALSE(r.contains("fatal")) << r["fatal"];
  std::vector<Json> greedy;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    const Json gen = greedy.emplace_back(generate_json(prompts[i], kMaxTokens));
    ASSERT_FALSE(gen.is_null()) << "msinfer generate failed";
    for (const char* round : {"streams", "after"}) {
      const Json& got = r[round][i];
      EXPECT_FALSE(got.contains("error")) << round << ": " << got;
      EXPECT_EQ(got["text"], gen["text"]) << round;
      EXPECT_EQ(got["finish_reason"], "length") << round;
      EXPECT_EQ(got["completion_tokens"], kMaxTokens) << round;
    }
  }
  // The replacement is back (it joins between steps, or at an idle stats
  // refresh) and counted.
  const HttpResult h = wait_health(s, "ok", std::chrono::seconds(60));
  EXPECT_EQ(Json::parse(h.body, nullptr, false),
            (Json{{"status", "ok"}, {"workers", workers_body(2, 2, 1, 1)}}))
      << h.body;
  const auto m = scrape(s);
  EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "attention"), 1);
  EXPECT_EQ(by_role(m, "msinfer:worker_restarts_total", "attention"), 1);
  EXPECT_EQ(by_role(m, "msinfer:workers_live", "attention"), 2);
  EXPECT_EQ(by_role(m, "msinfer:worker_deaths_total", "expert"), 0);
  EXPECT_EQ(metric(m, "msinfer:request_aborted_total{"), 0);
  const std::string log = s.stderr_text();
  EXPECT_NE(log.find("attention worker 1 is back"), std::string::npos);
  EXPECT_EQ(log.find("serving stopped"), std::string::npos);
  // The replacement serves: two requests at once go to both attention workers.
  const std::string after = testing::run_capture(
      "node " + (source_dir() / "tests" / "server" / "openai_load.js").string() + " " +
      node_modules().string() + " " + s.url() + " " + model_dir().filename().string() + " " +
      std::to_string(kMaxTokens) + " '" + prompts[0] + "' '" + prompts[1] + "' 2>/dev/null");
  const Json a = Json::parse(after, nullptr, false);
  ASSERT_TRUE(a.is_object()) << after;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a["streams"][i]["text"], greedy[i]["text"]) << i;
  }
  EXPECT_EQ(s.stop(SIGTERM, std::chrono::seconds(30)), 0);
  if (HasFailure()) ADD_FAILURE() << "server stderr:\n" << log;
}

}  // namespace
}  // namespace msinfer
