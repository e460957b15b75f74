#include "msinfer/runtime/control.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <type_traits>

#include "internal/line_io.h"

namespace msinfer::runtime {

const char* worker_role_name(WorkerRole r) {
  return r == WorkerRole::kAttention ? "attention" : "expert";
}

StatusOr<WorkerRole> parse_worker_role(const std::string& s) {
  if (s == "attention") return WorkerRole::kAttention;
  if (s == "expert") return WorkerRole::kExpert;
  return invalid_argument("unknown worker role '" + s + "' (attention or expert)");
}

namespace control {
namespace {

// ---- typed reading of one JSON value, without exceptions ----

template <typename T>
bool read_value(const Json& v, T* out);
template <typename A, typename B>
bool read_value_compound(const Json& v, std::pair<A, B>* out);
template <typename T>
bool read_value_compound(const Json& v, std::vector<T>* out);

template <typename T>
bool read_integer(const Json& v, T* out) {
  if (!v.is_number_integer()) return false;
  if constexpr (std::is_unsigned_v<T>) {
    if (v.is_number_unsigned()) {
      const uint64_t x = v.get<uint64_t>();
      if (x > std::numeric_limits<T>::max()) return false;
      *out = static_cast<T>(x);
      return true;
    }
    const int64_t x = v.get<int64_t>();
    if (x < 0 || static_cast<uint64_t>(x) > std::numeric_limits<T>::max()) return false;
    *out = static_cast<T>(x);
    return true;
  } else {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) return false;
    const int64_t x = v.get<int64_t>();
    if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) return false;
    *out = static_cast<T>(x);
    return true;
  }
}

template <typename T>
bool read_value(const Json& v, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return false;
    *out = v.get<bool>();
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    return read_integer(v, out);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return false;
    *out = v.get<T>();
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return false;
    *out = v.get<std::string>();
    return true;
  } else if constexpr (std::is_same_v<T, Json>) {
    *out = v;
    return true;
  } else {
    return read_value_compound(v, out);
  }
}

template <typename A, typename B>
bool read_value_compound(const Json& v, std::pair<A, B>* out) {
  return v.is_array() && v.size() == 2 && read_value(v[0], &out->first) &&
         read_value(v[1], &out->second);
}

template <typename T>
bool read_value_compound(const Json& v, std::vector<T>* out) {
  if (!v.is_array()) return false;
  out->clear();
  out->reserve(v.size());
  for (const Json& x : v) {
    T t{};
    if (!read_value(x, &t)) return false;
    out->push_back(std::move(t));
  }
  return true;
}

// The fields of one message; the first error sticks, later reads do nothing.
class Fields {
 public:
  Fields(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}
  template <typename T>
  Fields& required(const char* key, T* out) {
    return read(key, out, /*optional=*/false);
  }
  template <typename T>
  Fields& optional(const char* key, T* out) {
    return read(key, out, /*optional=*/true);
  }
  Status status() const { return status_; }

 private:
  template <typename T>
  Fields& read(const char* key, T* out, bool optional) {
    if (!status_.ok()) return *this;
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (!optional) status_ = invalid_argument(where_ + ": field '" + key + "' is missing");
      return *this;
    }
    if (!read_value(*it, out)) {
      status_ =
          invalid_argument(where_ + ": field '" + key + "' has the wrong type or range: " +
                           it->dump(-1, ' ', false, Json::error_handler_t::replace).substr(0, 200));
    }
    return *this;
  }
  const Json& j_;
  std::string where_;
  Status status_ = ok_status();
};

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Binary blobs (peer cards) travel as lowercase hex.
Status read_hex(Fields& f, const char* key, std::string* out, const std::string& where) {
  std::string hex;
  f.required(key, &hex);
  MSI_RETURN_IF_ERROR(f.status());
  if (!internal::from_hex(hex, out)) {
    return invalid_argument(where + ": field '" + key + "' is not hex");
  }
  return ok_status();
}

StatusOr<Placement> read_placement(const Json& j, const std::string& where) {
  auto it = j.find("placement");
  if (it == j.end() || !it->is_object()) {
    return invalid_argument(where + ": field 'placement' is missing or not an object");
  }
  auto ex = it->find("experts");
  const int experts = ex != it->end() && ex->is_array() ? static_cast<int>(ex->size()) : 0;
  return Placement::from_json(*it, experts, where + ": placement");
}

// ---- commands ----

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
              {"n", r.n}};
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
      .optional("n", &r.n);
  return f.status();
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
    "exit",           "step",    "add",        "cancel",    "stats",  "drop_expert",
    "drop_attention", "card",    "add_expert", "placement", "routed", "prepare",
    "prepared",       "abandon", "units",      "switch",    "blobs",  "add_attention"};
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

Status read_event(const Json& j, const std::string& w, Ready* e) {
  return Fields(j, w)
      .required("index", &e->index)
      .required("protocol", &e->protocol)
      .optional("rss_mb", &e->rss_mb)
      .optional("weights_mb", &e->weights_mb)
      .optional("prefix_salt", &e->prefix_salt)
      .optional("kv_block_size", &e->kv_block_size)
      .status();
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
Status read_event(const Json& j, const std::string& w, JoinAllgather* e) {
  Fields f(j, w);
  return read_hex(f, "blob", &e->blob, w);
}

constexpr const char* kEvents[] = {
    "ready",    "stepped",   "added",        "refused",       "cancelled", "stats",
    "error",    "card",      "expert_added", "placement_set", "routed",    "preparing",
    "prepared", "abandoned", "units_set",    "switched",      "allgather", "attention_added"};
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
