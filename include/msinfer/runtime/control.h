// The control protocol between the router and its workers: one struct per
// message, encoded in one place (control.cc). docs/ARCHITECTURE.md, "How a
// control message flows".
//
// Framing: one JSON object per line, over the pipes of a forked worker (the
// router writes fd 3, reads fd 4) or the TCP socket of a launched rank.
// Commands (router -> worker) carry {"op": NAME}, events (worker -> router)
// {"event": NAME}; every other field is the struct's, by the same name.
// Every command but Configure, DropExpert, DropAttention and Exit is answered by exactly
// one event: the one its comment names, or Error.
//
// Versioning: a worker's first event, Ready (or, for a launched rank, the
// Hello before it), carries kProtocolVersion; the router refuses a worker
// that speaks another (check_protocol). Bump it whenever a message changes.
//
// Decoding never throws: a line that is not JSON, names an unknown op or
// event, or has a field of the wrong type or range is an INVALID_ARGUMENT
// naming the message and the field. Encoding never fails (strings that are
// not UTF-8 are written with U+FFFD in place of the bad bytes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "msinfer/core/json.h"
#include "msinfer/core/status.h"
#include "msinfer/runtime/engine.h"
#include "msinfer/runtime/placement.h"
#include "msinfer/runtime/worker_config.h"

