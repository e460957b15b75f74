#include "msinfer/runtime/control.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

#include "internal/json_fields.h"
#include "internal/line_io.h"

namespace msinfer::runtime {

const char* worker_role_name(WorkerRole r) {
  switch (r) {
    case WorkerRole::kAttention:
      return "attention";
    case WorkerRole::kExpert:
      return "expert";
    case WorkerRole::kPrefill:
      return "prefill";
  }
  return "?";
}

StatusOr<WorkerRole> parse_worker_role(const std::string& s) {
  if (s == "attention") return WorkerRole::kAttention;
  if (s == "expert") return WorkerRole::kExpert;
  if (s == "prefill") return WorkerRole::kPrefill;
  return invalid_argument("unknown worker role '" + s + "' (attention, expert or prefill)");
}

namespace control {
namespace {

using internal::dump;
using internal::Fields;
using internal::read_hex;
using internal::read_placement;
using internal::read_value;

// ---- commands ----

// A prefilled sequence without its K/V (those move over the transport), as
// AddPrefilled and KvSent carry it under "sequence".
Json sequence_json(const PrefilledSequence& p);
Status read_sequence(const Json& j, const std::string& w, PrefilledSequence* p);

Json command_json(const Configure& c) {
  return Json{{"config", worker_config_json(c.config)},
              {"role", worker_role_name(c.role)},
              {"index", c.index},
              {"tp_rank", c.tp_rank}};
}
Json command_json(const Exit&) { return {}; }
Json command_json(const Step&) { return {}; }
Json command_json(const Add& a) {
  const GenerationRequest& r = a.request;
  const SamplingParams& s = r.sampling;
  return Json{{"id", r.id},
              {"prompt", r.prompt},
              {"max_tokens", s.max_tokens},
              {"temperature", s.temperature},
              {"top_k", s.top_k},
              {"top_p", s.top_p},
              {"seed", s.seed},
              {"ignore_eos", s.ignore_eos},
              {"stop_token_ids", s.stop_token_ids},
              {"frequency_penalty", s.frequency_penalty},
              {"presence_penalty", s.presence_penalty},
              {"min_p", s.min_p},
              {"repetition_penalty", s.repetition_penalty},
              {"min_tokens", s.min_tokens},
              {"logprobs", s.logprobs},
              {"n", r.n},
              {"prefill_only", r.prefill_only}};
}
Json command_json(const Cancel& c) { return Json{{"id", c.id}}; }
Json command_json(const GetStats& c) { return Json{{"reset", c.reset}}; }
Json command_json(const DropExpert& c) {
  return Json{{"worker", c.worker}, {"keep_placement", c.keep_placement}};
}
Json command_json(const DropAttention& c) { return Json{{"worker", c.worker}}; }
Json command_json(const GetCard&) { return {}; }
Json command_json(const AddExpert& c) {
  return Json{{"worker", c.worker}, {"card", internal::to_hex(c.card)}, {"shares", c.shares}};
}
Json command_json(const SetPlacement& c) { return Json{{"placement", c.placement.to_json()}}; }
Json command_json(const GetRouted&) { return {}; }
Json command_json(const Prepare& c) { return Json{{"placement", c.placement.to_json()}}; }
Json command_json(const GetPrepared&) { return {}; }
Json command_json(const Abandon&) { return {}; }
Json command_json(const SetUnits& c) { return Json{{"served", c.served}}; }
Json command_json(const Switch&) { return {}; }
Json command_json(const AddAttention& c) {
  return Json{{"worker", c.worker}, {"card", internal::to_hex(c.card)}};
}
Json command_json(const ConnectKv& c) {
  Json cards = Json::array();
  for (const auto& card : c.cards) cards.push_back(internal::to_hex(card));
  return Json{{"cards", cards}};
}
Json target_json(const KvTarget& t) {
  if (t.region.empty()) return Json::object();  // the staging region
  return Json{{"region", internal::to_hex(t.region)},
              {"table", t.placed.table},
              {"pool_blocks", t.placed.pool_blocks},
              {"skip", t.placed.skip_blocks}};
}
Json command_json(const SendKv& c) {
  return Json{{"id", c.id},
              {"index", c.index},
              {"worker", c.worker},
              {"imm", c.imm},
              {"target", target_json(c.target)}};
}
Json command_json(const AddPrefilled& c) {
  return Json{{"sequence", sequence_json(c.sequence)}, {"bytes", c.bytes}};
}
Json command_json(const CommitKv& c) {
  return Json{{"id", c.id}, {"index", c.index}, {"imm", c.imm}};
}
Json command_json(const JoinBlobs& c) {
  Json b = Json::array();
  for (const auto& blob : c.blobs) b.push_back(internal::to_hex(blob));
  return Json{{"blobs", b}};
}

// The defaults of a field an Add leaves out are SamplingParams' own.
Status read_command(const Json& j, const std::string& w, Add* a) {
  GenerationRequest& r = a->request;
  SamplingParams& s = r.sampling;
  Fields f(j, w);
  f.required("id", &r.id)
      .required("prompt", &r.prompt)
      .optional("max_tokens", &s.max_tokens)
      .optional("temperature", &s.temperature)
      .optional("top_k", &s.top_k)
      .optional("top_p", &s.top_p)
      .optional("seed", &s.seed)
      .optional("ignore_eos", &s.ignore_eos)
      .optional("stop_token_ids", &s.stop_token_ids)
      .optional("frequency_penalty", &s.frequency_penalty)
      .optional("presence_penalty", &s.presence_penalty)
      .optional("min_p", &s.min_p)
      .optional("repetition_penalty", &s.repetition_penalty)
      .optional("min_tokens", &s.min_tokens)
      .optional("logprobs", &s.logprobs)
      .optional("n", &r.n)
      .optional("prefill_only", &r.prefill_only);
  return f.status();
}

Json sequence_json(const PrefilledSequence& p) {
  return Json{{"request", command_json(Add{p.request})},
              {"index", p.index},
              {"tokens", p.tokens},
              {"computed", p.computed},
              {"generated", p.generated},
              {"rng", p.rng},
              {"kv_layout", p.kv_layout}};
}
Status read_sequence(const Json& j, const std::string& w, PrefilledSequence* p) {
  Json request;
  MSI_RETURN_IF_ERROR(Fields(j, w).required("sequence", &request).status());
  if (!request.is_object()) return invalid_argument(w + ": field 'sequence' is not an object");
  Json req;
  MSI_RETURN_IF_ERROR(Fields(request, w + ": sequence")
                          .required("request", &req)
                          .required("index", &p->index)
                          .required("tokens", &p->tokens)
                          .required("computed", &p->computed)
                          .required("generated", &p->generated)
                          .required("rng", &p->rng)
                          .required("kv_layout", &p->kv_layout)
                          .status());
  if (!req.is_object()) return invalid_argument(w + ": sequence: field 'request' is not an object");
  Add add;
  MSI_RETURN_IF_ERROR(read_command(req, w + ": sequence: request", &add));
  p->request = std::move(add.request);
  return ok_status();
}
Status read_command(const Json& j, const std::string& w, Configure* c) {
  std::string role;
  MSI_RETURN_IF_ERROR(Fields(j, w)
                          .required("role", &role)
                          .required("index", &c->index)
                          .optional("tp_rank", &c->tp_rank)
                          .status());
  MSI_ASSIGN_OR_RETURN(c->role, parse_worker_role(role));
  auto it = j.find("config");
  if (it == j.end()) return invalid_argument(w + ": field 'config' is missing");
  MSI_ASSIGN_OR_RETURN(c->config, worker_config_from_json(*it, w + ": config"));
  const int tp = c->role == WorkerRole::kAttention ? c->config.tp_attention
                 : c->role == WorkerRole::kExpert  ? c->config.tp_expert
                                                   : 1;
  const int workers = c->role == WorkerRole::kAttention ? c->config.attention_workers
                      : c->role == WorkerRole::kExpert  ? c->config.expert_workers
                                                        : c->config.prefill_workers;
  if (c->index < 0 || c->index >= workers || c->tp_rank < 0 || c->tp_rank >= tp) {
    return invalid_argument(w + ": " + role + " worker " + std::to_string(c->index) + " rank " +
                            std::to_string(c->tp_rank) + " is not in the deployment");
  }
  return ok_status();
}
Status read_command(const Json&, const std::string&, Exit*) { return ok_status(); }
Status read_command(const Json&, const std::string&, Step*) { return ok_status(); }
Status read_command(const Json& j, const std::string& w, Cancel* c) {
  return Fields(j, w).required("id", &c->id).status();
}
Status read_command(const Json& j, const std::string& w, GetStats* c) {
  return Fields(j, w).optional("reset", &c->reset).status();
}
Status read_command(const Json& j, const std::string& w, DropExpert* c) {
  return Fields(j, w)
      .required("worker", &c->worker)
      .optional("keep_placement", &c->keep_placement)
      .status();
}
Status read_command(const Json& j, const std::string& w, DropAttention* c) {
  return Fields(j, w).required("worker", &c->worker).status();
}
Status read_command(const Json&, const std::string&, GetCard*) { return ok_status(); }
Status read_command(const Json& j, const std::string& w, AddExpert* c) {
  Fields f(j, w);
  f.required("worker", &c->worker).required("shares", &c->shares);
  return read_hex(f, "card", &c->card, w);
}
Status read_command(const Json& j, const std::string& w, AddAttention* c) {
  Fields f(j, w);
  f.required("worker", &c->worker);
  return read_hex(f, "card", &c->card, w);
}
Status read_command(const Json& j, const std::string& w, SetPlacement* c) {
  MSI_ASSIGN_OR_RETURN(c->placement, read_placement(j, w));
  return ok_status();
}
Status read_command(const Json&, const std::string&, GetRouted*) { return ok_status(); }
Status read_command(const Json& j, const std::string& w, Prepare* c) {
  MSI_ASSIGN_OR_RETURN(c->placement, read_placement(j, w));
  return ok_status();
}
Status read_command(const Json&, const std::string&, GetPrepared*) { return ok_status(); }
Status read_command(const Json&, const std::string&, Abandon*) { return ok_status(); }
Status read_command(const Json& j, const std::string& w, SetUnits* c) {
  return Fields(j, w).required("served", &c->served).status();
}
Status read_command(const Json&, const std::string&, Switch*) { return ok_status(); }
Status read_command(const Json& j, const std::string& w, ConnectKv* c) {
  std::vector<std::string> hex;
  MSI_RETURN_IF_ERROR(Fields(j, w).required("cards", &hex).status());
  c->cards.assign(hex.size(), "");
  for (size_t i = 0; i < hex.size(); ++i) {
    if (!internal::from_hex(hex[i], &c->cards[i])) {
      return invalid_argument(w + ": card " + std::to_string(i) + " is not hex");
    }
  }
  return ok_status();
}
// KvTarget under "target" (the table's shape and blocks are checked where
// it is used: KvCache::transfer_spans).
Status read_target(const Json& j, const std::string& w, KvTarget* t) {
  Json target;
  MSI_RETURN_IF_ERROR(Fields(j, w).required("target", &target).status());
  if (!target.is_object()) return invalid_argument(w + ": field 'target' is not an object");
  if (!target.contains("region")) return ok_status();
  Fields f(target, w + ": target");
  f.required("table", &t->placed.table)
      .required("pool_blocks", &t->placed.pool_blocks)
      .optional("skip", &t->placed.skip_blocks);
  return read_hex(f, "region", &t->region, w + ": target");
}
Status read_command(const Json& j, const std::string& w, SendKv* c) {
  MSI_RETURN_IF_ERROR(Fields(j, w)
                          .required("id", &c->id)
                          .required("index", &c->index)
                          .required("worker", &c->worker)
                          .required("imm", &c->imm)
                          .status());
  return read_target(j, w, &c->target);
}
Status read_command(const Json& j, const std::string& w, AddPrefilled* c) {
  MSI_RETURN_IF_ERROR(Fields(j, w).required("bytes", &c->bytes).status());
  if (c->bytes < 0) return invalid_argument(w + ": field 'bytes' is negative");
  return read_sequence(j, w, &c->sequence);
}
Status read_command(const Json& j, const std::string& w, CommitKv* c) {
  return Fields(j, w)
      .required("id", &c->id)
      .required("index", &c->index)
      .required("imm", &c->imm)
      .status();
}
Status read_command(const Json& j, const std::string& w, JoinBlobs* c) {
  std::vector<std::string> hex;
  MSI_RETURN_IF_ERROR(Fields(j, w).required("blobs", &hex).status());
  c->blobs.assign(hex.size(), "");
  for (size_t i = 0; i < hex.size(); ++i) {
    if (!internal::from_hex(hex[i], &c->blobs[i])) {
      return invalid_argument(w + ": blob " + std::to_string(i) + " is not hex");
    }
  }
  return ok_status();
}

constexpr const char* kOps[] = {
    "configure",     "exit",           "step",    "add",           "cancel",    "stats",
    "drop_expert",   "drop_attention", "card",    "add_expert",    "placement", "routed",
    "prepare",       "prepared",       "abandon", "units",         "switch",    "blobs",
    "add_attention", "connect_kv",     "send_kv", "add_prefilled", "commit_kv"};
static_assert(std::size(kOps) == std::variant_size_v<Command>);

// ---- events ----

Json event_json(const Ready& e) {
  Json j{{"index", e.index},
         {"protocol", e.protocol},
         {"rss_mb", e.rss_mb},
         {"weights_mb", e.weights_mb}};
  if (e.kv_block_size > 0) {
    j["prefix_salt"] = e.prefix_salt;
    j["kv_block_size"] = e.kv_block_size;
  }
  if (!e.kv_card.empty()) j["kv_card"] = internal::to_hex(e.kv_card);
  return j;
}
Json event_json(const Stepped& e) {
  Json ev = Json::array();
  for (const TokenEvent& t : e.events) {
    Json je{{"id", t.request_id},
            {"index", t.index},
            {"token", t.token},
            {"finished", t.finished},
            {"reason", finish_reason_name(t.finish_reason)}};
    if (!t.error.empty()) je["error"] = t.error;
    if (t.cached_tokens > 0) je["cached"] = t.cached_tokens;
    if (!t.top_logprobs.empty() || t.logprob != 0.f) {
      je["logprob"] = t.logprob;
      je["top"] = t.top_logprobs;
    }
    ev.push_back(std::move(je));
  }
  Json j{{"events", ev},
         {"running", e.running},
         {"kv_usage", e.kv_usage},
         {"preemptions", e.counters.preemptions},
         {"prefix_queries", e.counters.prefix_queries},
         {"prefix_hits", e.counters.prefix_hits}};
  if (e.discarded) j["discarded"] = true;
  if (!e.cache_stored.empty()) j["cache_stored"] = e.cache_stored;
  if (!e.cache_removed.empty()) j["cache_removed"] = e.cache_removed;
  if (!e.prefilled.empty()) {
    Json p = Json::array();
    for (const Prefilled& x : e.prefilled) {
      p.push_back(Json{{"sequence", sequence_json(x.sequence)}, {"bytes", x.bytes}});
    }
    j["prefilled"] = std::move(p);
  }
  return j;
}
Json event_json(const Added& e) { return Json{{"id", e.id}}; }
Json event_json(const Refused& e) { return Json{{"id", e.id}, {"error", e.error}}; }
Json event_json(const Cancelled& e) { return Json{{"found", e.found}, {"kv_usage", e.kv_usage}}; }
Json event_json(const StatsReport& e) { return Json{{"stats", e.stats}}; }
Json event_json(const Error& e) { return Json{{"message", e.message}}; }
Json event_json(const CardInfo& e) {
  return Json{{"card", internal::to_hex(e.card)}, {"units", e.units}};
}
Json event_json(const ExpertAdded& e) { return Json{{"worker", e.worker}}; }
Json event_json(const PlacementSet&) { return {}; }
Json event_json(const RoutedRows& e) { return Json{{"rows", e.rows}}; }
Json event_json(const Preparing& e) { return Json{{"experts", e.experts}}; }
Json event_json(const PreparedState& e) { return Json{{"ready", e.ready}}; }
Json event_json(const Abandoned&) { return {}; }
Json event_json(const UnitsSet&) { return {}; }
Json event_json(const Switched& e) {
  return Json{{"experts", e.experts}, {"rss_mb", e.rss_mb}, {"weights_mb", e.weights_mb}};
}
Json event_json(const JoinAllgather& e) { return Json{{"blob", internal::to_hex(e.blob)}}; }
Json event_json(const AttentionAdded& e) { return Json{{"worker", e.worker}}; }
Json event_json(const KvConnected&) { return {}; }
Json event_json(const KvSent& e) {
  return Json{{"id", e.id},
              {"index", e.index},
              {"bytes", e.bytes},
              {"seconds", e.seconds},
              {"writes", e.writes}};
}
Json event_json(const KvPlaced& e) {
  return Json{{"id", e.id}, {"index", e.index}, {"target", target_json(e.target)}};
}

Status read_event(const Json& j, const std::string& w, Ready* e) {
  const Status st = Fields(j, w)
                        .required("index", &e->index)
                        .required("protocol", &e->protocol)
                        .optional("rss_mb", &e->rss_mb)
                        .optional("weights_mb", &e->weights_mb)
                        .optional("prefix_salt", &e->prefix_salt)
                        .optional("kv_block_size", &e->kv_block_size)
                        .status();
  MSI_RETURN_IF_ERROR(st);
  if (!j.contains("kv_card")) return ok_status();
  Fields f(j, w);
  return read_hex(f, "kv_card", &e->kv_card, w);
}
Status read_event(const Json& j, const std::string& w, Stepped* e) {
  Json events;
  Fields f(j, w);
  f.required("events", &events)
      .optional("running", &e->running)
      .optional("kv_usage", &e->kv_usage)
      .optional("preemptions", &e->counters.preemptions)
      .optional("prefix_queries", &e->counters.prefix_queries)
      .optional("prefix_hits", &e->counters.prefix_hits)
      .optional("discarded", &e->discarded)
      .optional("cache_stored", &e->cache_stored)
      .optional("cache_removed", &e->cache_removed);
  MSI_RETURN_IF_ERROR(f.status());
  if (auto p = j.find("prefilled"); p != j.end()) {
    if (!p->is_array()) return invalid_argument(w + ": field 'prefilled' is not an array");
    for (size_t i = 0; i < p->size(); ++i) {
      const std::string at = w + ": prefilled[" + std::to_string(i) + "]";
      if (!(*p)[i].is_object()) return invalid_argument(at + " is not an object");
      Prefilled x;
      MSI_RETURN_IF_ERROR(Fields((*p)[i], at).required("bytes", &x.bytes).status());
      MSI_RETURN_IF_ERROR(read_sequence((*p)[i], at, &x.sequence));
      e->prefilled.push_back(std::move(x));
    }
  }
  const size_t cache_events = e->cache_stored.size() + e->cache_removed.size();
  if (cache_events > static_cast<size_t>(kMaxCacheEvents)) {
    return invalid_argument(w + ": " + std::to_string(cache_events) +
                            " prefix cache events, more than the " +
                            std::to_string(kMaxCacheEvents) + " a step may carry");
  }
  if (!events.is_array()) return invalid_argument(w + ": field 'events' is not an array");
  for (size_t i = 0; i < events.size(); ++i) {
    if (!events[i].is_object()) return invalid_argument(w + ": events[" + std::to_string(i) + "]");
    TokenEvent t;
    std::string reason_name;
    Fields te(events[i], w + ": events[" + std::to_string(i) + "]");
    te.required("id", &t.request_id)
        .optional("index", &t.index)
        .required("token", &t.token)
        .required("finished", &t.finished)
        .required("reason", &reason_name)
        .optional("error", &t.error)
        .optional("cached", &t.cached_tokens)
        .optional("logprob", &t.logprob)
        .optional("top", &t.top_logprobs);
    MSI_RETURN_IF_ERROR(te.status());
    auto reason = parse_finish_reason(reason_name);
    if (!reason.ok()) {
      return invalid_argument(w + ": events[" + std::to_string(i) +
                              "]: " + reason.status().message());
    }
    t.finish_reason = *reason;
    e->events.push_back(std::move(t));
  }
  return ok_status();
}
Status read_event(const Json& j, const std::string& w, Added* e) {
  return Fields(j, w).required("id", &e->id).status();
}
Status read_event(const Json& j, const std::string& w, Refused* e) {
  return Fields(j, w).required("id", &e->id).optional("error", &e->error).status();
}
Status read_event(const Json& j, const std::string& w, Cancelled* e) {
  return Fields(j, w).required("found", &e->found).optional("kv_usage", &e->kv_usage).status();
}
Status read_event(const Json& j, const std::string& w, StatsReport* e) {
  MSI_RETURN_IF_ERROR(Fields(j, w).required("stats", &e->stats).status());
  if (!e->stats.is_object()) return invalid_argument(w + ": field 'stats' is not an object");
  return ok_status();
}
Status read_event(const Json& j, const std::string& w, Error* e) {
  return Fields(j, w).required("message", &e->message).status();
}
Status read_event(const Json& j, const std::string& w, CardInfo* e) {
  Fields f(j, w);
  f.required("units", &e->units);
  return read_hex(f, "card", &e->card, w);
}
Status read_event(const Json& j, const std::string& w, ExpertAdded* e) {
  return Fields(j, w).required("worker", &e->worker).status();
}
Status read_event(const Json&, const std::string&, PlacementSet*) { return ok_status(); }
Status read_event(const Json& j, const std::string& w, RoutedRows* e) {
  return Fields(j, w).required("rows", &e->rows).status();
}
Status read_event(const Json& j, const std::string& w, Preparing* e) {
  return Fields(j, w).required("experts", &e->experts).status();
}
Status read_event(const Json& j, const std::string& w, PreparedState* e) {
  return Fields(j, w).required("ready", &e->ready).status();
}
Status read_event(const Json&, const std::string&, Abandoned*) { return ok_status(); }
Status read_event(const Json&, const std::string&, UnitsSet*) { return ok_status(); }
Status read_event(const Json& j, const std::string& w, Switched* e) {
  return Fields(j, w)
      .required("experts", &e->experts)
      .optional("rss_mb", &e->rss_mb)
      .optional("weights_mb", &e->weights_mb)
      .status();
}
Status read_event(const Json& j, const std::string& w, AttentionAdded* e) {
  return Fields(j, w).required("worker", &e->worker).status();
}
Status read_event(const Json&, const std::string&, KvConnected*) { return ok_status(); }
Status read_event(const Json& j, const std::string& w, KvSent* e) {
  return Fields(j, w)
      .required("id", &e->id)
      .required("index", &e->index)
      .required("bytes", &e->bytes)
      .optional("seconds", &e->seconds)
      .optional("writes", &e->writes)
      .status();
}
Status read_event(const Json& j, const std::string& w, KvPlaced* e) {
  MSI_RETURN_IF_ERROR(Fields(j, w).required("id", &e->id).required("index", &e->index).status());
  return read_target(j, w, &e->target);
}
Status read_event(const Json& j, const std::string& w, JoinAllgather* e) {
  Fields f(j, w);
  return read_hex(f, "blob", &e->blob, w);
}

constexpr const char* kEvents[] = {
    "ready",        "stepped",   "added",        "refused",       "cancelled", "stats",
    "error",        "card",      "expert_added", "placement_set", "routed",    "preparing",
    "prepared",     "abandoned", "units_set",    "switched",      "allgather", "attention_added",
    "kv_connected", "kv_sent",   "kv_placed"};
static_assert(std::size(kEvents) == std::variant_size_v<Event>);

// The variant alternative whose name is `name` in `names`, default-made and
// filled by `read`.
template <typename Variant, size_t I = 0, typename Read>
StatusOr<Variant> make_alternative(size_t index, Read read) {
  if constexpr (I < std::variant_size_v<Variant>) {
    if (index == I) {
      std::variant_alternative_t<I, Variant> v{};
      MSI_RETURN_IF_ERROR(read(&v));
      return Variant{std::move(v)};
    }
    return make_alternative<Variant, I + 1>(index, read);
  } else {
    return internal_error("no such alternative");
  }
}

StatusOr<Json> parse_object(std::string_view line, const std::string& what) {
  MSI_ASSIGN_OR_RETURN(Json j, parse_json(line, what));
  if (!j.is_object()) return invalid_argument(what + ": not a JSON object");
  return j;
}

// Names `key`'s value among `names`: its index.
template <size_t N>
StatusOr<size_t> name_index(const Json& j, const char* key, const char* const (&names)[N],
                            const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return invalid_argument(what + ": no \"" + key + "\" string in " + dump(j).substr(0, 200));
  }
  const std::string name = it->get<std::string>();
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) return i;
  }
  return invalid_argument(what + ": unknown " + key + " '" + name.substr(0, 100) + "'");
}

}  // namespace

