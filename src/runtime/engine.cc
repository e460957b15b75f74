#include "msinfer/runtime/engine.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "msinfer/kernels/cpu/threads.h"
#include "msinfer/runtime/device_backend.h"

namespace msinfer::runtime {

Engine::Engine(std::shared_ptr<const model::ModelWeights> w, KvCache kv, const EngineOptions& o,
               std::unique_ptr<AttentionCompute> attention, std::unique_ptr<ExpertBackend> experts)
    : weights_(std::move(w)), kv_(std::move(kv)), options_(o), attention_(std::move(attention)),
      experts_(std::move(experts)), mbs_(o.micro_batches) {
  // The attention cost model's defaults from the model's shape, in FLOPs per
  // layer: a token's projections (QKV, O, router), and per position of its
  // context the score and value FLOPs plus the position's K/V bytes at 8 FLOPs
  // per byte (a CPU's FMA rate over its read bandwidth: 229 GFLOP/s / 26.8
  // GB/s on the Zen 5 of docs/benchmarks-history.md; an H200's is ~200, so a GPU
  // deployment should set the measured ratio).
  const ModelConfig& c = weights_->config();
  const double h = c.hidden, qn = c.heads * c.head_dim, kn = c.kv_heads * c.head_dim;
  if (o.attention_cost_per_token > 0 || o.attention_cost_per_position > 0) {
    cost_token_ = o.attention_cost_per_token;
    cost_position_ = o.attention_cost_per_position;
  } else {
    cost_token_ = 2 * h * (qn + 2 * kn) + 2 * qn * h + 2 * h * c.experts;
    cost_position_ = 4 * qn + 8 * (2 * kn * 2);
  }
}

double Engine::attention_cost(int64_t p0, int64_t n) const {
  const double nn = static_cast<double>(n);
  // Token j (0-based) of the n attends to p0 + j + 1 positions.
  return nn * cost_token_ + (nn * static_cast<double>(p0) + nn * (nn + 1) / 2) * cost_position_;
}

StatusOr<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const model::ModelWeights> w,
                                                 const EngineOptions& options,
                                                 std::unique_ptr<ExpertBackend> experts) {
  if (options.max_step_tokens < 1) return invalid_argument("max_step_tokens must be >= 1");
  if (options.micro_batches < 1 || options.micro_batches > 16) {
    return invalid_argument("micro_batches must be in 1..16");
  }
  MSI_RETURN_IF_ERROR(check_device(options.device));
  const bool cpu = is_cpu_device(options.device);
  const bool tp = w->attention_tp_size() > 1;
  if (!cpu && w->config().kv_lora_rank > 0) {
    return unimplemented("latent attention (DeepSeek) runs on the CPU engine only (--device cpu)");
  }
  if (!cpu && w->config().attention_sinks) {
    return unimplemented(
        "gpt-oss (attention sinks, sliding windows, biases) runs on the CPU "
        "engine only (--device cpu)");
  }
  if (tp && (!cpu || options.attention_peers == nullptr || w->attention_tp_rank() != 0)) {
    return unimplemented(
        "attention tensor parallelism runs on the CPU, with the engine on rank 0 and its peers");
  }
  MSI_ASSIGN_OR_RETURN(
      KvCache kv, KvCache::create(attention_tp_config(*w), options.kv_cache_bytes,
                                  options.block_size, /*host_pools=*/cpu, options.kv_pool_memory));
  if (options.prefix_caching) {
    // The K/V of a token sequence depend on the weights, where they run and
    // (attention-tp) which heads this rank keeps; the cache dies with the
    // engine, so these only keep chains apart should one outlive them.
    const std::string what = w->config().name + '\0' + w->config().architecture + '\0' + w->dir() +
                             '\0' + options.device + '\0' + std::to_string(w->attention_tp_size());
    uint64_t salt = 1469598103934665603ull ^ options.prefix_cache_salt;
    for (unsigned char ch : what) salt = (salt ^ ch) * 1099511628211ull;  // FNV-1a
    kv.enable_prefix_caching(salt);
    if (options.prefix_cache_events) kv.record_cache_events();
  }
  std::unique_ptr<AttentionCompute> attention;
  if (tp) {
    attention = std::make_unique<AttentionRunner>(*w, options.attention_peers);
  } else {
    MSI_ASSIGN_OR_RETURN(attention, make_attention_compute(options.device, *w, kv));
  }
  if (experts == nullptr) {
    MSI_ASSIGN_OR_RETURN(auto compute, make_expert_compute(options.device, *w, {}));
    experts = std::make_unique<LocalExperts>(std::move(compute), w->config());
  }
  return std::unique_ptr<Engine>(new Engine(std::move(w), std::move(kv), options,
                                            std::move(attention), std::move(experts)));
}

