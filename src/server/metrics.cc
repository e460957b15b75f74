#include "msinfer/server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "msinfer/core/process.h"

namespace msinfer::server {

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}

void header(std::ostringstream& o, const std::string& name, const char* type, const char* help) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

// The standard process_* family, as the Prometheus client libraries write it
// (no labels: every exporter's process metrics join on the target's own).
void render_process(std::ostringstream& o) {
  auto p = read_process_stats();
  if (!p.ok()) return;
  auto one = [&](const char* name, const char* type, const char* help, const std::string& v) {
    header(o, name, type, help);
    o << name << " " << v << "\n";
  };
  one("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
      num(p->cpu_seconds));
  one("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
      std::to_string(p->resident_bytes));
  one("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
      std::to_string(p->virtual_bytes));
  one("process_open_fds", "gauge", "Number of open file descriptors.", std::to_string(p->open_fds));
  one("process_max_fds", "gauge", "Maximum number of open file descriptors.",
      p->max_fds < 0 ? std::string("+Inf") : std::to_string(p->max_fds));
  one("process_start_time_seconds", "gauge",
      "Start time of the process since unix epoch in seconds.", [&] {
        char b[64];  // to the tick (%.9g would round to 10 s)
        std::snprintf(b, sizeof(b), "%.2f", p->start_time_seconds);
        return std::string(b);
      }());
}

// The deployment's workers by role (docs/RUNTIME.md, "Failures").
void render_roles(std::ostringstream& o, const std::string& l, const Metrics::Gauges& g) {
  auto by_role = [&](const std::string& name, const char* type, const char* help,
                     int64_t Metrics::Gauges::Role::*field) {
    header(o, name, type, help);
    for (const auto& r : g.roles) {
      o << name << "{" << l << ",role=\"" << r.role << "\"} " << r.*field << "\n";
    }
  };
  by_role("msinfer:worker_deaths_total", "counter",
          "Workers of the deployment that died (one of their processes exited or was killed).",
          &Metrics::Gauges::Role::deaths);
  by_role("msinfer:worker_restarts_total", "counter",
          "Workers started in place of dead ones: a replacement (--respawn), or every worker "
          "of a restart.",
          &Metrics::Gauges::Role::restarts);
  by_role("msinfer:workers_live", "gauge", "Workers serving now.", &Metrics::Gauges::Role::live);
  by_role("msinfer:workers_expected", "gauge", "Workers the deployment was started with.",
          &Metrics::Gauges::Role::expected);
}

// The disaggregated runtime's own, per worker (since the server started);
// the processes of a tensor-parallel group differ by tp_rank.
void render_workers(std::ostringstream& o, const std::string& l, const std::vector<Json>& workers) {
  const auto tp_label = [](const Json& w) {
    return w.contains("tp_rank") ? ",tp_rank=\"" + std::to_string(w.value("tp_rank", 0)) + "\""
                                 : std::string();
  };
  header(o, "msinfer:worker_busy_fraction", "gauge", "Fraction of time a worker computes.");
  for (const auto& w : workers) {
    o << "msinfer:worker_busy_fraction{" << l << ",role=\"" << w.value("role", "") << "\",index=\""
      << w.value("index", 0) << "\"" << tp_label(w) << "} " << num(w.value("busy_fraction", 0.0))
      << "\n";
  }
  header(o, "msinfer:worker_network_wait_fraction", "gauge",
         "Fraction of time a worker waits on the network.");
  for (const auto& w : workers) {
    o << "msinfer:worker_network_wait_fraction{" << l << ",role=\"" << w.value("role", "")
      << "\",index=\"" << w.value("index", 0) << "\"" << tp_label(w) << "} "
      << num(w.value("wait_fraction", 0.0)) << "\n";
  }
  header(o, "msinfer:expert_routed_tokens_total", "counter",
         "Token rows routed to each expert, summed over layers and over the expert workers "
         "holding a replica of it.");
  std::map<int, double> per_expert;
  for (const auto& w : workers) {
    if (!w.contains("expert_tokens") || !w["expert_tokens"].is_object()) continue;
    for (const auto& [e, n] : w["expert_tokens"].items()) {
      per_expert[std::stoi(e)] += n.get<double>();
    }
  }
  for (const auto& [e, n] : per_expert) {
    o << "msinfer:expert_routed_tokens_total{" << l << ",expert=\"" << e << "\"} " << num(n)
      << "\n";
  }
}

