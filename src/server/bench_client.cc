#include "msinfer/server/bench_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include "msinfer/server/http_server.h"

namespace msinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using bench_clock = std::chrono::steady_clock;

Status parse_base_url(const std::string& url, std::string* host, int* port) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return invalid_argument("--base-url must start with http:// (got '" + url + "')");
  std::string rest = url.substr(scheme.size());
  rest = rest.substr(0, rest.find('/'));
  // An IPv6 address is in brackets ("[::1]:8000"); its colons are not the port's.
  size_t host_end = 0;
  if (!rest.empty() && rest[0] == '[') {
    host_end = rest.find(']');
    if (host_end == std::string::npos)
      return invalid_argument("--base-url: no ']' after the IPv6 address in '" + url + "'");
  }
  size_t colon = rest.find(':', host_end);
  *host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (host_end > 0) {
    if (host_end + 1 != host->size())
      return invalid_argument("--base-url: bad port in '" + url + "'");
    *host = host->substr(1, host_end - 1);
  }
  *port = 80;
  if (colon != std::string::npos) {
    char* end = nullptr;
    const long p = std::strtol(rest.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || p < 1 || p > 65535)
      return invalid_argument("--base-url: bad port in '" + url + "'");
    *port = static_cast<int>(p);
  }
  if (host->empty()) return invalid_argument("--base-url: no host in '" + url + "'");
  return ok_status();
}

namespace {

// The non-empty string value of `"key":"` in compact JSON: true, false, or
// unknown (the key is not there in that form).
enum class Field { kNonEmpty, kEmpty, kAbsent };
Field compact_string_field(std::string_view data, std::string_view key_colon_quote) {
  const size_t at = data.find(key_colon_quote);
  if (at == std::string_view::npos) return Field::kAbsent;
  const size_t v = at + key_colon_quote.size();
  return v < data.size() && data[v] != '"' ? Field::kNonEmpty : Field::kEmpty;
}

}  // namespace

StreamEvent read_stream_event(std::string_view data) {
  StreamEvent e;
  if (data == "[DONE]") {
    e.done = true;
    return e;
  }
  // A token's chunk without an escaped quote: every quote delimits a string,
  // and a string followed by a colon is a key, so these patterns match keys.
  if (data.find("\\\"") == std::string_view::npos &&
      data.find("\"usage\":{") == std::string_view::npos &&
      data.find("\"error\"") == std::string_view::npos) {
    const Field text = compact_string_field(data, "\"text\":\"");
    const Field content = compact_string_field(data, "\"content\":\"");
    const Field reasoning = compact_string_field(data, "\"reasoning_content\":\"");
    if (text != Field::kAbsent || content != Field::kAbsent || reasoning != Field::kAbsent) {
      e.text = text == Field::kNonEmpty || content == Field::kNonEmpty ||
               reasoning == Field::kNonEmpty;
      return e;
    }
  }
  Json j = Json::parse(data, nullptr, false);
  if (!j.is_object()) return e;
  if (j.contains("error")) {
    e.error = j["error"].is_object() ? j["error"].value("message", std::string("error event"))
                                     : std::string("error event");
    return e;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    e.has_usage = true;
    e.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
    e.completion_tokens = j["usage"].value("completion_tokens", int64_t{0});
    const Json& details = j["usage"].value("prompt_tokens_details", Json());
    if (details.is_object()) e.cached_tokens = details.value("cached_tokens", int64_t{0});
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const Json& c = j["choices"][0];
    if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty())
      e.text = true;
    for (const char* key : {"content", "reasoning_content"}) {
      if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains(key) &&
          c["delta"][key].is_string() && !c["delta"][key].get<std::string>().empty()) {
        e.text = true;
      }
    }
  }
  return e;
}

namespace {

struct Run;

// One streaming request, on a kept-alive connection from the run's pool when
// one is idle, else on a new one.
class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(Run& run, size_t index, std::optional<tcp::socket> pooled);
  void start();

 private:
  void connect();
  void send();
  // `what` names the operation that failed ("write" or "read").
  void on_response(beast::error_code ec, const char* what);
  void fail(const std::string& what);
  void finish();
  size_t on_chunk(beast::string_view data);
  void on_event(std::string_view data);

  Run& run_;
  size_t index_;
  tcp::socket sock_;
  bool reused_;  // sock_ came from the pool: the server may have closed it meanwhile
  beast::flat_buffer buf_;
  // The parser keeps a reference to its chunk callback: it lives here.
  std::function<size_t(uint64_t, beast::string_view, beast::error_code&)> chunk_cb_;
  http::response_parser<http::string_body> parser_;
  std::string request_, sse_;
  bench_clock::time_point sent_, last_;
  bool first_ = true, done_ = false, finished_ = false;
};

