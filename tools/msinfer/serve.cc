// msinfer serve: the OpenAI-compatible HTTP server over the co-located engine
// or a disaggregated deployment (the same deployment flags as generate).
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "commands.h"
#include "msinfer/core/flags.h"
#include "msinfer/kernels/cpu/threads.h"
#include "msinfer/model/tokenizer.h"
#include "msinfer/runtime/device_backend.h"
#include "msinfer/runtime/disaggregated.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/kv_cache.h"
#include "msinfer/server/http_server.h"
#include "msinfer/server/scheduler.h"
#include "planner_flags.h"

namespace msinfer::cli {
namespace {

// A thousand connections need more descriptors than the usual soft limit.
void raise_fd_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

void add_serve_flags(FlagSet& flags) {
  flags.add_string("model", "", "model directory (config.json, *.safetensors, tokenizer files)");
  flags.add_string("host", "127.0.0.1",
                   "address to listen on: IPv4, IPv6 (::1, ::), or a name such as localhost\n"
                   "(bound to its first IPv4 address, else its first IPv6 one)");
  flags.add_int("port", 8000, "port to listen on (0: any free port, printed when ready)");
  flags.add_string("api-key", "", "require 'Authorization: Bearer KEY' on /v1/*",
                   "MSINFER_API_KEY");
  flags.add_string("served-model-name", "",
                   "the model name clients send (default: the directory's name)");
  flags.add_int("max-num-seqs", 256, 1, 1 << 20, "requests in the batch at most");
  flags.add_int("max-n", 8, 1, runtime::GenerationRequest::kMaxSequences,
                "n (choices) and best_of (sequences generated) of a request at most; a\n"
                "request's sequences share its prompt's KV blocks; beyond: 400");
  flags.add_int("max-queue", 1024, 0, 1 << 24,
                "requests waiting for a place in the batch at most; beyond: 429");
  flags.add_int("max-model-len", 0, 0, std::numeric_limits<int32_t>::max(),
                "prompt + max_tokens at most (0: the model's context, capped by the KV cache);\n"
                "more than the model's context or than the KV cache holds is refused");
  flags.add_double("drain-timeout", 30, 0, 86400,
                   "seconds running requests get to finish after SIGTERM");
  flags.add_double("request-timeout", 30, 1, 86400,
                   "seconds a client has to send a whole request (headers and body), and\n"
                   "that a kept-alive connection may wait for its next one");
  flags.add_int("max-body-kb", 4096, 1, 1 << 20, "request body size limit (413 beyond)");
  flags.add_int("max-header-kb", 16, 1, 1024,
                "request header size limit, all fields together (431 beyond)");
  flags.add_int("max-prompt-bytes", 0, 0, int64_t{1} << 30,
                "a text prompt (or a chat's contents) longer than this is refused (400)\n"
                "before it is tokenized (0: 32 bytes per token of --max-model-len, at\n"
                "least 64 KiB, at most the body limit)");
  flags.add_double("tokenize-timeout", 10, 0.01, 3600,
                   "seconds a prompt may take to tokenize (and its chat template to render)\n"
                   "before the request is refused (400); they run on --tokenizer-threads\n"
                   "threads, never on the HTTP loop");
  flags.add_int("tokenizer-threads", 2, 1, 64, "threads that tokenize prompts");
  flags.add_int("max-connections", 4096, 1, 1 << 20,
                "client connections at once; at the limit a new one takes the place of\n"
                "the longest-idle kept-alive connection, or is refused");
  flags.add_int("max-connections-per-client", 1024, 0, 1 << 20,
                "connections from one client address at once (0: no limit); behind a\n"
                "proxy every client has its address: raise it or set 0");
  flags.add_int("stream-interval", 1, 1, 4096,
                "a stream's first text goes out at once, then every N engine steps, all\n"
                "streams together (and at its end): fewer socket writes and wake-ups of\n"
                "the HTTP loop per token when steps are short; 1: every token");
  flags.add_int("busy-poll-us", 0, 0, 1000000,
                "while streams are in flight, the HTTP loop polls for the engine's next\n"
                "step for up to this many microseconds before it sleeps, so that the\n"
                "engine thread need not wake it (on a VM ~16 us a step); its core spins\n"
                "meanwhile. For short steps (small models); 0: the loop sleeps");
  flags.add_int("max-pending-kb", 1024, 1, 1 << 20,
                "bytes queued for one client that reads slower than its tokens come,\n"
                "beyond what the kernel's socket buffers hold, before the server closes\n"
                "that connection (its request is cancelled; the others are not slowed)");
  flags.add_bool("no-io-uring",
                 "send each stream's writes with a send() apiece; by default the writes\n"
                 "of an engine step go to the kernel together, in one io_uring submit\n"
                 "(where the kernel refuses io_uring the server says so and does this)");
  flags.add_bool("no-anticipate",
                 "the HTTP loop sleeps until the engine thread wakes it with each step's\n"
                 "tokens; by default, while streams are in flight and steps come at a\n"
                 "steady pace, it sleeps on a timer until just before the next step is\n"
                 "due and polls for it (~1/8 of a step), so that the engine thread need\n"
                 "not wake it (on a VM ~16 us a step). --busy-poll-us overrides both");
  flags.add_bool("exit-on-failure",
                 "the default: after a failure the deployment cannot recover from (a worker\n"
                 "died that it can neither drop nor replace, the engine failed), end every\n"
                 "request in flight with an error, stop listening, stop every worker and\n"
                 "exit 1, naming the failure, so that a supervisor restarts the server");
  flags.add_bool("no-exit-on-failure",
                 "after such a failure stay up: /health and new requests answer 503 (with\n"
                 "the failure in the body) until SIGTERM");
  flags.add_int("kv-cache-mb", 256, 1, 1 << 20,
                "KV cache budget in MiB (per attention worker; at most this machine's memory)",
                "MSINFER_KV_CACHE_MB");
  add_step_budget_flag(flags);
  add_engine_flags(flags);
  add_deployment_flags(flags);
  flags.add_string("plan", "", "plan document from `msinfer plan --out` (sets n_a and m)");
  flags.set_epilog(
      "examples:\n"
      "  msinfer make-model --preset tiny-mixtral --out /tmp/m\n"
      "  msinfer serve --model /tmp/m --port 8000\n"
      "  msinfer serve --model /tmp/m --attention-workers 2 --expert-workers 2 --micro-batches 2\n"
      "  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'\n\n"
      "docs/SERVING.md describes the API, errors and metrics.");
}

// What the flags ask for, checked before the model loads. The deployment and
// engine flags stay in the FlagSet: start_deployment and
// engine_options_from_flags read them there.
struct ServeOptions {
  std::string model_dir;
  bool exit_on_failure = true;
  bool disaggregated = false;
  kernels::cpu::WeightFormat weights{};
  double drain_timeout_s = 0;
  server::ServerOptions server;
  server::SchedulerOptions scheduler;  // without on_failure
};

StatusOr<ServeOptions> serve_options(const FlagSet& flags) {
  ServeOptions o;
  o.model_dir = flags.get_string("model");
  if (o.model_dir.empty()) return invalid_argument("--model is required");
  if (flags.get_bool("exit-on-failure") && flags.get_bool("no-exit-on-failure")) {
    return invalid_argument("--exit-on-failure and --no-exit-on-failure contradict");
  }
  o.exit_on_failure = !flags.get_bool("no-exit-on-failure");
  if (flags.get_int("port") < 0 || flags.get_int("port") > 65535) {
    return invalid_argument("--port must be in 0..65535");
  }
  MSI_RETURN_IF_ERROR(check_kv_cache_fits_memory(flags.get_int("kv-cache-mb")));
  MSI_RETURN_IF_ERROR(check_step_budget_flags(flags));
  MSI_ASSIGN_OR_RETURN(o.weights, apply_engine_flags(flags));
  MSI_RETURN_IF_ERROR(runtime::parse_shared_experts(flags.get_string("shared-experts"),
                                                    flags.origin("shared-experts"))
                          .status());
  o.disaggregated = deployment_requested(flags);
  o.drain_timeout_s = flags.get_double("drain-timeout");
  server::ServerOptions& so = o.server;
  so.host = flags.get_string("host");
  so.port = static_cast<int>(flags.get_int("port"));
  so.api_key = flags.get_string("api-key");
  so.max_body_bytes = flags.get_int("max-body-kb") << 10;
  so.max_header_bytes = flags.get_int("max-header-kb") << 10;
  so.max_connections = flags.get_int("max-connections");
  so.max_connections_per_client = flags.get_int("max-connections-per-client");
  so.tokenizer_threads = static_cast<int>(flags.get_int("tokenizer-threads"));
  so.tokenize_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(flags.get_double("tokenize-timeout") * 1000));
  so.max_pending_bytes = flags.get_int("max-pending-kb") << 10;
  so.stream_interval = flags.get_int("stream-interval");
  so.busy_poll = std::chrono::microseconds(flags.get_int("busy-poll-us"));
  so.io_uring = !flags.get_bool("no-io-uring");
  so.anticipate = !flags.get_bool("no-anticipate");
  so.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(flags.get_double("request-timeout") * 1000));
  o.scheduler.max_num_seqs = flags.get_int("max-num-seqs");
  o.scheduler.max_queue = flags.get_int("max-queue");
  return o;
}