namespace msinfer::runtime {

// The two kinds of worker process of a disaggregated deployment.
// Prefill workers (P/D disaggregation) are no bootstrap ranks: they reach
// the attention workers over a transport of their own (ConnectKv).
enum class WorkerRole { kAttention, kExpert, kPrefill };
const char* worker_role_name(WorkerRole r);  // "attention", "expert", "prefill"
StatusOr<WorkerRole> parse_worker_role(const std::string& s);

namespace control {

// 2: AddAttention / AttentionAdded, GetCard on expert processes, SetUnits on
// attention workers (a replacement attention worker joins); separately, Add
// carrying n and Stepped's events their sequence's index.
// 3: both of those.
// 5: Ready carries the prefix cache's salt and block size, Stepped the
// cache's registrations and evictions (cache-aware routing).
// 6: Configure, a forked worker's configuration as one document.
// 7: prefill workers: Add's prefill_only, Stepped's prefilled, Ready's
// kv_card, ConnectKv / KvConnected, SendKv / KvSent, AddPrefilled.
// 8: K/V written into the attention worker's pool: AddPrefilled answered
// with KvPlaced, CommitKv, SendKv's target.
inline constexpr int kProtocolVersion = 8;

// The most prefix-cache events (hashes) one Stepped carries; the rest go with
// the next steps (KvCache::take_cache_events). 4096 hashes are ~80 KB of JSON,
// more than a step registers or evicts unless a prompt of 512k tokens is
// admitted at once (a step computes at most max_step_tokens tokens).
inline constexpr int64_t kMaxCacheEvents = 4096;

// ---- commands: router -> worker ----

// A worker the router forked: its first command, the deployment's
// configuration and which worker it is (no answer: the worker bootstraps and
// says Ready). A rank that a launcher (mpirun / srun) started reads the job's
// command line instead.
struct Configure {
  WorkerConfig config;
  WorkerRole role = WorkerRole::kAttention;
  int index = 0, tp_rank = 0;
};
// Stop serving and exit (no answer). Also read mid-step by an attention worker.
struct Exit {};
// Attention worker: run one engine step. Answer: Stepped.
struct Step {};
// Attention worker: queue a request. Answer: Added or Refused.
struct Add {
  GenerationRequest request;
};
// Attention worker: remove a request. Answer: Cancelled.
struct Cancel {
  int64_t id = 0;
};
// Any worker: its WorkerStats since the last reset, then reset if asked.
// Answer: StatsReport.
struct GetStats {
  bool reset = false;
};
// Attention worker: expert worker `worker` died (no answer; read mid-step
// too). Its rows go to the replicas, or with keep_placement the routing stays
// and a replacement is awaited.
struct DropExpert {
  int worker = 0;
  bool keep_placement = false;
};
// Expert process: attention worker `worker` died; serve the others (no answer).
struct DropAttention {
  int worker = 0;
};
// Attention worker: its combine card and unit counts, for a replacement
// expert worker that joins; expert process: its dispatch card and the units
// it served, for a replacement attention worker. Answer: CardInfo.
struct GetCard {};
// Attention worker: the replacement for dropped expert worker `worker`, at
// `card` (a comm::PeerCard's bytes), takes back `shares` (expert, share).
// Answer: ExpertAdded.
struct AddExpert {
  int worker = 0;
  std::string card;
  std::vector<std::pair<int, double>> shares;
};
// Attention worker, online rebalancing: route by `placement` from the next
// step. Answer: PlacementSet.
struct SetPlacement {
  Placement placement;
};
// Expert process: rows per (layer, expert) since the last GetRouted.
// Answer: RoutedRows.
struct GetRouted {};
// Expert process: load the experts `placement` gives it that it lacks, on a
// thread of their own. Answer: Preparing.
struct Prepare {
  Placement placement;
};
// Expert process: is the prepared load done? Answer: PreparedState (or Error
// when the load failed).
struct GetPrepared {};
// Expert process: forget a prepared placement. Answer: Abandoned.
struct Abandon {};
// A replacement (expert process or attention worker), before its first
// unit: the units each slot has exchanged so far. Answer: UnitsSet.
struct SetUnits {
  std::vector<int64_t> served;
};
// Expert process: serve the prepared placement from the next unit on.
// Answer: Switched.
struct Switch {};
// A joining replacement: the answer to its JoinAllgather, one blob per rank.
struct JoinBlobs {
  std::vector<std::string> blobs;
};
// Expert process: the replacement for dropped attention worker `worker`, at
// `card` (its combine region, a comm::PeerCard's bytes), is served from the
// next unit on. Answer: AttentionAdded.
struct AddAttention {
  int worker = 0;
  std::string card;
};

// Prefill worker: the attention workers' K/V staging regions, by attention
// worker (comm::PeerCard bytes; empty for one that is gone). Answer:
// KvConnected.
struct ConnectKv {
  std::vector<std::string> cards;
};
// Where a prefilled sequence's K/V go on an attention worker: blocks of
// its KV pool (`region`: the pool's comm::RemoteRegion bytes; `placed`:
// Engine::place_prefilled's blocks), or, with `region` empty, its staging
// region (ConnectKv's card) from offset 0.
struct KvTarget {
  std::string region;
  PlacedKv placed;
};
// Prefill worker: write the K/V of sequence (id, index), prefilled and
// waiting, to attention worker `worker`'s `target`, the last write raising
// immediate `imm` there (the others 0; writes to one peer complete in
// order, transport.h); the sequence leaves this worker. Answer: KvSent, or
// Refused (a target that does not fit; the sequence stays).
struct SendKv {
  int64_t id = 0;
  int index = 0;
  int worker = 0;
  uint32_t imm = 0;
  KvTarget target;
};
// Attention worker: a prefilled sequence with `bytes` of K/V: blocks for
// them taken in its pool when they are free now (Engine::place_prefilled),
// else its staging region. Answer: KvPlaced (where to write), or Refused.
struct AddPrefilled {
  PrefilledSequence sequence;  // its kv empty: the bytes come over the transport
  int64_t bytes = 0;
};
// Attention worker: the K/V of AddPrefilled's sequence (id, index) are being
// written; wait for immediate `imm`, then decode it (Engine::
// commit_prefilled, or from the staging region Engine::add_prefilled).
// Answer: Added, or Refused (nothing came in time; placed blocks stay held
// until the router's Cancel, once the prefill worker can write no more).
struct CommitKv {
  int64_t id = 0;
  int index = 0;
  uint32_t imm = 0;
};

using Command =
    std::variant<Configure, Exit, Step, Add, Cancel, GetStats, DropExpert, DropAttention, GetCard,
                 AddExpert, SetPlacement, GetRouted, Prepare, GetPrepared, Abandon, SetUnits,
                 Switch, JoinBlobs, AddAttention, ConnectKv, SendKv, AddPrefilled, CommitKv>;

// ---- events: worker -> router ----

// The worker's weights are loaded and its M2N wired (the handshake).
struct Ready {
  // This version's Ready of worker `index`.
  static Ready of(int index, double rss_mb = 0, double weights_mb = 0) {
    Ready r;
    r.index = index;
    r.protocol = kProtocolVersion;
    r.rss_mb = rss_mb;
    r.weights_mb = weights_mb;
    return r;
  }
  int index = 0;
  int protocol = 0;
  double rss_mb = 0, weights_mb = 0;
  // An attention worker with prefix caching: its cache's chain salt and block
  // size (KvCache::prefix_salt, block_size), so that the router computes the
  // hashes it registers blocks under (prefix_hash.h); kv_block_size 0: no
  // prefix caching (or an expert process).
  uint64_t prefix_salt = 0;
  int64_t kv_block_size = 0;
  // An attention worker of a deployment with prefill workers: its K/V
  // staging region (comm::PeerCard bytes); empty otherwise.
  std::string kv_card;
};
// A sequence a prefill worker holds for SendKv: all but its K/V, and their size.
struct Prefilled {
  PrefilledSequence sequence;  // its kv empty
  int64_t bytes = 0;
};
// The answer to Step. `running`: requests running or waiting; `discarded`: the
// step lost an expert worker's answers and runs again.
struct Stepped {
  std::vector<TokenEvent> events;
  int64_t running = 0;
  double kv_usage = 0;
  bool discarded = false;
  EngineCounters counters;  // the worker's engine's, so far
  // Prefix cache (with Ready::kv_block_size > 0): chain hashes of the blocks
  // registered and unregistered (evicted) since the last Stepped, a hash once
  // per layer group it changed in; at most kMaxCacheEvents together.
  std::vector<uint64_t> cache_stored, cache_removed;
  // A prefill worker: the sequences that have their first token and wait
  // for SendKv.
  std::vector<Prefilled> prefilled;
};
struct Added {
  int64_t id = 0;
};
struct Refused {
  int64_t id = 0;
  std::string error;
};
struct Cancelled {
  bool found = false;
  double kv_usage = 0;
};
// WorkerStats::to_json() (attention workers add "micro_batch_balance").
struct StatsReport {
  Json stats;
};
// A command failed, or could not be read (malformed, unknown): `message` says why.
struct Error {
  std::string message;
};
struct CardInfo {
  std::string card;  // comm::PeerCard bytes
  std::vector<int64_t> units;
};
struct ExpertAdded {
  int worker = 0;
};
struct PlacementSet {};
// Rows per (layer, expert), index layer * experts + expert.
struct RoutedRows {
  std::vector<int64_t> rows;
};
struct Preparing {
  int64_t experts = 0;  // expert slices being loaded
};
struct PreparedState {
  bool ready = false;
};
struct Abandoned {};
struct UnitsSet {};
struct Switched {
  std::vector<int> experts;
  double rss_mb = 0, weights_mb = 0;
};
// A joining replacement's bootstrap allgather (router_pipe_bootstrap); the
// router answers with JoinBlobs.
struct JoinAllgather {
  std::string blob;
};
struct AttentionAdded {
  int worker = 0;
};

struct KvConnected {};
// Where an AddPrefilled sequence's K/V go (AddPrefilled).
struct KvPlaced {
  int64_t id = 0;
  int index = 0;
  KvTarget target;
};
// A prefill worker wrote a sequence's K/V (SendKv): its bytes, in how many
// writes, and how long they took.
struct KvSent {
  int64_t id = 0;
  int64_t index = 0;
  int64_t bytes = 0;
  double seconds = 0;
  int64_t writes = 0;
};

using Event =
    std::variant<Ready, Stepped, Added, Refused, Cancelled, StatsReport, Error, CardInfo,
                 ExpertAdded, PlacementSet, RoutedRows, Preparing, PreparedState, Abandoned,
                 UnitsSet, Switched, JoinAllgather, AttentionAdded, KvConnected, KvSent, KvPlaced>;

// A launched rank's first line on its control socket (under mpirun / srun).
struct Hello {
  int64_t rank = 0;
  int64_t pid = 0;
  std::string host, address, secret;
  int protocol = 0;
};

std::string encode(const Command& c);
std::string encode(const Event& e);
std::string encode(const Hello& h);
// `who` names the sender in errors ("attention worker 1").
StatusOr<Command> decode_command(std::string_view line, const std::string& who);
StatusOr<Event> decode_event(std::string_view line, const std::string& who);
StatusOr<Hello> decode_hello(std::string_view line, const std::string& who);

const char* op_name(const Command& c);   // "step", "add", ...
const char* event_name(const Event& e);  // "ready", "stepped", ...

// FAILED_PRECONDITION naming `who` and both versions unless `protocol` is ours.
Status check_protocol(int protocol, const std::string& who);

// The event `e` as a T: an Error event becomes UNAVAILABLE with its message,
// another event INTERNAL naming `who`, what was expected and what came.
template <typename T>
StatusOr<T> expect(Event e, const std::string& who) {
  if (auto* t = std::get_if<T>(&e)) return std::move(*t);
  if (auto* err = std::get_if<Error>(&e)) return Status(StatusCode::kUnavailable, err->message);
  return internal_error(who + ": expected the event '" + event_name(Event{T{}}) + "', got '" +
                        event_name(e) + "'");
}

// A forked worker's configuration: the first line on `fd` (read a byte at a
// time, so nothing after it is consumed), which must be a Configure.
// DEADLINE_EXCEEDED after `timeout_ms`; INVALID_ARGUMENT for anything else.
StatusOr<Configure> read_configure(int fd, int timeout_ms);

// The worker's end of the control channel: reads commands from `in_fd` and
// writes events to `out_fd`. A line it cannot read as a command is logged on
// stderr and answered with an Error event, and reading goes on. Not thread
// safe; the fds stay owned by the caller.
class WorkerChannel {
 public:
  WorkerChannel(int in_fd, int out_fd, std::string who)
      : in_(in_fd), out_(out_fd), who_(std::move(who)) {}
  // The next command within `timeout_ms` (0: what has arrived; < 0: wait);
  // nullopt on timeout or at the end of the input (then *eof, if given, is set).
  std::optional<Command> next(int timeout_ms, bool* eof = nullptr);
  // False when the router's end is closed.
  bool send(const Event& e);
  const std::string& who() const { return who_; }
  int in_fd() const { return in_; }

 private:
  int in_, out_;
  std::string who_;
  std::string pending_;  // bytes read past the last whole line
};

}  // namespace control
}  // namespace msinfer::runtime