struct Run {
  explicit Run(const OnlineBenchOptions& opts) : o(opts) {}
  const OnlineBenchOptions& o;
  net::io_context ioc{1};
  tcp::endpoint endpoint;
  // Connections whose last response ended with the server keeping them open:
  // the next request goes out on one of them (HTTP/1.1 keep-alive, as the
  // OpenAI clients and vLLM's benchmark do).
  std::vector<tcp::socket> idle;
  int64_t opened = 0;  // connections opened during the current phase

  // The current phase (the warm-up, then the measured run).
  const std::vector<BenchPrompt>* prompts = nullptr;
  bench_clock::time_point t0;
  std::vector<RequestResult> results;
  std::deque<size_t> ready;  // arrived, waiting for a concurrency slot
  int64_t in_flight = 0, max_in_flight = 0, done = 0;
  std::vector<std::unique_ptr<net::steady_timer>> timers;

  void launch(size_t i) {
    if (o.max_concurrency > 0 && in_flight >= o.max_concurrency) {
      ready.push_back(i);
      return;
    }
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    std::optional<tcp::socket> pooled;
    if (!idle.empty()) {
      pooled.emplace(std::move(idle.back()));
      idle.pop_back();
    }
    std::make_shared<Call>(*this, i, std::move(pooled))->start();
  }
  void completed() {
    --in_flight;
    ++done;
    if (!ready.empty()) {
      const size_t i = ready.front();
      ready.pop_front();
      launch(i);
    }
    if (done == static_cast<int64_t>(results.size())) ioc.stop();
  }
  // Runs `ps` to the end (or the timeout): all at once, or at the arrival
  // times of o.request_rate and o.burstiness when `timed`.
  void run_phase(const std::vector<BenchPrompt>& ps, bool timed);
};

Call::Call(Run& run, size_t index, std::optional<tcp::socket> pooled)
    : run_(run),
      index_(index),
      sock_(pooled ? std::move(*pooled) : tcp::socket(run.ioc)),
      reused_(pooled.has_value()) {
  parser_.body_limit(boost::none);
  const BenchPrompt& p = (*run.prompts)[index];
  const bool chat = run.o.endpoint.find("chat") != std::string::npos;
  Json body{{"max_tokens", p.output_len},
            {"ignore_eos", true},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"temperature", 0}};
  if (!run.o.model.empty()) body["model"] = run.o.model;
  if (chat) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", p.prompt}}});
  } else {
    body["prompt"] = p.prompt;
  }
  const std::string b = body.dump();
  request_ = "POST " + run.o.endpoint +
             " HTTP/1.1\r\nHost: " + url_authority(run.o.host, run.o.port) + "\r\n" +
             "Content-Type: application/json\r\n" +
             (run.o.api_key.empty() ? "" : "Authorization: Bearer " + run.o.api_key + "\r\n") +
             "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
  chunk_cb_ = [this](uint64_t, beast::string_view data, beast::error_code&) {
    return on_chunk(data);
  };
  parser_.on_chunk_body(chunk_cb_);
}

void Call::start() {
  sent_ = last_ = bench_clock::now();
  run_.results[index_].send_s = std::chrono::duration<double>(sent_ - run_.t0).count();
  if (reused_) {
    send();
  } else {
    connect();
  }
}

void Call::connect() {
  ++run_.opened;
  sock_.async_connect(run_.endpoint, [self = shared_from_this()](beast::error_code ec) {
    if (ec) return self->fail("connect: " + ec.message());
    beast::error_code ignored;
    self->sock_.set_option(tcp::no_delay(true), ignored);
    self->send();
  });
}

void Call::send() {
  auto self = shared_from_this();
  net::async_write(sock_, net::buffer(request_), [self](beast::error_code ec, size_t) {
    if (ec) return self->on_response(ec, "write");
    http::async_read(self->sock_, self->buf_, self->parser_,
                     [self](beast::error_code ec, size_t) { self->on_response(ec, "read"); });
  });
}

void Call::on_response(beast::error_code ec, const char* what) {
  if (ec && reused_ && !parser_.got_some()) {
    // A kept-alive connection the server closed while it sat in the pool
    // (its idle timeout): nothing of the request was answered, so it goes
    // again, once, on a new connection.
    reused_ = false;
    beast::error_code ignored;
    sock_.close(ignored);
    sock_ = tcp::socket(run_.ioc);
    buf_.clear();
    return connect();
  }
  RequestResult& r = run_.results[index_];
  r.http_status = static_cast<int>(parser_.get().result_int());
  if (ec && !(ec == http::error::end_of_stream && done_)) {
    return fail(std::string(what) + ": " + ec.message());
  }
  if (r.http_status != 200) {
    return fail("HTTP " + std::to_string(r.http_status) + ": " +
                parser_.get().body().substr(0, 200));
  }
  if (!done_) return fail("the stream ended without [DONE]");
  finish();
}