// What the API layer needs beside the flags: tokenizer, chat template,
// harmony's tokens and the limits. `ctx` points into the rest: an Api does
// not move (load_api hands it out in a unique_ptr).
struct Api {
  std::optional<model::Tokenizer> tokenizer;
  std::optional<server::ChatTemplate> chat_template;
  server::ChatTemplateConfig template_config;
  std::optional<server::HarmonyTokens> harmony;
  server::ApiContext ctx;
};

// The served name: --served-model-name, else the model directory's name.
std::string served_model_name(const FlagSet& flags, const std::string& dir) {
  std::string name = flags.get_string("served-model-name");
  if (!name.empty()) return name;
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d.substr(d.find_last_of('/') + 1);
}

// A request must fit the context and, alone, the KV cache. Asked for
// explicitly, a length the model or the cache cannot serve is an error, not
// a silent cap: a client would otherwise meet the smaller limit only as 400s.
StatusOr<int64_t> max_model_len(const FlagSet& flags, const ModelConfig& config,
                                const std::string& dir) {
  const int64_t kv_tokens =
      (flags.get_int("kv-cache-mb") << 20) / runtime::KvCache::bytes_per_token(config) / 16 * 16;
  const int64_t asked = flags.get_int("max-model-len");
  if (asked <= 0) return std::min<int64_t>(config.max_position_embeddings, kv_tokens);
  const std::string what = "--max-model-len " + std::to_string(asked);
  if (asked > config.max_position_embeddings) {
    return invalid_argument(what + " is beyond the model's context (max_position_embeddings " +
                            std::to_string(config.max_position_embeddings) + " in " + dir +
                            "/config.json)");
  }
  if (asked > kv_tokens) {
    return invalid_argument(what + " does not fit the KV cache: --kv-cache-mb " +
                            std::to_string(flags.get_int("kv-cache-mb")) + " holds " +
                            std::to_string(kv_tokens) +
                            " tokens; raise --kv-cache-mb or lower --max-model-len");
  }
  return asked;
}

