// The routes: a table from method and path to the handler of each endpoint
// (health, metrics, models, completions, chat), the API key check for the
// /v1 ones, and the answers the table itself gives (404, 401, 405).
#include <algorithm>
#include <mutex>
#include <string_view>
#include <utility>

#include "internal/http_wire.h"
#include "internal/session.h"

namespace msinfer::server {
namespace {

// Compares in time that does not depend on where the strings differ (an
// API key must not be found a byte at a time by timing the answers).
bool equal_constant_time(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// "Authorization: Bearer KEY" with the scheme in any case (RFC 9110: auth
// schemes are case-insensitive) and the key compared in constant time.
bool bearer_matches(beast::string_view field, const std::string& key) {
  std::string_view header(field.data(), field.size());
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() < kScheme.size() ||
      !beast::iequals(beast::string_view(header.data(), kScheme.size()),
                      beast::string_view(kScheme.data(), kScheme.size()))) {
    return false;
  }
  header.remove_prefix(kScheme.size());
  while (!header.empty() && header.front() == ' ') header.remove_prefix(1);
  return equal_constant_time(header, key);
}

// %XX escapes of a URL path segment decoded; anything malformed kept as is.
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// GET /health (health_answer).
void health(Session& s, const Request&, const std::string&) {
  HttpServer::Impl& srv = s.server();
  const HealthAnswer h = health_answer(srv.scheduler.load(), srv.draining);
  s.respond_json(h.status, h.body);
}

// What GET /metrics reports beside the Metrics' own counters: connections,
// the loop's CPU time and wake-ups, the scheduler's snapshot and the
// workers' health. Event-loop thread (its CPU clock is the loop's).
Metrics::Gauges metrics_gauges(HttpServer::Impl& srv) {
  Metrics::Gauges g;
  g.connections = srv.connections.load();
  // This runs on the loop's thread: its own CPU clock, in ns (what
  // scripts/bench-serve-overhead reads; /proc counts 10 ms ticks).
  // Less the time spent polling for a round (--busy-poll-us, anticipation).
  g.http_loop_cpu_s = thread_cpu_s() - srv.poll_wait_cpu_s;
  g.http_batched_writes = srv.batched_writes;
  {
    std::lock_guard<std::mutex> l(srv.rounds_mu);
    g.http_loop_wakeups = srv.wakeups;
    g.http_engine_waits = srv.engine_waits;
  }
  g.http_batch_submits = srv.sender ? srv.sender->submits() : 0;
  if (Scheduler* s = srv.scheduler.load()) {
    auto snap = s->snapshot();
    g.running = snap.running;
    g.waiting = snap.waiting;
    g.kv_usage = snap.kv_usage;
    g.preemptions = snap.counters.preemptions;
    g.prefix_queries = snap.counters.prefix_queries;
    g.prefix_hits = snap.counters.prefix_hits;
    g.engine_busy_s = snap.engine_busy_s;
    g.engine_step_s = snap.engine_step_s;
    g.engine_steps = snap.engine_steps;
    g.workers = std::move(snap.workers);
    g.routing = std::move(snap.routing);
    if (const auto h = s->health().workers) {
      for (const auto& [role, r] :
           {std::pair{"attention", h->attention}, std::pair{"expert", h->expert},
            std::pair{"prefill", h->prefill}}) {
        if (r.expected == 0) continue;  // no prefill workers
        g.roles.push_back({role, r.live, r.expected, r.deaths, r.restarts});
      }
      if (h->prefill.expected > 0) {
        g.kv_transfers = Metrics::Gauges::KvTransfers{h->kv_transfers, h->kv_transfer_bytes,
                                                      h->kv_transfer_fallbacks};
      }
    }
  }
  return g;
}

// GET /metrics: Prometheus text.
void metrics(Session& s, const Request&, const std::string&) {
  Metrics::Gauges g = metrics_gauges(s.server());
  s.respond(200, "text/plain; version=0.0.4; charset=utf-8", s.server().metrics->render(g));
}

constexpr std::string_view kModelPrefix = "/v1/models/";

// The one model this server serves, as /v1/models lists it.
Json model_card(const HttpServer::Impl& srv) {
  return Json{{"id", srv.ctx.served_model_name},
              {"object", "model"},
              {"created", static_cast<int64_t>(srv.created)},
              {"owned_by", "msinfer"},
              {"root", srv.ctx.served_model_name},
              {"max_model_len", srv.ctx.max_model_len}};
}

// GET /v1/models.
void models(Session& s, const Request&, const std::string&) {
  s.respond_json(200, {{"object", "list"}, {"data", Json::array({model_card(s.server())})}});
}

// GET /v1/models/{id}: the id percent-decoded (an id may hold '/').
void one_model(Session& s, const Request&, const std::string& target) {
  const HttpServer::Impl& srv = s.server();
  const std::string id = percent_decode(target.substr(kModelPrefix.size()));
  if (id == srv.ctx.served_model_name) return s.respond_json(200, model_card(srv));
  ApiError e = error_of(404, "NotFoundError",
                        "the model '" + id + "' does not exist (this server serves '" +
                            srv.ctx.served_model_name + "')");
  e.param = "model";
  s.respond_error(e);
}

// POST /v1/completions and /v1/chat/completions.
void completions(Session& s, const Request& req, const std::string&) {
  s.begin_generation(req, /*chat=*/false);
}
void chat_completions(Session& s, const Request& req, const std::string&) {
  s.begin_generation(req, /*chat=*/true);
}

// A route: the path (exactly, or with `prefix` what the path starts with and
// goes on after), the one method it takes, whether it is an API route (the
// API key, when the server has one, is checked before the method) and its
// handler. A path no route has is 404; another method on a route's path is
// 405 with Allow naming the route's.
using Handler = void (*)(Session& s, const Request& req, const std::string& target);
struct Route {
  std::string_view path;
  bool prefix;
  http::verb method;
  const char* allow;
  bool api;
  Handler handler;
};
constexpr Route kRoutes[] = {
    {"/health", false, http::verb::get, "GET", false, health},
    {"/metrics", false, http::verb::get, "GET", false, metrics},
    {"/v1/models", false, http::verb::get, "GET", true, models},
    {kModelPrefix, true, http::verb::get, "GET", true, one_model},
    {"/v1/completions", false, http::verb::post, "POST", true, completions},
    {"/v1/chat/completions", false, http::verb::post, "POST", true, chat_completions},
};

const Route* find_route(const std::string& target) {
  for (const Route& r : kRoutes) {
    if (r.prefix ? target.size() > r.path.size() && target.compare(0, r.path.size(), r.path) == 0
                 : target == r.path) {
      return &r;
    }
  }
  return nullptr;
}

}  // namespace

void Session::handle(Request req) {
  keep_alive_ = req.keep_alive();
  std::string target(req.target());
  if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
  const Route* route = find_route(target);
  if (route == nullptr) {
    return respond_error(error_of(404, "NotFoundError",
                                  "no route " + std::string(req.method_string()) + " " + target));
  }
  if (route->api && !srv_.options.api_key.empty() &&
      !bearer_matches(req[http::field::authorization], srv_.options.api_key)) {
    ApiError e = error_of(401, "authentication_error",
                          "missing or wrong API key (Authorization: Bearer KEY)");
    return respond_error(e, false, "WWW-Authenticate: Bearer\r\n");
  }
  if (req.method() != route->method) {
    return respond_error(
        error_of(405, "invalid_request_error",
                 std::string(req.method_string()) + " is not allowed on " + target),
        false, std::string("Allow: ") + route->allow + "\r\n");
  }
  route->handler(*this, req, target);
}

}  // namespace msinfer::server
