#include "msinfer/server/http_server.h"

#include <pthread.h>

#include <csignal>
#include <cstdio>

#include "internal/server_impl.h"
#include "internal/session.h"

namespace msinfer::server {
namespace {

// "fp_" and 12 hex digits of FNV-1a over what shapes the answers: the served
// model's name, vocabulary and length, and the deployment's kind.
std::string fingerprint_of(const ApiContext& ctx) {
  const std::string what = "msinfer|" + ctx.served_model_name + "|" + std::to_string(ctx.vocab) +
                           "|" + std::to_string(ctx.max_model_len) + "|" +
                           (ctx.disaggregated ? "disaggregated" : "co-located");
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : what) h = (h ^ c) * 1099511628211ull;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "fp_%012llx",
                static_cast<unsigned long long>(h & 0xffffffffffffull));
  return buf;
}

}  // namespace

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const ServerOptions& o, ApiContext ctx,
                                                        Metrics* metrics) {
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->ctx = std::move(ctx);
  impl->system_fingerprint = fingerprint_of(impl->ctx);
  impl->metrics = metrics;
  beast::error_code ec;
  auto ip = resolve_host(o.host);
  if (!ip.ok()) return ip.status().with_context("--host");
  const tcp::endpoint ep(net::ip::make_address(*ip), static_cast<unsigned short>(o.port));
  const std::string where = url_authority(*ip, o.port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.set_option(tcp::no_delay(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return Status(StatusCode::kUnavailable, "cannot listen on " + where + ": " + ec.message());
  if (o.io_uring) {
    std::string why;
    impl->sender = BatchSend::create(256, &why);
    if (!impl->sender) {
      std::fprintf(stderr, "msinfer: server: no io_uring (%s): one send() per stream and step\n",
                   why.c_str());
    }
  }
  impl->prompts = std::make_unique<PromptPool>(o.tokenizer_threads);
  impl->accept();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

StatusOr<std::string> resolve_host(const std::string& host) {
  if (host.empty()) return invalid_argument("no host given");
  beast::error_code ec;
  if (net::ip::make_address(host, ec); !ec) return host;
  // No flags: unlike asio's default (address_configured), a name's IPv6
  // address counts even where only loopback has IPv6.
  net::io_context ioc;
  const auto found = tcp::resolver(ioc).resolve(host, "", tcp::resolver::flags(), ec);
  if (ec) {
    return invalid_argument("'" + host + "' is neither an IP address nor a name this machine " +
                            "resolves (" + ec.message() + ")");
  }
  std::string first6;
  for (const auto& entry : found) {
    const net::ip::address a = entry.endpoint().address();
    if (a.is_v4()) return a.to_string();
    if (first6.empty()) first6 = a.to_string();
  }
  if (!first6.empty()) return first6;
  return invalid_argument("'" + host + "' resolves to no IP address");
}

HealthAnswer health_answer(const Scheduler* scheduler, bool draining) {
  if (scheduler == nullptr) return {503, Json{{"status", "loading"}}};
  const Scheduler::Health h = scheduler->health();
  Json body = Json::object();
  bool whole = true;
  if (h.workers) {
    auto role = [&](const runtime::RoleHealth& r) {
      whole = whole && r.live >= r.expected;
      return Json{{"live", r.live}, {"expected", r.expected}};
    };
    body["workers"] =
        Json{{"attention", role(h.workers->attention)}, {"expert", role(h.workers->expert)}};
    if (h.workers->prefill.expected > 0) body["workers"]["prefill"] = role(h.workers->prefill);
  }
  auto answer = [&](int status, const char* what) {
    body["status"] = what;
    return HealthAnswer{status, std::move(body)};
  };
  if (draining) return answer(503, "draining");
  if (!h.healthy) {
    body["error"] = h.failure;
    return answer(503, "failed");
  }
  if (h.workers && h.workers->stopped) {
    // The router stopped; the engine thread is about to find it (the same
    // failure, in a moment the log line and the error answers).
    body["error"] = h.workers->error;
    return answer(503, "failed");
  }
  if (h.workers && h.workers->recovering) return answer(503, "recovering");
  return answer(200, whole ? "ok" : "degraded");
}

std::string url_authority(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void HttpServer::run() {
  // Named so that tools (top -H, scripts/bench-serve-overhead) can tell the
  // HTTP loop's CPU time from the engine's.
  ::pthread_setname_np(::pthread_self(), "msinfer-http");
  impl_->run_loop();
  impl_->end_loop();
}

void HttpServer::set_scheduler(Scheduler* s) { impl_->scheduler = s; }

void HttpServer::set_draining() { impl_->draining = true; }

void HttpServer::stop() {
  net::post(impl_->ioc, [impl = impl_.get()] {
    // What the engine thread handed over before stop() (the errors of the
    // requests a failure or the drain's end cut off) goes out first.
    impl->poll_rounds();
    beast::error_code ec;
    impl->acceptor.close(ec);
    if (impl->signals) impl->signals->cancel(ec);
    impl->stopping = true;
    for (auto& w : impl->sessions) {
      if (auto s = w.lock()) s->close_when_flushed();
    }
    impl->sessions.clear();
    if (impl->connections.load() == 0) {
      impl->ioc.stop();
      return;
    }
    // A client that does not read its last bytes gets 5 s.
    impl->stop_timer.emplace(impl->ioc, std::chrono::seconds(5));
    impl->stop_timer->async_wait([impl](beast::error_code) { impl->ioc.stop(); });
  });
}

void HttpServer::on_signal(std::function<void(int)> f) {
  Impl* impl = impl_.get();
  impl->signals.emplace(impl->ioc, SIGINT, SIGTERM);
  struct Waiter {
    Impl* impl;
    std::function<void(int)> f;
    void operator()(beast::error_code ec, int sig) {
      if (ec) return;
      f(sig);
      impl->signals->async_wait(Waiter{impl, f});
    }
  };
  impl->signals->async_wait(Waiter{impl, std::move(f)});
}

int64_t HttpServer::connections() const { return impl_->connections.load(); }

}  // namespace msinfer::server