const char* op_name(const Command& c) { return kOps[c.index()]; }
const char* event_name(const Event& e) { return kEvents[e.index()]; }

std::string encode(const Command& c) {
  Json j = std::visit([](const auto& m) { return command_json(m); }, c);
  if (j.is_null()) j = Json::object();
  j["op"] = op_name(c);
  return dump(j);
}

std::string encode(const Event& e) {
  Json j = std::visit([](const auto& m) { return event_json(m); }, e);
  if (j.is_null()) j = Json::object();
  j["event"] = event_name(e);
  return dump(j);
}

std::string encode(const Hello& h) {
  return dump(Json{{"event", "hello"},
                   {"rank", h.rank},
                   {"pid", h.pid},
                   {"host", h.host},
                   {"address", h.address},
                   {"secret", h.secret},
                   {"protocol", h.protocol}});
}

StatusOr<Command> decode_command(std::string_view line, const std::string& who) {
  const std::string what = who + " command";
  MSI_ASSIGN_OR_RETURN(Json j, parse_object(line, what));
  MSI_ASSIGN_OR_RETURN(size_t i, name_index(j, "op", kOps, what));
  const std::string where = what + " '" + kOps[i] + "'";
  return make_alternative<Command>(i, [&](auto* m) { return read_command(j, where, m); });
}