Status Engine::check_request(const GenerationRequest& r) const {
  const ModelConfig& c = config();
  if (r.prompt.empty()) return invalid_argument("request " + std::to_string(r.id) + ": empty prompt");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= c.vocab) {
      return invalid_argument("request " + std::to_string(r.id) + ": token id " +
                              std::to_string(t) + " outside the vocabulary (0.." +
                              std::to_string(c.vocab - 1) + ")");
    }
  }
  MSI_RETURN_IF_ERROR(r.sampling.validate().with_context("request " + std::to_string(r.id)));
  if (r.n < 1 || r.n > GenerationRequest::kMaxSequences) {
    return invalid_argument("request " + std::to_string(r.id) + ": n = " + std::to_string(r.n) +
                            " is outside 1.." + std::to_string(GenerationRequest::kMaxSequences));
  }
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
  if (need > c.max_position_embeddings) {
    return resource_exhausted("request " + std::to_string(r.id) + ": prompt + max_tokens = " +
                              std::to_string(need) + " exceeds the model context of " +
                              std::to_string(c.max_position_embeddings));
  }
  if (kv_.max_blocks(need, options_.max_step_tokens) > kv_.total_blocks()) {
    return resource_exhausted("request " + std::to_string(r.id) + ": prompt + max_tokens = " +
                              std::to_string(need) + " tokens does not fit the KV cache (" +
                              std::to_string(kv_.capacity_tokens()) +
                              " tokens); raise --kv-cache-mb or lower --max-tokens");
  }
  return ok_status();
}

Status Engine::add(GenerationRequest r) {
  MSI_RETURN_IF_ERROR(check_request(r));
  // The id names the request: cancel() and the events go by it.
  const auto same_id = [&](const Running& o) { return o.req.id == r.id; };
  if (std::any_of(waiting_.begin(), waiting_.end(), same_id) ||
      std::any_of(running_.begin(), running_.end(), same_id) ||
      std::any_of(parked_.begin(), parked_.end(), same_id) ||
      std::any_of(placed_.begin(), placed_.end(), same_id)) {
    return invalid_argument("request " + std::to_string(r.id) + ": the id is already in use");
  }
  Running run;
  run.tokens = r.prompt;
  run.seq = next_seq_++;
  run.fork_into = r.n;
  run.rng.seed(r.sampling.seed);  // sequence 0's: seed + 0
  run.req = std::move(r);
  waiting_.push_back(std::move(run));
  return ok_status();
}

bool Engine::cancel(int64_t id) {
  // Every sequence of it: n > 1 has several, in either list.
  const auto of = [&](const Running& r) { return r.req.id == id; };
  size_t found = std::erase_if(waiting_, of);
  for (std::vector<Running>* q : {&running_, &parked_, &placed_}) {
    for (const Running& r : *q) {
      if (of(r)) kv_.release(r.seq);
    }
    found += std::erase_if(*q, of);
  }
  return found > 0;
}

std::vector<PrefilledSequence> Engine::take_prefilled(bool copy_kv) {
  std::vector<PrefilledSequence> out;
  for (Running& r : parked_) {
    PrefilledSequence& p = out.emplace_back();
    p.kv_layout = kv_.layout_id();
    if (copy_kv) {
      p.kv.resize(static_cast<size_t>(kv_.transfer_bytes(r.computed)));
      kv_.export_kv(r.seq, r.computed, p.kv.data());
      kv_.release(r.seq);
    } else {
      p.kv_seq = r.seq;
    }
    std::ostringstream rng;
    rng << r.rng;
    p.rng = rng.str();
    p.request = std::move(r.req);
    p.request.prefill_only = false;
    p.index = r.index;
    p.tokens = std::move(r.tokens);
    p.computed = r.computed;
    p.generated = r.generated;
  }
  parked_.clear();
  return out;
}