StatusOr<std::unique_ptr<Api>> load_api(const FlagSet& flags, const ServeOptions& o,
                                        const ModelConfig& config) {
  const std::string& dir = o.model_dir;
  auto api = std::make_unique<Api>();
  auto tok = model::Tokenizer::load(dir);
  if (tok.ok()) {
    api->tokenizer = std::move(tok).value();
  } else {
    std::fprintf(stderr, "msinfer serve: no tokenizer (%s): prompts must be token ids\n",
                 tok.status().message().c_str());
  }
  if (auto c = server::read_chat_template_config(dir); c.ok()) {
    api->template_config = *c;
    auto t = server::ChatTemplate::parse(c->source);
    if (!t.ok()) return t.status().with_context(dir + "/tokenizer_config.json");
    api->chat_template = std::move(t).value();
  } else {
    std::fprintf(stderr, "msinfer serve: %s: /v1/chat/completions %s\n",
                 c.status().message().c_str(),
                 config.architecture == "GptOssForCausalLM"
                     ? "renders harmony itself (if the tokenizer has its tokens)"
                     : "is refused");
  }
  // gpt-oss speaks harmony: chats rendered in it (the model's own template
  // if it has one, else the built-in renderer) and answers split by channel.
  if (config.architecture == "GptOssForCausalLM" && api->tokenizer) {
    api->harmony = server::HarmonyTokens::of(*api->tokenizer);
    if (!api->harmony) {
      std::fprintf(
          stderr, "msinfer serve: the tokenizer lacks harmony's special tokens: chats use %s\n",
          api->chat_template ? "the chat template, answers unsplit" : "no template (refused)");
    }
  }
  server::ApiContext& ctx = api->ctx;
  ctx.harmony = api->harmony ? &*api->harmony : nullptr;
  ctx.served_model_name = served_model_name(flags, dir);
  ctx.tokenizer = api->tokenizer ? &*api->tokenizer : nullptr;
  ctx.chat_template = api->chat_template ? &*api->chat_template : nullptr;
  ctx.bos_token = api->template_config.bos_token;
  ctx.eos_token = api->template_config.eos_token;
  ctx.vocab = config.vocab;
  ctx.disaggregated = o.disaggregated;
  ctx.max_n = flags.get_int("max-n");
  MSI_ASSIGN_OR_RETURN(ctx.max_model_len, max_model_len(flags, config, dir));
  ctx.max_prompt_bytes = flags.get_int("max-prompt-bytes");
  if (ctx.max_prompt_bytes == 0) {
    ctx.max_prompt_bytes =
        std::min(o.server.max_body_bytes, std::max<int64_t>(64 << 10, 32 * ctx.max_model_len));
  }
  return api;
}