// The routing window (docs/RUNTIME.md, "Routing statistics and balancing"):
// rows per expert over its last ~1024 steps, and how evenly they spread.
void render_routing(std::ostringstream& o, const std::string& l, const Json& routing) {
  header(o, "msinfer:expert_window_tokens", "gauge",
         "Token rows routed to each expert over the routing window, summed over layers.");
  std::map<size_t, double> per_expert;
  for (const auto& layer : routing["expert_tokens"]) {
    if (!layer.is_array()) continue;
    for (size_t e = 0; e < layer.size(); ++e) {
      if (layer[e].is_number()) per_expert[e] += layer[e].get<double>();
    }
  }
  for (const auto& [e, n] : per_expert) {
    o << "msinfer:expert_window_tokens{" << l << ",expert=\"" << e << "\"} " << num(n) << "\n";
  }
  const auto ratio = [&](const char* key, const char* name, const char* help) {
    if (!routing.contains(key) || !routing[key].is_number()) return;
    header(o, name, "gauge", help);
    o << name << "{" << l << "} " << num(routing[key].get<double>()) << "\n";
  };
  ratio("expert_balance", "msinfer:expert_balance",
        "Max over mean of the experts' rows per layer over the window (1: even).");
  ratio("worker_balance", "msinfer:expert_worker_balance",
        "Max over mean of the expert workers' rows per layer over the window (1: even).");
  if (routing.contains("placement_switches") && routing["placement_switches"].is_number()) {
    header(o, "msinfer:expert_placement_switches_total", "counter",
           "Placements the router switched to by online rebalancing (--rebalance-every).");
    o << "msinfer:expert_placement_switches_total{" << l << "} "
      << num(routing["placement_switches"].get<double>()) << "\n";
  }
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[b];
  ++count_;
  sum_ += v;
}

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::ostringstream o;
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    o << name << "_bucket{" << labels << ",le=\"" << num(bounds_[i]) << "\"} " << cum << "\n";
  }
  o << name << "_bucket{" << labels << ",le=\"+Inf\"} " << count_ << "\n";
  o << name << "_sum{" << labels << "} " << num(sum_) << "\n";
  o << name << "_count{" << labels << "} " << count_ << "\n";
  return o.str();
}

Metrics::Metrics(std::string model_name)
    // vLLM's buckets.
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {
  std::string escaped;
  for (char c : model_name) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  labels_ = "model_name=\"" + escaped + "\"";
}

void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += n;
}
void Metrics::observe_step(std::span<const double> ttft_s, std::span<const double> itl_s) {
  std::lock_guard<std::mutex> l(mu_);
  for (double s : ttft_s) ttft_.observe(s);
  for (double s : itl_s) itl_.observe(s);
  generation_tokens_ += static_cast<int64_t>(ttft_s.size() + itl_s.size());
}
void Metrics::request_finished(const std::string& reason, double e2e_s) {
  std::lock_guard<std::mutex> l(mu_);
  ++success_[reason];
  e2e_.observe(e2e_s);
}
void Metrics::request_aborted() {
  std::lock_guard<std::mutex> l(mu_);
  ++aborted_;
}
void Metrics::http_response(int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++http_[status];
}

