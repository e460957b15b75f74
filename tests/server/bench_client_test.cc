// The online benchmark client's connections: kept-alive ones carry the next
// request, warm-up requests open them before the measured run, one the server
// closed while idle is replaced and its request sent again, and a server that
// says `Connection: close` gets a new connection per request. Against a small
// scripted HTTP server on loopback, so that each behaviour can be forced.
// And how --base-url names its server (names, IPv6 in brackets).
#include "msinfer/server/bench_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <mutex>
#include <thread>

#include "msinfer/server/http_server.h"

namespace msinfer::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

enum class Mode {
  kKeepAlive,      // answers every request on a connection until the client closes it
  kCloseWhenIdle,  // says keep-alive, then closes after each answer (an idle timeout at once)
  kSayClose,       // answers with Connection: close and closes
  kRefuse,         // 503 to everything
};

// Streams three tokens (with usage and [DONE]) for each request.
class ScriptedServer {
 public:
  explicit ScriptedServer(Mode mode)
      : mode_(mode), acceptor_(ioc_, {net::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    accepting_ = std::thread([this] { accept_loop(); });
  }
  ~ScriptedServer() {
    // A blocking accept is not woken by closing its socket: a last connection is.
    stopping_ = true;
    beast::error_code ignored;
    tcp::socket wake(ioc_);
    wake.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)}, ignored);
    accepting_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : connections_) t.join();
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }
  int requests() const { return requests_; }

 private:
  void accept_loop() {
    for (;;) {
      tcp::socket sock(ioc_);
      beast::error_code ec;
      acceptor_.accept(sock, ec);
      if (ec || stopping_) return;
      ++accepted_;
      std::lock_guard<std::mutex> lock(mu_);
      connections_.emplace_back([this, s = std::move(sock)]() mutable { serve(std::move(s)); });
    }
  }

  void serve(tcp::socket sock) {
    beast::flat_buffer buf;
    for (;;) {
      http::request<http::string_body> req;
      beast::error_code ec;
      http::read(sock, buf, req, ec);
      if (ec) return;  // the client closed the connection
      ++requests_;
      std::string out;
      if (mode_ == Mode::kRefuse) {
        const std::string body = R"({"error":{"message":"no"}})";
        out =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Content-Length: " +
            std::to_string(body.size()) + "\r\n\r\n" + body;
      } else {
        out =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n";
        out += mode_ == Mode::kSayClose ? "Connection: close\r\n\r\n"
                                        : "Connection: keep-alive\r\n\r\n";
        std::string events;
        for (const char* t : {"a", "b", "c"})
          events += std::string(R"(data: {"choices":[{"index":0,"text":")") + t + "\"}]}\n\n";
        events += R"(data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}})"
                  "\n\ndata: [DONE]\n\n";
        char size[16];
        std::snprintf(size, sizeof size, "%zx\r\n", events.size());
        out += size + events + "\r\n0\r\n\r\n";
      }
      net::write(sock, net::buffer(out), ec);
      if (ec || mode_ == Mode::kCloseWhenIdle || mode_ == Mode::kSayClose) {
        sock.shutdown(tcp::socket::shutdown_both, ec);
        return;
      }
    }
  }

  Mode mode_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  std::atomic<int> accepted_{0}, requests_{0};
  std::atomic<bool> stopping_{false};
  std::thread accepting_;
  std::mutex mu_;
  std::vector<std::thread> connections_;
};

OnlineBenchOptions options(const ScriptedServer& s, int prompts, int concurrency, int warmups) {
  OnlineBenchOptions o;
  o.port = s.port();
  o.max_concurrency = concurrency;
  o.num_warmups = warmups;
  o.timeout = std::chrono::seconds(30);
  for (int i = 0; i < prompts; ++i) {
    BenchPrompt p;
    p.prompt = "hello " + std::to_string(i);
    p.output_len = 3;
    o.prompts.push_back(p);
  }
  return o;
}