StatusOr<Engine::Running> Engine::check_prefilled(PrefilledSequence& s, int64_t kv_bytes) {
  const std::string what = "prefilled request " + std::to_string(s.request.id);
  s.request.prefill_only = false;
  MSI_RETURN_IF_ERROR(check_request(s.request));
  const int64_t len = static_cast<int64_t>(s.tokens.size());
  const int64_t plen = static_cast<int64_t>(s.request.prompt.size());
  if (s.index < 0 || s.index >= s.request.n) {
    return invalid_argument(what + ": sequence " + std::to_string(s.index) +
                            " of n = " + std::to_string(s.request.n));
  }
  if (s.generated < 1 || len != plen + s.generated || s.computed != len - 1 ||
      !std::equal(s.request.prompt.begin(), s.request.prompt.end(), s.tokens.begin())) {
    return invalid_argument(
        what + ": " + std::to_string(len) + " tokens (" + std::to_string(s.generated) +
        " generated after a prompt of " + std::to_string(plen) + "), K/V of " +
        std::to_string(s.computed) +
        "; expected the prompt, its generated tokens and K/V of all but the last");
  }
  if (s.generated >= s.request.sampling.max_tokens) {
    return invalid_argument(what + ": already has its max_tokens");
  }
  for (size_t i = static_cast<size_t>(plen); i < s.tokens.size(); ++i) {
    if (s.tokens[i] < 0 || s.tokens[i] >= config().vocab) {
      return invalid_argument(what + ": token id " + std::to_string(s.tokens[i]) +
                              " outside the vocabulary");
    }
  }
  if (s.kv_layout != kv_.layout_id()) {
    return invalid_argument(what +
                            ": its K/V come from a KV cache of another layout (model, "
                            "block size or attention split)");
  }
  if (kv_bytes != kv_.transfer_bytes(s.computed)) {
    return invalid_argument(what + ": " + std::to_string(kv_bytes) + " bytes of K/V for " +
                            std::to_string(s.computed) + " positions, not " +
                            std::to_string(kv_.transfer_bytes(s.computed)));
  }
  if (!kv_.host_pools()) {
    return unimplemented("prefilled sequences need the KV cache in host memory (--device cpu)");
  }
  const auto same = [&](const Running& o) {
    return o.req.id == s.request.id && (o.index == s.index || o.fork_into > 1);
  };
  for (const std::vector<Running>* q : {&running_, &parked_, &placed_}) {
    if (std::any_of(q->begin(), q->end(), same)) {
      return invalid_argument(what + ": sequence " + std::to_string(s.index) + " is already here");
    }
  }
  if (std::any_of(waiting_.begin(), waiting_.end(), same)) {
    return invalid_argument(what + ": sequence " + std::to_string(s.index) + " is already here");
  }
  Running run;
  std::istringstream rng(s.rng);
  rng >> run.rng;
  if (rng.fail()) return invalid_argument(what + ": unreadable sampler state");
  run.seq = next_seq_++;
  run.index = s.index;
  run.tokens = std::move(s.tokens);
  run.computed = s.computed;
  run.generated = s.generated;
  run.cached_tokens = 0;
  run.req = std::move(s.request);
  return run;
}

Status Engine::add_prefilled(PrefilledSequence s) {
  MSI_ASSIGN_OR_RETURN(Running run, check_prefilled(s, static_cast<int64_t>(s.kv.size())));
  run.kv_import = std::move(s.kv);
  waiting_.push_back(std::move(run));
  return ok_status();
}