std::string Metrics::render(const Gauges& g) const {
  std::ostringstream o;
  // Read before the lock: the engine thread takes it for every step's tokens.
  if (g.process) render_process(o);
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& l = labels_;
  auto gauge = [&](const std::string& name, const char* help, double v) {
    header(o, name, "gauge", help);
    o << name << "{" << l << "} " << num(v) << "\n";
  };
  auto counter = [&](const std::string& name, const char* help, double v) {
    header(o, name, "counter", help);
    o << name << "{" << l << "} " << num(v) << "\n";
  };
  gauge("msinfer:num_requests_running", "Requests in the batch (prefill or decode).",
        static_cast<double>(g.running));
  gauge("msinfer:num_requests_waiting", "Requests waiting to join the batch.",
        static_cast<double>(g.waiting));
  gauge("msinfer:kv_cache_usage_perc", "Fraction of the KV cache's blocks in use (0..1).",
        g.kv_usage);
  gauge("msinfer:http_connections", "Open HTTP connections.", static_cast<double>(g.connections));
  if (g.http_loop_cpu_s >= 0) {
    counter("msinfer:http_loop_cpu_seconds_total",
            "CPU time of the HTTP event loop thread: parsing, JSON, SSE and socket writes "
            "(not its polling for the engine's steps: --busy-poll-us, anticipation).",
            g.http_loop_cpu_s);
  }
  counter("msinfer:http_batched_writes_total",
          "Socket writes of the HTTP loop sent together, an engine step's in one io_uring "
          "submit (the rest: a send() each).",
          static_cast<double>(g.http_batched_writes));
  counter("msinfer:http_batch_submits_total",
          "io_uring submits (system calls) that sent http_batched_writes_total.",
          static_cast<double>(g.http_batch_submits));
  counter("msinfer:http_loop_wakeups_total",
          "Engine steps whose tokens the engine thread had to wake the HTTP loop for (the "
          "rest it took while polling for them).",
          static_cast<double>(g.http_loop_wakeups));
  counter("msinfer:http_engine_waits_total",
          "Engine steps after which the engine thread waited for the HTTP loop, hundreds of "
          "steps' tokens behind (a loop short of CPU slows the engine rather than the tokens "
          "pile up in memory).",
          static_cast<double>(g.http_engine_waits));
  counter("msinfer:engine_busy_seconds_total",
          "Engine thread: wall time of the scheduler's iterations that stepped the engine.",
          g.engine_busy_s);
  counter("msinfer:engine_step_seconds_total",
          "Engine thread: the part of engine_busy_seconds_total inside the engine's step; the "
          "rest is the server's own work on that thread.",
          g.engine_step_s);
  counter("msinfer:engine_steps_total",
          "Engine thread: the engine's steps (a step makes at most one token per running "
          "request; generation_tokens_total / engine_steps_total is the mean decode batch).",
          static_cast<double>(g.engine_steps));
  counter("msinfer:num_preemptions_total", "Requests preempted to free KV blocks (recomputed).",
          static_cast<double>(g.preemptions));
  counter("msinfer:prefix_cache_queries_total",
          "Prefix cache: prompt tokens looked up at admission (again after a preemption).",
          static_cast<double>(g.prefix_queries));
  counter("msinfer:prefix_cache_hits_total",
          "Prefix cache: of those, tokens whose KV blocks were found in the cache.",
          static_cast<double>(g.prefix_hits));
  counter("msinfer:prompt_tokens_total", "Prompt tokens of admitted requests.",
          static_cast<double>(prompt_tokens_));
  counter("msinfer:generation_tokens_total", "Tokens generated.",
          static_cast<double>(generation_tokens_));
  header(o, "msinfer:request_success_total", "counter", "Requests finished, by finish reason.");
  for (const char* reason : {"stop", "length"}) {
    auto it = success_.find(reason);
    o << "msinfer:request_success_total{" << l << ",finished_reason=\"" << reason << "\"} "
      << (it == success_.end() ? 0 : it->second) << "\n";
  }
  counter("msinfer:request_aborted_total",
          "Requests cancelled (client gone, slow reader) or failed.",
          static_cast<double>(aborted_));
  header(o, "msinfer:time_to_first_token_seconds", "histogram", "Time to the first token.");
  o << ttft_.render("msinfer:time_to_first_token_seconds", l);
  header(o, "msinfer:inter_token_latency_seconds", "histogram", "Time between tokens.");
  o << itl_.render("msinfer:inter_token_latency_seconds", l);
  header(o, "msinfer:e2e_request_latency_seconds", "histogram", "Arrival to last token.");
  o << e2e_.render("msinfer:e2e_request_latency_seconds", l);
  header(o, "msinfer:http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http_) {
    o << "msinfer:http_responses_total{" << l << ",code=\"" << code << "\"} " << n << "\n";
  }
  if (!g.roles.empty()) render_roles(o, l, g);
  if (g.kv_transfers) {
    counter("msinfer:kv_transfers_total",
            "Prefill workers: sequences whose K/V moved to an attention worker.",
            static_cast<double>(g.kv_transfers->sequences));
    counter("msinfer:kv_transfer_bytes_total", "Prefill workers: the K/V bytes those moved.",
            static_cast<double>(g.kv_transfers->bytes));
    counter("msinfer:kv_transfer_fallbacks_total",
            "Prefill workers: requests prefilled on an attention worker instead (a failed "
            "transfer, or K/V beyond the staging region).",
            static_cast<double>(g.kv_transfers->fallbacks));
  }
  if (!g.workers.empty()) render_workers(o, l, g.workers);
  if (g.routing.is_object() && g.routing.contains("expert_tokens") &&
      g.routing["expert_tokens"].is_array()) {
    render_routing(o, l, g.routing);
  }
  return o.str();
}

}  // namespace msinfer::server