StatusOr<Event> decode_event(std::string_view line, const std::string& who) {
  const std::string what = who;
  MSI_ASSIGN_OR_RETURN(Json j, parse_object(line, what));
  MSI_ASSIGN_OR_RETURN(size_t i, name_index(j, "event", kEvents, what));
  const std::string where = what + ": event '" + kEvents[i] + "'";
  return make_alternative<Event>(i, [&](auto* m) { return read_event(j, where, m); });
}

StatusOr<Hello> decode_hello(std::string_view line, const std::string& who) {
  MSI_ASSIGN_OR_RETURN(Json j, parse_object(line, who));
  Hello h;
  std::string event = "hello";
  Fields f(j, who);
  f.optional("event", &event)
      .required("rank", &h.rank)
      .required("secret", &h.secret)
      .optional("protocol", &h.protocol);
  MSI_RETURN_IF_ERROR(f.status());
  if (event != "hello") return invalid_argument(who + ": expected a hello, got '" + event + "'");
  // What only names the rank in messages: a field of the wrong type is left
  // out (the router writes "?" for it), not a reason to refuse the rank.
  for (auto [key, out] : {std::pair{"host", &h.host}, std::pair{"address", &h.address}}) {
    if (auto it = j.find(key); it != j.end() && it->is_string()) *out = it->get<std::string>();
  }
  if (auto it = j.find("pid"); it != j.end()) (void)read_value(*it, &h.pid);
  return h;
}