StatusOr<std::optional<PlacedKv>> Engine::place_prefilled(PrefilledSequence s, int64_t kv_bytes) {
  MSI_ASSIGN_OR_RETURN(Running run, check_prefilled(s, kv_bytes));
  // The blocks of its positions that the prefix cache holds need not come
  // (a sliding layer group's window would need more care: none skipped);
  // those no table holds count as free until taken.
  int64_t skip = 0, evictable = 0;
  if (kv_.prefix_caching() && kv_.groups() == 1) {
    skip = kv_.cached_prefix_blocks(run.tokens.data(), run.computed, &evictable);
  }
  const int64_t need = kv_.transfer_blocks(run.computed) - skip + evictable;
  if (!waiting_.empty() || need + blocks_kept_free() > kv_.free_blocks()) {
    return std::optional<PlacedKv>();  // the queue first; or no room now, as admission counts
  }
  if (skip > 0) {
    if (kv_.match_prefix(run.seq, run.tokens.data(), run.computed) != skip * kv_.block_size() ||
        !kv_.reserve(run.seq, run.computed, run.computed).ok()) {
      kv_.release(run.seq);
      return std::optional<PlacedKv>();
    }
  } else if (!kv_.place_kv(run.seq, run.computed).ok()) {
    return std::optional<PlacedKv>();
  }
  PlacedKv out;
  out.table = kv_.transfer_table(run.seq, run.computed, skip);
  out.pool_blocks = kv_.total_blocks();
  out.skip_blocks = skip;
  placed_.push_back(std::move(run));
  return std::optional<PlacedKv>(std::move(out));
}

bool Engine::commit_prefilled(int64_t id, int32_t index, bool arrived) {
  auto it = std::find_if(placed_.begin(), placed_.end(),
                         [&](const Running& r) { return r.req.id == id && r.index == index; });
  if (it == placed_.end()) return false;
  if (arrived) {
    kv_.cache_blocks(it->seq, it->tokens.data(), it->computed);
    running_.push_back(std::move(*it));  // it holds its blocks: nothing to admit
  } else {
    kv_.release(it->seq);
  }
  placed_.erase(it);
  return true;
}

bool Engine::admit_prefilled(Running& r, int64_t reserved) {
  const int64_t need = kv_.transfer_blocks(r.computed);
  if (!running_.empty() && need + reserved > kv_.free_blocks()) return false;
  if (!kv_.import_kv(r.seq, r.computed, r.kv_import.data(),
                     static_cast<int64_t>(r.kv_import.size()))
           .ok()) {
    return false;
  }
  std::vector<uint8_t>().swap(r.kv_import);
  kv_.cache_blocks(r.seq, r.tokens.data(), r.computed);
  return true;
}

int64_t Engine::blocks_kept_free() const {
  const int64_t chunk = options_.max_step_tokens;
  int64_t next_step = 0;
  for (const Running& r : running_) {
    const int64_t len = static_cast<int64_t>(r.tokens.size());
    next_step += kv_.blocks_to_take(r.seq, std::min(len, r.computed + chunk), r.computed, len);
  }
  return next_step + std::max<int64_t>(1, kv_.total_blocks() / 100);  // the watermark
}

// First come, first served: a request is admitted when the blocks of every
// token it must compute are free beyond what the running requests take in the
// next step (a decode whose token starts a new block; a prompt's next chunk in
// a sliding layer group, the other groups holding the whole prompt from
// admission) and a watermark of 1% of the pool, as vLLM keeps. (One
// spare block per running request, as before, left half the cache unused
// at 128-token blocks.) A sliding group holds only the window before a chunk
// and the chunk (KvCache::reserve): a long prompt takes its window's blocks
// there, not its length's. A later step that runs short preempts the most
// recently admitted (plan_step).
void Engine::admit() {
  if (waiting_.empty()) return;
  const int64_t chunk = options_.max_step_tokens;
  const int64_t kept_free = blocks_kept_free();
  while (!waiting_.empty()) {
    Running& r = waiting_.front();
    if (!r.kv_import.empty()) {
      if (!admit_prefilled(r, kept_free)) break;
      running_.push_back(std::move(r));
      waiting_.pop_front();
      continue;
    }
    const int64_t len = static_cast<int64_t>(r.tokens.size());
    // Cached blocks it shares cost nothing, unless no one holds them: then
    // they count as free now and stop being free once it takes them.
    const int64_t need = kv_.blocks_to_start(r.tokens.data(), len, chunk, nullptr);
    if (!running_.empty() && need + kept_free > kv_.free_blocks()) break;
    r.computed = kv_.match_prefix(r.seq, r.tokens.data(), len);
    if (!kv_.reserve(r.seq, std::min(len, r.computed + chunk), r.computed, len).ok()) {
      kv_.release(r.seq);
      r.computed = 0;
      break;
    }
    counters_.prefix_queries += len;
    counters_.prefix_hits += r.computed;
    if (r.cached_tokens < 0) r.cached_tokens = r.computed;
    running_.push_back(std::move(r));
    waiting_.pop_front();
  }
}