// The engine, or the router of a disaggregated deployment. On a launcher's
// worker rank the process has served as a worker by the time this returns:
// *worker_exit holds its exit code.
StatusOr<std::unique_ptr<server::GenerationBackend>> start_backend(
    const FlagSet& flags, const ServeOptions& o, const ModelConfig& config,
    std::optional<int>* worker_exit) {
  if (o.disaggregated) {
    MSI_ASSIGN_OR_RETURN(Deployment d, start_deployment(flags));
    if (d.worker_rank > 0) {
      *worker_exit = worker_rank_exit_code(d);
      return std::unique_ptr<server::GenerationBackend>();
    }
    return server::router_backend(std::move(d.router), static_cast<int>(config.layers),
                                  static_cast<int>(config.experts));
  }
  // The kernels run on every CPU this process may use (OpenMP's default
  // counts the affinity mask's; --threads or OMP_NUM_THREADS choose), the
  // HTTP loop beside them: it sleeps between steps (until their tokens
  // come, or just before: --no-anticipate) and takes a CPU for its writes
  // (docs/SERVING.md, "Threads"). Leaving it a CPU of its own halved a
  // single stream's speed.
  model::LoadOptions lo;
  lo.weights = o.weights;
  MSI_ASSIGN_OR_RETURN(
      auto w, model::ModelWeights::load(
                  o.model_dir, runtime::host_load_options(lo, flags.get_string("device"))));
  MSI_ASSIGN_OR_RETURN(auto e,
                       runtime::Engine::create(std::move(w), engine_options_from_flags(flags)));
  return server::engine_backend(std::move(e));
}

// The HTTP server on its loop thread, and how the command's main thread
// learns that it must end: a signal, or the backend's failure. Thread-safe:
// the loop calls the signal handler, the engine thread fail().
class Listener {
 public:
  Listener(const ServeOptions& o, const server::ApiContext& ctx, server::Metrics* metrics)
      : o_(o), ctx_(ctx), metrics_(metrics) {}
  ~Listener() { stop_loop(); }

  // Listens and runs the loop on its thread (/health answers 503 until a
  // scheduler is set).
  Status start() {
    MSI_ASSIGN_OR_RETURN(http_, server::HttpServer::start(o_.server, ctx_, metrics_));
    http_->on_signal([this](int) {
      std::lock_guard<std::mutex> l(mu_);
      signalled_ = true;
      cv_.notify_all();
    });
    io_ = std::thread([this] { http_->run(); });
    return ok_status();
  }
  bool started() const { return http_ != nullptr; }
  server::HttpServer& http() { return *http_; }
  void stop_loop() {
    if (!http_) return;
    http_->stop();
    if (io_.joinable()) io_.join();
  }
  void reset() { http_.reset(); }

  // The scheduler's on_failure.
  void fail(const Status& why) {
    std::lock_guard<std::mutex> l(mu_);
    failure_ = why;
    cv_.notify_all();
  }
  // Blocks until a signal (nullopt) or, with exit_on_failure, a failure (it).
  std::optional<Status> wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return signalled_ || (failure_ && o_.exit_on_failure); });
    if (signalled_) return std::nullopt;
    return failure_;
  }
  std::optional<Status> failure() {
    std::lock_guard<std::mutex> l(mu_);
    return failure_;
  }

 private:
  const ServeOptions& o_;
  const server::ApiContext& ctx_;
  server::Metrics* metrics_;
  std::unique_ptr<server::HttpServer> http_;
  std::thread io_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool signalled_ = false;         // GUARDED_BY(mu_)
  std::optional<Status> failure_;  // GUARDED_BY(mu_): the backend's, once it failed
};

