// `msinfer serve` against hostile clients (issue 43), over real sockets: a
// body whose fields have the wrong JSON types, a client that pipelines
// `Expect: 100-continue` and never reads, a prompt that takes seconds to
// tokenize, floods of connections and of header fields. Throughout each
// attack a probe thread asks /health over its own connection; the server
// must answer it promptly, stay alive, and give its memory back.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/loopback_http.h"
#include "../common/serve_process.h"
#include "msinfer/core/json.h"

namespace msinfer {
namespace {

using namespace std::chrono_literals;
using testing::clock_type;
using testing::curl;
using testing::model_dir;
using testing::post;
using testing::Server;

// A health probe that stalls by this much means the event loop was blocked
// (the defects this file guards against held it for 7 s to forever). Generous
// for sanitizer builds on a loaded 2-core VM; the probe prints the worst
// latency it saw.
constexpr auto kHealthBound = 1000ms;

// A connection to 127.0.0.1:port from source address `from`.
int connect_from(const char* from, int port) { return testing::connect_loopback(port, 0, from); }

// True when the server closed `fd` within `wait` (nothing else is expected on it).
bool closed_by_server(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// GET /health on a connection of its own: the latency of a 200, or -1.
std::chrono::milliseconds health_latency(int port) {
  const auto t0 = clock_type::now();
  const int fd = testing::send_request(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  if (fd < 0) return std::chrono::milliseconds(-1);
  const std::string got = testing::read_from(fd, 10s, "\r\n\r\n{");
  ::close(fd);
  if (got.rfind("HTTP/1.1 200", 0) != 0) return std::chrono::milliseconds(-1);
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0);
}

// Asks /health every 20 ms on its own thread until stopped.
class HealthProbe {
 public:
  explicit HealthProbe(int port)
      : thread_([this, port] {
          while (!stop_) {
            const auto l = health_latency(port);
            if (l.count() < 0) {
              ++failures_;
            } else {
              worst_ = std::max<int64_t>(worst_, l.count());
            }
            ++probes_;
            std::this_thread::sleep_for(20ms);
          }
        }) {}
  ~HealthProbe() { finish(); }
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Checks every probe got its 200 in time.
  void expect_healthy(const char* during) {
    finish();
    std::printf("health during %s: %lld probes, worst %lld ms, %lld failed\n", during,
                static_cast<long long>(probes_.load()), static_cast<long long>(worst_.load()),
                static_cast<long long>(failures_.load()));
    EXPECT_GT(probes_.load(), 0) << during;
    EXPECT_EQ(failures_.load(), 0) << during;
    EXPECT_LT(worst_.load(), kHealthBound.count()) << during;
  }
  int64_t probes() const { return probes_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> probes_{0}, failures_{0}, worst_{0};
  std::thread thread_;
};

class ServeHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(model_dir() / "config.json")) << "make-model failed";
  }
};

TEST_F(ServeHostileTest, FieldsOfTheWrongTypeAre400sNotACrash) {
  Server s("--api-key k3y");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string auth = "-H 'Content-Type: application/json' -H 'Authorization: Bearer k3y'";
  // Each used to throw nlohmann::type_error out of the handler: SIGABRT.
  const std::vector<std::pair<std::string, std::string>> completions{
      {R"({"prompt": "hi", "response_format": {"type": 1}})", "response_format"},
      {R"({"prompt": "hi", "response_format": {"type": null}})", "response_format"},
      {R"({"prompt": "hi", "response_format": []})", "response_format"},
      // prompt + max_tokens used to overflow (UBSan) before a later check.
      {R"({"prompt": "hi", "max_tokens": 9223372036854775807})", "max_tokens"},
  };
  for (const auto& [body, param] : completions) {
    auto r = post(s, "/v1/completions", body, auth);
    EXPECT_EQ(r.status, 400) << body << ": " << r.body;
    EXPECT_NE(r.body.find("\"param\":\"" + param + "\""), std::string::npos) << r.body;
  }
  for (const char* type : {"1", "null", "[]", "{}", "true"}) {
    const std::string body = std::string(R"({"messages": [{"role": "user", "content": [{"type": )") +
                             type + R"(, "text": "x"}]}], "max_tokens": 2})";
    auto r = post(s, "/v1/chat/completions", body, auth);
    EXPECT_EQ(r.status, 400) << body << ": " << r.body;
    EXPECT_NE(r.body.find("messages[0].content"), std::string::npos) << r.body;
  }
  // null means the default (docs/SERVING.md), for max_tokens as for the rest.
  auto ok = post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": null, "temperature": 0})",
                 auth);
  EXPECT_EQ(ok.status, 200) << ok.body;
  // The scheme is case-insensitive (RFC 9110); the key is not.
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 1})",
                 "-H 'Content-Type: application/json' -H 'Authorization: bearer k3y'")
                .status,
            200);
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 1})",
                 "-H 'Content-Type: application/json' -H 'Authorization: Bearer K3Y'")
                .status,
            401);
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hi", "max_tokens": 1})",
                 "-H 'Content-Type: application/json' -H 'Authorization: Bearer k3y2'")
                .status,
            401);
  EXPECT_EQ(curl(s.url() + "/health").status, 200);
  EXPECT_EQ(::kill(s.pid(), 0), 0) << "the server died: " << s.stderr_text();
}