Status check_protocol(int protocol, const std::string& who) {
  if (protocol == kProtocolVersion) return ok_status();
  return failed_precondition(who + " speaks control protocol " + std::to_string(protocol) +
                             ", this router " + std::to_string(kProtocolVersion) +
                             " (a worker from another msinfer build?)");
}

StatusOr<Configure> read_configure(int fd, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string line;
  constexpr size_t kMaxBytes = 64 << 20;  // a placement of 4096 workers is far less
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0)
      return Status(StatusCode::kDeadlineExceeded,
                    "no configuration from the router on fd " + std::to_string(fd));
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) return unavailable(std::string("poll: ") + std::strerror(errno));
    if (r <= 0) continue;
    char ch = 0;
    const ssize_t n = ::read(fd, &ch, 1);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0)
      return unavailable("the router closed fd " + std::to_string(fd) +
                         " before the configuration");
    if (ch == '\n') break;
    line += ch;
    if (line.size() > kMaxBytes) return invalid_argument("the configuration line is over 64 MiB");
  }
  MSI_ASSIGN_OR_RETURN(Command c, decode_command(line, "the router's configuration"));
  if (auto* conf = std::get_if<Configure>(&c)) return std::move(*conf);
  return invalid_argument(std::string("expected the router's configuration first, got '") +
                          op_name(c) + "'");
}

std::optional<Command> WorkerChannel::next(int timeout_ms, bool* eof) {
  std::string line;
  while (internal::read_line(in_, &pending_, &line, timeout_ms, eof)) {
    auto c = decode_command(line, who_);
    if (c.ok()) return std::move(c).value();
    std::fprintf(stderr, "msinfer: %s: ignoring a command it cannot read: %s\n", who_.c_str(),
                 c.status().message().c_str());
    send(Error{who_ + ": " + c.status().message()});
  }
  return std::nullopt;
}

bool WorkerChannel::send(const Event& e) { return internal::write_line(out_, encode(e)); }

}  // namespace control
}  // namespace msinfer::runtime