std::vector<std::pair<size_t, int64_t>> Engine::plan_step() {
  std::vector<std::pair<size_t, int64_t>> plan;
  int64_t budget = options_.max_step_tokens;
  // The most recently admitted request still running, other than `keep`.
  auto victim = [&](size_t keep) -> std::ptrdiff_t {
    for (size_t v = running_.size(); v-- > 0;) {
      if (v != keep && !running_[v].preempted) return static_cast<std::ptrdiff_t>(v);
    }
    return -1;
  };
  auto preempt = [&](size_t v) {
    Running& r = running_[v];
    r.preempted = true;
    kv_.release(r.seq);  // its own references: blocks it shares stay with the others
    r.computed = 0;
    ++counters_.preemptions;
    for (auto it = plan.begin(); it != plan.end(); ++it) {
      if (it->first == v) {
        budget += it->second;
        plan.erase(it);
        break;
      }
    }
  };
  // Decode tokens first (one each), then prompt chunks within the token budget.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Running& r = running_[i];
      if (r.preempted) continue;
      const int64_t left = static_cast<int64_t>(r.tokens.size()) - r.computed;
      const bool decoding = left == 1;
      if ((pass == 0) != decoding || left <= 0) continue;
      const int64_t n = std::min(left, budget);
      bool fits = true;
      while (!kv_.reserve(r.seq, r.computed + n, r.computed).ok()) {
        const std::ptrdiff_t v = victim(i);
        if (v < 0 || static_cast<size_t>(v) < i) {
          // Everything admitted after it is preempted already: it goes itself.
          preempt(i);
          fits = false;
          break;
        }
        preempt(static_cast<size_t>(v));
      }
      if (!fits) continue;
      plan.emplace_back(i, n);
      budget -= n;
    }
  }
  // Victims return to the front of the queue, earliest admitted first.
  for (size_t v = running_.size(); v-- > 0;) {
    if (!running_[v].preempted) continue;
    running_[v].preempted = false;
    waiting_.push_front(std::move(running_[v]));
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(v));
    for (auto& [i, n] : plan) {
      if (i > v) --i;
    }
  }
  return plan;
}

std::vector<Engine::Running> Engine::fork_sequences(Running& r) {
  // The partly filled last block is copied where the pools are here and
  // every rank's are (attention-tp peers hold their heads' K/V: a copy on
  // this rank would leave theirs behind); elsewhere each sequence recomputes
  // the positions after the last full block.
  const bool copy = kv_.host_pools() && options_.attention_peers == nullptr;
  std::vector<Running> born;
  for (int32_t i = 1; i < r.fork_into; ++i) {
    Running s;
    s.req = r.req;
    s.seq = next_seq_++;
    s.index = i;
    s.tokens = r.tokens;
    s.rng.seed(r.req.sampling.seed + static_cast<uint64_t>(i));
    s.computed = kv_.fork(r.seq, s.seq, r.computed, copy);
    born.push_back(std::move(s));
  }
  r.fork_into = 1;
  return born;
}