TEST_F(ServeHostileTest, ExpectContinueFromAClientThatNeverReadsStallsNoOne) {
  Server s("--max-pending-kb 64");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // Pipelined requests, each with Expect: 100-continue, from a client with a
  // tiny receive window that never reads: the server's answers (a 100
  // Continue and a 400 each) fill the socket. The 100 Continue used to be a
  // blocking write on the event loop's only thread.
  const int fd = testing::connect_loopback(s.port(), /*rcvbuf=*/4096);
  ASSERT_GE(fd, 0);
  const std::string one =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}";
  std::string burst;
  for (int i = 0; i < 64; ++i) burst += one;
  HealthProbe probe(s.port());
  std::atomic<bool> stop{false};
  std::thread attacker([&] {
    // Until the server cuts it off or the probe has seen enough.
    while (!stop) {
      const ssize_t n = ::send(fd, burst.data(), burst.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
      std::this_thread::sleep_for(1ms);
    }
  });
  const auto until = clock_type::now() + 3s;
  while (clock_type::now() < until) std::this_thread::sleep_for(50ms);
  stop = true;
  attacker.join();
  probe.expect_healthy("a pipelining Expect: 100-continue client that never reads");
  ::close(fd);
  EXPECT_EQ(::kill(s.pid(), 0), 0) << "the server died: " << s.stderr_text();
}

// Text that a byte-level or SentencePiece BPE tokenizes slowly: one word (no
// spaces) of varied letters, so every merge pass rescans it.
std::string slow_word(size_t bytes) {
  std::mt19937 rng(7);
  std::string s;
  s.reserve(bytes);
  while (s.size() < bytes) s += static_cast<char>('a' + rng() % 26);
  return s;
}

TEST_F(ServeHostileTest, TokenizingALongPromptDelaysNoOnesHealth) {
  Server s("--max-body-kb 8192 --max-prompt-bytes 4194304 --tokenize-timeout 300");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  const std::string body = "{\"prompt\": \"" + slow_word(1 << 20) + "\", \"max_tokens\": 1}";
  HealthProbe probe(s.port());
  std::atomic<bool> answered{false};
  int64_t probes_before_answer = 0;
  testing::HttpResult r;
  std::thread client([&] {
    r = post(s, "/v1/completions", body);
    answered = true;
  });
  while (!answered) std::this_thread::sleep_for(10ms);
  probes_before_answer = probe.probes();
  client.join();
  probe.expect_healthy("the tokenization of a 1 MiB one-word prompt");
  // Tokenized (in seconds), then refused as longer than the context.
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("maximum context length"), std::string::npos) << r.body;
  // The probes ran while the prompt was being tokenized, not only after.
  EXPECT_GE(probes_before_answer, 3) << "the prompt was tokenized too fast to show anything";
}

TEST_F(ServeHostileTest, LongPromptsAreRefusedBeforeTokenizationOrAtTheDeadline) {
  // By default a prompt is capped in bytes (32 per token of the context).
  {
    Server s("");
    ASSERT_GT(s.port(), 0) << s.stderr_text();
    const auto t0 = clock_type::now();
    auto r = post(s, "/v1/completions", "{\"prompt\": \"" + slow_word(1 << 20) + "\"}");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("--max-prompt-bytes"), std::string::npos) << r.body;
    std::printf("refused a 1 MiB prompt in %.3f s\n",
                std::chrono::duration<double>(clock_type::now() - t0).count());
    auto chat = post(s, "/v1/chat/completions",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"" + slow_word(1 << 20) +
                         "\"}]}");
    EXPECT_EQ(chat.status, 400) << chat.body;
    EXPECT_NE(chat.body.find("\"param\":\"messages\""), std::string::npos) << chat.body;
  }
  // A prompt that does not tokenize by --tokenize-timeout is refused.
  Server s("--max-body-kb 8192 --max-prompt-bytes 4194304 --tokenize-timeout 0.05");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  auto r = post(s, "/v1/completions", "{\"prompt\": \"" + slow_word(1 << 20) + "\"}");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("--tokenize-timeout"), std::string::npos) << r.body;
  // Ordinary prompts go on being served.
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hello there", "max_tokens": 2})").status,
            200);
}