void expect_all_complete(const OnlineBenchReport& rep, size_t n) {
  ASSERT_EQ(rep.results.size(), n);
  for (const auto& r : rep.results) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 3);
    EXPECT_EQ(r.itl_s.size(), 2u);
  }
}

// A run of `prompts` requests, 2 at a time, after `warmups`, against a
// server in `mode`: every request completes, and the run opened, and the
// server accepted and answered, as many connections and requests as said.
struct Expected {
  int64_t opened;  // connections opened by the measured run
  int accepted, requests;
};
void expect_run(Mode mode, int prompts, int warmups, Expected want) {
  ScriptedServer s(mode);
  auto rep = run_online_bench(options(s, prompts, 2, warmups));
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  expect_all_complete(*rep, static_cast<size_t>(prompts));  // the warm-ups are not in it
  EXPECT_EQ(rep->connections_opened, want.opened);
  EXPECT_EQ(s.accepted(), want.accepted);
  EXPECT_EQ(s.requests(), want.requests);
}

TEST(BaseUrlTest, HostsPortsAndIpv6Brackets) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(parse_base_url("http://[::1]:8000/v1", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 8000);
  ASSERT_TRUE(parse_base_url("http://[fe80::1]", &host, &port).ok());
  EXPECT_EQ(host, "fe80::1");
  EXPECT_EQ(port, 80);
  ASSERT_TRUE(parse_base_url("http://localhost:8001", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 8001);
  EXPECT_FALSE(parse_base_url("http://[::1:8000", &host, &port).ok());
  EXPECT_FALSE(parse_base_url("http://[::1]x:8000", &host, &port).ok());
  EXPECT_FALSE(parse_base_url("http://::1:8000", &host, &port).ok());  // brackets needed
  EXPECT_FALSE(parse_base_url("http://localhost:0", &host, &port).ok());
  EXPECT_EQ(url_authority("::1", 8000), "[::1]:8000");
  EXPECT_EQ(url_authority("127.0.0.1", 80), "127.0.0.1:80");
  // Addresses pass as they are; a name resolves (its IPv4 address first).
  EXPECT_EQ(resolve_host("::1").value(), "::1");
  EXPECT_EQ(resolve_host("10.1.2.3").value(), "10.1.2.3");
  const auto local = resolve_host("localhost");
  ASSERT_TRUE(local.ok()) << local.status().message();
  EXPECT_TRUE(*local == "127.0.0.1" || *local == "::1") << *local;
  EXPECT_FALSE(resolve_host("").ok());
}

TEST(BenchClientTest, KeptAliveConnectionsCarryTheNextRequests) {
  expect_run(Mode::kKeepAlive, 6, 0, {2, 2, 6});  // two at once, each then reused
}

TEST(BenchClientTest, WarmUpsOpenTheRunsConnections) {
  expect_run(Mode::kKeepAlive, 6, 4, {0, 2, 4 + 6});
}

// Every request after the first two finds its pooled connection closed and
// goes again on a new one: each is answered once.
TEST(BenchClientTest, AConnectionClosedWhileIdleIsReplaced) {
  expect_run(Mode::kCloseWhenIdle, 6, 2, {6, 2 + 6, 2 + 6});
}

TEST(BenchClientTest, ConnectionCloseIsHonoured) { expect_run(Mode::kSayClose, 5, 0, {5, 5, 5}); }

TEST(BenchClientTest, AFailedWarmUpStopsTheRun) {
  ScriptedServer s(Mode::kRefuse);
  auto rep = run_online_bench(options(s, 4, 2, 1));
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(rep.status().message().find("HTTP 503"), std::string::npos) << rep.status().to_string();
  EXPECT_EQ(s.requests(), 1);  // the run's requests were never sent
  // Without warm-ups the refusals are the run's failed requests.
  auto run = run_online_bench(options(s, 4, 2, 0));
  ASSERT_TRUE(run.ok());
  for (const auto& r : run->results) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.http_status, 503);
  }
}

}  // namespace
}  // namespace msinfer::server