bool Engine::sample_next(Running& r, const float* lg, std::vector<TokenEvent>* events) {
  const ModelConfig& c = config();
  const SamplingParams& sp = r.req.sampling;
  if (observer_) observer_(r.req.id, lg, c.vocab);
  const int32_t tok = sample_token(lg, c.vocab, sp, r.rng);
  r.tokens.push_back(tok);
  ++r.generated;
  TokenEvent& ev = events->emplace_back();
  ev.request_id = r.req.id;
  ev.index = r.index;
  ev.token = tok;
  if (r.generated == 1) ev.cached_tokens = std::max<int64_t>(0, r.cached_tokens);
  if (sp.logprobs >= 0) {
    ev.logprob = token_logprob(lg, c.vocab, tok, sp.logprobs, &ev.top_logprobs);
  }
  const auto& stops = sp.stop_token_ids;
  if (!sp.ignore_eos &&
      std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), tok) != c.eos_token_ids.end()) {
    ev.finish_reason = FinishReason::kEos;
  } else if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    ev.finish_reason = FinishReason::kStop;
  } else if (r.generated >= sp.max_tokens) {
    ev.finish_reason = FinishReason::kLength;
  }
  ev.finished = ev.finish_reason != FinishReason::kNone;
  return ev.finished;
}