// An operator's chat template that does too much (issue 43: a fuzzed one
// rendered for minutes and held 1.8 GB) fails each chat request with a 400
// naming the render's step limit, rendered on the prompt pool: /health is
// answered throughout, and the server goes on serving.
TEST_F(ServeHostileTest, AnExpensiveChatTemplateFailsItsRequestsAndStallsNoOne) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("msinfer-expensive-template-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(model_dir())) {
    if (e.path().filename() != "chat_template.jinja") {
      fs::create_symlink(e.path(), dir / e.path().filename());
    }
  }
  // 10^10 iterations: only the step limit ends it (the deadline is far).
  std::ofstream(dir / "chat_template.jinja")
      << "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
         "{{ messages[0].content }}";
  Server s("--tokenize-timeout 300", dir);
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  HealthProbe probe(s.port());
  auto chat = post(s, "/v1/chat/completions",
                   R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})");
  probe.expect_healthy("the render of a template past its step limit");
  EXPECT_EQ(chat.status, 400) << chat.body;
  EXPECT_NE(chat.body.find("chat template: the template ran past its step limit"),
            std::string::npos)
      << chat.body;
  EXPECT_NE(chat.body.find("\"param\":\"messages\""), std::string::npos) << chat.body;
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "hello", "max_tokens": 2})").status, 200);
  EXPECT_EQ(::kill(s.pid(), 0), 0) << "the server died: " << s.stderr_text();
  fs::remove_all(dir);
}

TEST_F(ServeHostileTest, OneClientCannotTakeEveryConnection) {
  Server s("--max-connections 16 --max-connections-per-client 6");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // One client (127.0.0.2) opens 10 idle connections: its first 6 stay, the
  // rest are closed at once.
  std::vector<int> first;
  for (int i = 0; i < 10; ++i) first.push_back(connect_from("127.0.0.2", s.port()));
  int cut = 0;
  for (int fd : first) {
    ASSERT_GE(fd, 0);
    cut += closed_by_server(fd, 500ms) ? 1 : 0;
  }
  EXPECT_EQ(cut, 4);
  // Two more clients fill the server to its cap with idle connections.
  std::vector<int> more;
  for (const char* from : {"127.0.0.3", "127.0.0.4"}) {
    for (int i = 0; i < 5; ++i) more.push_back(connect_from(from, s.port()));
  }
  // Another client is still served: an idle connection makes room for it.
  HealthProbe probe(s.port());
  std::this_thread::sleep_for(300ms);
  probe.expect_healthy("16 idle connections from three clients at a cap of 16");
  int evicted = 0;
  for (int fd : first) evicted += closed_by_server(fd, 10ms) ? 1 : 0;
  for (int fd : more) evicted += closed_by_server(fd, 10ms) ? 1 : 0;
  EXPECT_GE(evicted - cut, 1);
  for (int fd : first) ::close(fd);
  for (int fd : more) ::close(fd);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

TEST_F(ServeHostileTest, HeaderFloodsAre431AndTheirMemoryComesBack) {
  Server s("");
  ASSERT_GT(s.port(), 0) << s.stderr_text();
  // 25,000 short fields, 200 KB: every field was under the per-field limit.
  std::string flood = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 25000; ++i) flood += "a" + std::to_string(i % 10) + ": b\r\n";
  flood += "\r\n";
  bool closed = false;
  const std::string got = testing::raw_exchange(s.port(), flood, 10s, &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 431", 0), 0u) << got.substr(0, 200);
  // 200 connections that each send up to 256 KB of short fields and never
  // end them (their fields used to be taken without limit: 1.4 MB of memory
  // each), then go: the server's memory comes back to where it was.
  ASSERT_EQ(curl(s.url() + "/health").status, 200);
  const int64_t before = testing::rss_of(s.pid());
  std::string part = "GET /health HTTP/1.1\r\nHost: x\r\n";
  while (part.size() < (256 << 10)) part += "x: 0\r\n";
  std::vector<int> fds;
  HealthProbe probe(s.port());
  for (int i = 0; i < 200; ++i) {
    const int fd = testing::connect_loopback(s.port());
    if (fd < 0) continue;
    ::send(fd, part.data(), part.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // what the kernel takes
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);
  const int64_t during = testing::rss_of(s.pid());
  probe.expect_healthy("200 connections with 256 KB of header fields each");
  for (int fd : fds) ::close(fd);
  int64_t after = testing::rss_of(s.pid());
  const auto deadline = clock_type::now() + 15s;
  while (after > before + (16 << 20) && clock_type::now() < deadline) {
    std::this_thread::sleep_for(200ms);
    after = testing::rss_of(s.pid());
  }
  std::printf("server RSS: %lld MiB before, %lld during, %lld after\n",
              static_cast<long long>(before >> 20), static_cast<long long>(during >> 20),
              static_cast<long long>(after >> 20));
  EXPECT_LT(during, before + (64 << 20));
  // AddressSanitizer keeps freed memory in its quarantine (up to 256 MiB) on
  // purpose, so there the check is that nothing near 200 x 1.4 MB was kept;
  // that it all comes back is checked without it (the `plain` run of this
  // test, tests/server/CMakeLists.txt).
  EXPECT_LT(after, before + ((kAddressSanitizer ? 64 : 16) << 20));
}

}  // namespace
}  // namespace msinfer