// Serves until SIGTERM (drain, exit 0) or, with exit_on_failure, the
// backend's failure (exit 1).
int serve_until_done(const ServeOptions& o, Listener& listener,
                     std::unique_ptr<server::Scheduler> scheduler) {
  if (std::optional<Status> why = listener.wait()) {
    // The scheduler has failed every request in flight (their error
    // answers are on their way to the loop, which sends them before it
    // closes the connections); stopping the scheduler destroys the
    // deployment, which stops its workers and removes their shared memory.
    listener.http().set_draining();
    scheduler->stop();
    listener.stop_loop();
    scheduler.reset();
    listener.reset();
    std::fprintf(stderr,
                 "msinfer serve: exiting with status 1: the deployment failed and cannot "
                 "recover: %s (--no-exit-on-failure keeps the server up answering 503)\n",
                 why->message().c_str());
    return 1;
  }
  std::fprintf(stderr, "msinfer serve: draining (up to %.0f s)\n", o.drain_timeout_s);
  listener.http().set_draining();
  scheduler->start_draining();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000));
  const bool drained = scheduler->wait_idle(deadline);
  scheduler->stop();  // fails what is left
  listener.stop_loop();
  scheduler.reset();  // stops the workers of a deployment
  listener.reset();
  std::fprintf(stderr, "msinfer serve: stopped%s\n",
               drained ? "" : " (drain timeout: requests were cut off)");
  if (auto failure = listener.failure(); failure && o.exit_on_failure) {
    std::fprintf(stderr, "msinfer serve: exiting with status 1: the deployment failed: %s\n",
                 failure->message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int run_serve(int argc, char** argv) {
  FlagSet flags("serve",
                "Serves the model over HTTP with the OpenAI API (POST /v1/completions,\n"
                "/v1/chat/completions, streaming with server-sent events; GET /v1/models,\n"
                "/health, /metrics), on the co-located engine or a disaggregated deployment.\n"
                "Prints one line with the URL when it accepts requests. SIGTERM or SIGINT\n"
                "drains: new requests get 503, running ones finish (up to --drain-timeout),\n"
                "then every worker is stopped. After a failure the deployment cannot recover\n"
                "from, it ends the requests in flight with an error and exits 1\n"
                "(--no-exit-on-failure: it stays up, answering 503).");
  add_serve_flags(flags);
  if (auto done = parse_command_line(flags, "serve", argc, argv, 2)) return *done;
  auto opts = serve_options(flags);
  if (!opts.ok()) return report_error("serve", opts.status());
  const ServeOptions& o = *opts;
  auto config = load_model_config(o.model_dir);
  if (!config.ok()) return report_error("serve", config.status());
  auto api = load_api(flags, o, *config);
  if (!api.ok()) return report_error("serve", api.status());
  const server::ApiContext& ctx = (*api)->ctx;
  server::Metrics metrics(ctx.served_model_name);
  raise_fd_limit();
  ::signal(SIGPIPE, SIG_IGN);

  // Under mpirun every rank runs this command: only rank 0 may listen, and it
  // learns that by building the deployment first.
  Listener listener(o, ctx, &metrics);
  if (!comm::launched_by_mpi()) {
    if (Status s = listener.start(); !s.ok()) return report_error("serve", s);
  }
  std::optional<int> worker_exit;
  auto backend = start_backend(flags, o, *config, &worker_exit);
  if (!backend.ok()) {
    listener.stop_loop();
    return report_error("serve", backend.status());
  }
  if (worker_exit) return *worker_exit;
  if (!listener.started()) {
    if (Status s = listener.start(); !s.ok()) return report_error("serve", s);
  }
  server::SchedulerOptions sched_options = o.scheduler;
  sched_options.on_failure = [&](const Status& why) {
    if (!o.exit_on_failure) {
      std::fprintf(stderr,
                   "msinfer serve: /health answers 503 until SIGTERM (--no-exit-on-failure)\n");
    }
    listener.fail(why);
  };
  auto scheduler =
      std::make_unique<server::Scheduler>(std::move(backend).value(), sched_options, &metrics);
  listener.http().set_scheduler(scheduler.get());
  // Co-located, the kernel threads the engine runs on (the workers of a
  // disaggregated deployment print their own).
  const std::string threads =
      o.disaggregated ? "" : ", kernel threads " + std::to_string(kernels::cpu::compute_threads());
  std::printf("msinfer serve: ready at http://%s (model '%s', max_model_len %lld%s)\n",
              server::url_authority(o.server.host, listener.http().port()).c_str(),
              ctx.served_model_name.c_str(), static_cast<long long>(ctx.max_model_len),
              threads.c_str());
  std::fflush(stdout);
  return serve_until_done(o, listener, std::move(scheduler));
}

}  // namespace msinfer::cli