size_t Call::on_chunk(beast::string_view data) {
  sse_.append(data.data(), data.size());
  size_t from = 0, at;
  while ((at = sse_.find("\n\n", from)) != std::string::npos) {
    const std::string_view ev(sse_.data() + from, at - from);
    if (ev.substr(0, 6) == "data: ") on_event(ev.substr(6));
    from = at + 2;
  }
  sse_.erase(0, from);
  return data.size();
}

void Call::on_event(std::string_view data) {
  RequestResult& r = run_.results[index_];
  const StreamEvent e = read_stream_event(data);
  if (e.done) {
    done_ = true;
    return;
  }
  if (!e.error.empty()) {
    r.error = e.error;
    return;
  }
  if (e.has_usage) {
    r.prompt_tokens = e.prompt_tokens;
    r.output_tokens = e.completion_tokens;
    r.cached_tokens = e.cached_tokens;
  }
  if (!e.text) return;
  const auto now = bench_clock::now();
  if (first_) {
    r.ttft_s = std::chrono::duration<double>(now - sent_).count();
    first_ = false;
  } else {
    r.itl_s.push_back(std::chrono::duration<double>(now - last_).count());
  }
  last_ = now;
}

void Call::fail(const std::string& what) {
  if (finished_) return;
  finished_ = true;
  RequestResult& r = run_.results[index_];
  r.ok = false;
  if (r.error.empty()) r.error = what;
  beast::error_code ignored;
  sock_.close(ignored);
  run_.completed();
}

void Call::finish() {
  if (finished_) return;
  finished_ = true;
  RequestResult& r = run_.results[index_];
  r.e2e_s = std::chrono::duration<double>(bench_clock::now() - sent_).count();
  r.ok = r.error.empty();
  if (parser_.is_done() && parser_.keep_alive() && buf_.size() == 0) {
    run_.idle.push_back(std::move(sock_));
  } else {
    beast::error_code ignored;
    sock_.close(ignored);
  }
  run_.completed();
}

void Run::run_phase(const std::vector<BenchPrompt>& ps, bool timed) {
  prompts = &ps;
  results.assign(ps.size(), RequestResult{});
  ready.clear();
  timers.clear();
  in_flight = max_in_flight = done = opened = 0;
  // Arrival times: gamma gaps with shape `burstiness` and mean 1/rate (vLLM's).
  std::mt19937_64 rng(o.seed);
  const bool at_once = !timed || !(o.request_rate > 0) || std::isinf(o.request_rate);
  std::gamma_distribution<double> gap(o.burstiness,
                                      at_once ? 1.0 : 1.0 / (o.request_rate * o.burstiness));
  ioc.restart();
  t0 = bench_clock::now();
  double t = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i > 0 && !at_once) t += gap(rng);
    auto timer = std::make_unique<net::steady_timer>(
        ioc,
        t0 + std::chrono::duration_cast<bench_clock::duration>(std::chrono::duration<double>(t)));
    timer->async_wait([this, i](beast::error_code e) {
      if (!e) launch(i);
    });
    timers.push_back(std::move(timer));
  }
  ioc.run_for(o.timeout);
  for (auto& r : results) {
    if (!r.ok && r.error.empty()) r.error = "did not finish within the timeout";
  }
}

}  // namespace

StatusOr<OnlineBenchReport> run_online_bench(const OnlineBenchOptions& o) {
  if (o.prompts.empty()) return invalid_argument("no prompts");
  if (!(o.burstiness > 0)) return invalid_argument("--burstiness must be > 0");
  if (o.num_warmups < 0) return invalid_argument("--num-warmups must be >= 0");
  Run run{o};
  auto ip = resolve_host(o.host);
  if (!ip.ok()) return ip.status().with_context("--base-url");
  run.endpoint = tcp::endpoint(net::ip::make_address(*ip), static_cast<unsigned short>(o.port));
  OnlineBenchReport rep;
  if (o.num_warmups > 0) {
    // vLLM's warm-up: the first prompt, num_warmups times, under the same
    // concurrency limit; discarded. Its connections stay open for the run.
    run.run_phase(std::vector<BenchPrompt>(static_cast<size_t>(o.num_warmups), o.prompts[0]),
                  false);
    for (const auto& r : run.results) {
      if (!r.ok) return unavailable("a warm-up request failed: " + r.error);
    }
  }
  run.run_phase(o.prompts, true);
  rep.duration_s = std::chrono::duration<double>(bench_clock::now() - run.t0).count();
  rep.max_in_flight = run.max_in_flight;
  rep.connections_opened = run.opened;
  rep.results = std::move(run.results);
  return rep;
}

}  // namespace msinfer::server