StatusOr<std::vector<TokenEvent>> Engine::step() {
  kernels::cpu::enter_compute_thread();  // the step may run on any thread (serve's engine thread)
  admit();
  std::vector<TokenEvent> events;
  if (running_.empty() && !options_.step_when_idle) return events;
  const ModelConfig& c = config();
  const int64_t h = c.hidden;
  const int M = options_.micro_batches;
  for (auto& mb : mbs_) {
    mb.batch.clear();
    mb.owners.clear();
    mb.fed.clear();
  }
  // Micro-batches by predicted attention time (docs/RUNTIME.md, "One layer of one micro-batch"), not by
  // token count: a decode token at context 2000 costs far more than one at 20.
  // Longest first, each to the micro-batch with the least predicted time so
  // far (greedy longest-processing-time), so the m micro-batches finish
  // their attention together and the experts see no bubble between them.
  auto plan = plan_step();
  std::vector<double> cost(plan.size());
  for (size_t j = 0; j < plan.size(); ++j) {
    cost[j] = attention_cost(running_[plan[j].first].computed, plan[j].second);
  }
  std::vector<size_t> order(plan.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> mb_cost(M, 0.0);
  for (size_t j : order) {
    const auto [i, n] = plan[j];
    Running& r = running_[i];
    const size_t k = static_cast<size_t>(std::min_element(mb_cost.begin(), mb_cost.end()) - mb_cost.begin());
    mb_cost[k] += cost[j];
    MicroBatch& mb = mbs_[k];
    for (int64_t j = 0; j < n; ++j) {
      mb.batch.ids.push_back(r.tokens[r.computed + j]);
      mb.batch.positions.push_back(static_cast<int32_t>(r.computed + j));
    }
    for (int g = 0; g < kv_.groups(); ++g) {
      mb.batch.tables_of(g).insert(mb.batch.tables_of(g).end(), static_cast<size_t>(n),
                                   kv_.block_table(r.seq, g));
    }
    mb.owners.push_back(static_cast<int64_t>(i));
    mb.fed.push_back(n);
  }
  if (M > 1 && !plan.empty()) {
    const double mx = *std::max_element(mb_cost.begin(), mb_cost.end());
    double sum = 0;
    for (double v : mb_cost) sum += v;
    balance_sum_ += mx / (sum / M);
    ++balance_steps_;
  }
  // Ping-pong: micro-batch k's attention runs while the experts work on k - 1.
  MSI_RETURN_IF_ERROR(experts_->begin_step());
  for (auto& mb : mbs_) {
    mb.x.resize(mb.batch.size() * h);
    MSI_RETURN_IF_ERROR(attention_->embed(mb.batch, mb.x.data()));
  }
  for (int l = 0; l < c.layers; ++l) {
    for (int k = 0; k < M; ++k) {
      MicroBatch& mb = mbs_[k];
      if (l > 0) {
        mb.results.resize(mb.routed.rows() * h);
        MSI_RETURN_IF_ERROR(experts_->finish(k, l - 1, mb.routed, mb.results.data()));
        attention_->combine(mb.routed, mb.results.data(), mb.x.data());
      }
      MSI_RETURN_IF_ERROR(attention_->attention_and_gate(l, mb.batch, kv_, mb.x.data(), &mb.routed));
      MSI_RETURN_IF_ERROR(experts_->start(k, l, mb.routed));
    }
  }
  for (int k = 0; k < M; ++k) {
    MicroBatch& mb = mbs_[k];
    mb.results.resize(mb.routed.rows() * h);
    MSI_RETURN_IF_ERROR(experts_->finish(k, c.layers - 1, mb.routed, mb.results.data()));
    attention_->combine(mb.routed, mb.results.data(), mb.x.data());
  }
  if (experts_->discard_step()) return events;  // nothing advanced: run again
  // Logits for requests whose every token is now in the cache.
  std::vector<std::pair<int, int64_t>> rows;  // (micro-batch, row)
  std::vector<int64_t> owners;
  for (int k = 0; k < M; ++k) {
    int64_t row = 0;
    for (size_t j = 0; j < mbs_[k].owners.size(); ++j) {
      Running& r = running_[mbs_[k].owners[j]];
      row += mbs_[k].fed[j];
      r.computed += mbs_[k].fed[j];
      kv_.cache_blocks(r.seq, r.tokens.data(), r.computed);
      // Sliding groups let go of the blocks behind the next token's window
      // (registered ones stay cached for a later request's prefix).
      kv_.slide(r.seq, r.computed);
      if (r.computed == static_cast<int64_t>(r.tokens.size())) {
        rows.emplace_back(k, row - 1);
        owners.push_back(mbs_[k].owners[j]);
      }
    }
  }
  // One LM-head GEMM over every row that needs logits, whichever micro-batch
  // it is in: the head is the largest matrix, and each GEMM streams it from
  // memory once (row by row it was once per request, per micro-batch once
  // per micro-batch).
  std::vector<const float*> head_rows;
  for (const auto& [k, row] : rows) head_rows.push_back(mbs_[k].x.data() + row * h);
  logits_.resize(rows.size() * c.vocab);
  if (!head_rows.empty()) MSI_RETURN_IF_ERROR(attention_->logits(head_rows, logits_.data()));
  std::vector<size_t> done;
  std::vector<Running> forked;  // sequences born this step (n > 1), joining the batch below
  for (size_t j = 0; j < rows.size(); ++j) {
    Running& r = running_[owners[j]];
    const float* lg = logits_.data() + j * c.vocab;
    const SamplingParams& sp = r.req.sampling;
    // Penalties and min_tokens on a copy: the logits stay as computed.
    const bool penalise = has_penalties(sp);
    if (penalise || r.generated < sp.min_tokens) {
      penalised_.assign(lg, lg + c.vocab);
      const int64_t plen = static_cast<int64_t>(r.req.prompt.size());
      if (penalise) {
        apply_penalties(penalised_.data(), c.vocab, sp, r.tokens.data(), plen,
                        r.tokens.data() + plen, r.generated);
      }
      suppress_stops(penalised_.data(), c.vocab, sp, c.eos_token_ids.data(),
                     static_cast<int64_t>(c.eos_token_ids.size()), r.generated);
      lg = penalised_.data();
    }
    // n > 1: the other sequences start from this prompt's K/V and logits
    // (forked before r's token is appended: they have the same tokens).
    std::vector<Running> born = r.fork_into > 1 ? fork_sequences(r) : std::vector<Running>{};
    const bool finished = sample_next(r, lg, &events);
    if (finished || r.req.prefill_only) done.push_back(owners[j]);
    if (!finished && r.req.prefill_only) {
      parked_.push_back(std::move(r));  // with its blocks
      r.seq = -1;
    }
    for (Running& s : born) {
      if (sample_next(s, lg, &events)) {
        kv_.release(s.seq);  // finished at its first token
      } else {
        (s.req.prefill_only ? parked_ : forked).push_back(std::move(s));
      }
    }
  }
  // Finished ones free their blocks; parked ones (moved out) hold theirs.
  std::sort(done.rbegin(), done.rend());
  for (size_t i : done) {
    if (running_[i].seq >= 0) kv_.release(running_[i].seq);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  // The forked sequences count as admitted now (the latest: preempted first).
  for (Running& s : forked) running_.push_back(std::move(s));
  return events;
}

}  // namespace msinfer::runtime
