// The router <-> worker control protocol (runtime/control.h): every message
// round-trips, malformed and unknown ones are errors (never exceptions), the
// version is checked, and a worker's channel answers a line it cannot read
// with an error event and goes on.
#include "msinfer/runtime/control.h"

#include <fcntl.h>
#include <unistd.h>

#include <set>

#include "gtest/gtest.h"

namespace msinfer::runtime::control {
namespace {

Placement two_worker_placement() {
  Placement p;
  p.workers = 2;
  p.replicas = {{{0, 1.0}}, {{1, 1.0}}, {{0, 0.25}, {1, 0.75}}, {{1, 1.0}}};
  p.tp_expert = 2;
  p.tp_expert_reduce = ExpertReduce::kAllReduce;
  return p;
}

// A deployment's configuration with no field left at its default.
Configure every_field_configure() {
  Configure c;
  WorkerConfig& w = c.config;
  w.model_dir = "/models/m";
  w.attention_workers = 3;
  w.expert_workers = 2;
  w.engine.kv_cache_bytes = 3 << 20;
  w.engine.block_size = 16;
  w.engine.max_step_tokens = 96;
  w.engine.micro_batches = 2;
  w.engine.attention_cost_per_token = 1.5;
  w.engine.attention_cost_per_position = 0.25;
  w.engine.prefix_caching = false;
  w.engine.prefix_cache_salt = 18446744073709551557ull;
  w.tp_expert = 2;
  w.tp_expert_reduce = ExpertReduce::kAllReduce;
  w.shared_experts = SharedExpertsOn::kExpert;
  w.tp_attention = 2;
  w.attention_threads = 3;
  w.expert_threads = 1;
  w.placement = two_worker_placement();
  w.transport = comm::TransportKind::kSocket;
  w.address = "10.0.0.1";
  w.timeout_ms = 1234;
  w.weights = kernels::cpu::WeightFormat::kInt8;
  w.attention_device = "cuda:1";
  w.expert_device = "cuda:0";
  w.routing = RoutingPolicy::kRoundRobin;
  w.routing_load_slack = 99;
  w.resubmit = w.respawn = true;
  w.rebalance_every = 5;
  w.rebalance_slots = 4;
  w.rebalance_gain = 1.25;
  w.rebalance_fixed_rows = 0.5;
  c.role = WorkerRole::kExpert;
  c.index = 1;
  c.tp_rank = 1;
  return c;
}

// A prefilled sequence without its K/V, no field at its default.
PrefilledSequence a_prefilled_sequence() {
  PrefilledSequence p;
  p.request.id = 42;
  p.request.prompt = {5, 9, 22};
  p.request.sampling.max_tokens = 7;
  p.request.sampling.temperature = 0.5f;
  p.request.sampling.seed = 11;
  p.index = 0;
  p.tokens = {5, 9, 22, 17};
  p.computed = 3;
  p.generated = 1;
  p.rng = "123 456";
  p.kv_layout = 18446744073709551557ull;
  return p;
}

// One of every command, no field left at its default.
// Blocks of an attention worker's KV pool: two layer groups.
KvTarget a_pool_target() {
  KvTarget t;
  t.region = std::string("\x00\x01pool\xff", 7);
  t.placed.table = {{3, 4, 9}, {0}};
  t.placed.pool_blocks = 12;
  t.placed.skip_blocks = 2;
  return t;
}

std::vector<Command> every_command() {
  Add add;
  add.request.id = 42;
  add.request.prompt = {5, 9, 22};
  SamplingParams& s = add.request.sampling;
  s.max_tokens = 7;
  s.temperature = 0.5f;
  s.top_k = 3;
  s.top_p = 0.75f;
  s.seed = 18446744073709551615ull;
  s.ignore_eos = true;
  s.stop_token_ids = {1, 2};
  s.frequency_penalty = 0.25f;
  s.presence_penalty = -0.5f;
  s.min_p = 0.125f;
  s.repetition_penalty = 1.5f;
  s.min_tokens = 2;
  s.logprobs = 4;
  add.request.n = 3;
  return {Exit{},
          Step{},
          add,
          Cancel{-3},
          GetStats{true},
          DropExpert{3, true},
          DropAttention{1},
          GetCard{},
          AddExpert{2, std::string("\x00\xff card", 7), {{0, 0.5}, {3, 1.0}}},
          SetPlacement{two_worker_placement()},
          GetRouted{},
          Prepare{two_worker_placement()},
          GetPrepared{},
          Abandon{},
          SetUnits{{4, 5, 6}},
          Switch{},
          JoinBlobs{{"a", std::string("\x01\x02", 2), ""}},
          AddAttention{1, std::string("\x00\xfe card", 7)},
          every_field_configure(),
          ConnectKv{{std::string("\x01"
                                 "card",
                                 5),
                     ""}},
          SendKv{42, 0, 1, 4294967295u, {}},
          SendKv{42, 1, 1, 7, a_pool_target()},
          AddPrefilled{a_prefilled_sequence(), 65536},
          CommitKv{42, 1, 4294967295u}};
}

std::vector<Event> every_event() {
  TokenEvent t1;
  t1.request_id = 42;
  t1.token = 17;
  t1.finish_reason = runtime::FinishReason::kNone;
  t1.cached_tokens = 128;
  TokenEvent t2;
  t2.request_id = 43;
  t2.index = 2;
  t2.token = 2;
  t2.finished = true;
  t2.finish_reason = runtime::FinishReason::kEos;
  t2.logprob = -0.25f;
  t2.top_logprobs = {{2, -0.25f}, {9, -1.5f}};
  TokenEvent t3;
  t3.request_id = 44;
  t3.finished = true;
  t3.finish_reason = runtime::FinishReason::kError;
  t3.error = "lost";
  Ready ready = Ready::of(3, 120.5, 64.25);
  ready.prefix_salt = 18446744073709551557ull;
  ready.kv_block_size = 128;
  ready.kv_card = std::string("\x00kv card", 8);
  Stepped stepped{{t1, t2, t3}, 5, 0.5, true, {2, 1000, 256}, {18446744073709551557ull, 7},
                  {9},          {}};
  stepped.prefilled.push_back(Prefilled{a_prefilled_sequence(), 65536});
  return {ready,
          stepped,
          Added{42},
          Refused{43, "KV budget"},
          Cancelled{true, 0.25},
          StatsReport{Json{{"busy_s", 1.5}, {"tokens", 7}}},
          Error{"expert worker 1: no"},
          CardInfo{std::string("\x00\x01\x02", 3), {3, 4}},
          ExpertAdded{1},
          PlacementSet{},
          RoutedRows{{0, 3, 9, 1}},
          Preparing{2},
          PreparedState{true},
          Abandoned{},
          UnitsSet{},
          Switched{{0, 2}, 300.0, 128.0},
          JoinAllgather{std::string("\x10\x00\x7f", 3)},
          AttentionAdded{1},
          KvConnected{},
          KvSent{42, 0, 65536, 0.002, 16},
          KvPlaced{42, 0, {}},
          KvPlaced{42, 1, a_pool_target()}};
}

TEST(ControlTest, EveryCommandRoundTrips) {
  std::set<size_t> seen;
  for (const Command& c : every_command()) {
    seen.insert(c.index());
    const std::string line = encode(c);
    auto back = decode_command(line, "test");
    ASSERT_TRUE(back.ok()) << back.status().message() << ": " << line;
    EXPECT_EQ(back->index(), c.index()) << line;
    EXPECT_EQ(encode(*back), line);
    EXPECT_EQ(line.find('\n'), std::string::npos);
  }
  EXPECT_EQ(seen.size(), std::variant_size_v<Command>) << "a command has no round-trip case";
}

TEST(ControlTest, EveryEventRoundTrips) {
  std::set<size_t> seen;
  for (const Event& e : every_event()) {
    seen.insert(e.index());
    const std::string line = encode(e);
    auto back = decode_event(line, "test");
    ASSERT_TRUE(back.ok()) << back.status().message() << ": " << line;
    EXPECT_EQ(back->index(), e.index()) << line;
    EXPECT_EQ(encode(*back), line);
  }
  EXPECT_EQ(seen.size(), std::variant_size_v<Event>) << "an event has no round-trip case";
}

TEST(ControlTest, FieldsSurviveTheRoundTrip) {
  auto add = decode_command(encode(every_command()[2]), "test");
  ASSERT_TRUE(add.ok());
  const GenerationRequest& r = std::get<Add>(*add).request;
  EXPECT_EQ(r.id, 42);
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{5, 9, 22}));
  EXPECT_EQ(r.sampling.seed, 18446744073709551615ull);
  EXPECT_EQ(r.sampling.logprobs, 4);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -0.5f);
  EXPECT_EQ(r.n, 3);
  auto prep = decode_command(encode(Prepare{two_worker_placement()}), "test");
  ASSERT_TRUE(prep.ok());
  const Placement& p = std::get<Prepare>(*prep).placement;
  EXPECT_EQ(p.workers, 2);
  EXPECT_EQ(p.tp_expert, 2);
  EXPECT_EQ(p.replicas[2], (std::vector<std::pair<int, double>>{{0, 0.25}, {1, 0.75}}));
  auto card = decode_command(encode(every_command()[8]), "test");
  ASSERT_TRUE(card.ok());
  EXPECT_EQ(std::get<AddExpert>(*card).card, std::string("\x00\xff card", 7));
  auto step = decode_event(encode(every_event()[1]), "test");
  ASSERT_TRUE(step.ok());
  const Stepped& s = std::get<Stepped>(*step);
  ASSERT_EQ(s.events.size(), 3u);
  EXPECT_EQ(s.events[1].top_logprobs,
            (std::vector<std::pair<int32_t, float>>{{2, -0.25f}, {9, -1.5f}}));
  EXPECT_EQ(s.events[2].error, "lost");
  EXPECT_EQ(s.events[1].index, 2);
  EXPECT_EQ(s.events[0].index, 0);
  EXPECT_TRUE(s.discarded);
  EXPECT_EQ(s.counters.prefix_queries, 1000);
  EXPECT_EQ(s.counters.prefix_hits, 256);
  EXPECT_EQ(s.events[0].cached_tokens, 128);
  EXPECT_EQ(s.events[1].cached_tokens, 0);
  // Cache-aware routing (protocol 5): full 64-bit hashes both ways.
  EXPECT_EQ(s.cache_stored, (std::vector<uint64_t>{18446744073709551557ull, 7}));
  EXPECT_EQ(s.cache_removed, (std::vector<uint64_t>{9}));
  auto ready = decode_event(encode(every_event()[0]), "test");
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(std::get<Ready>(*ready).prefix_salt, 18446744073709551557ull);
  EXPECT_EQ(std::get<Ready>(*ready).kv_block_size, 128);
  // A step may carry at most kMaxCacheEvents hashes; more is refused, named.
  Stepped big;
  big.cache_stored.assign(static_cast<size_t>(kMaxCacheEvents) + 1, 3);
  auto refused = decode_event(encode(big), "attention worker 1");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("prefix cache events"), std::string::npos)
      << refused.status().message();
  // Hashes that are not unsigned 64-bit integers are refused, named.
  auto negative = decode_event(R"({"event": "stepped", "events": [], "cache_removed": [-1]})",
                               "attention worker 1");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("cache_removed"), std::string::npos)
      << negative.status().message();
}

// A forked worker's configuration travels whole: every field of
// WorkerConfig, the EngineOptions it embeds, the enums, the placement.
TEST(ControlTest, ConfigureCarriesTheWholeConfiguration) {
  const Configure sent = every_field_configure();
  auto back = decode_command(encode(sent), "test");
  ASSERT_TRUE(back.ok()) << back.status().message();
  const Configure& got = std::get<Configure>(*back);
  EXPECT_EQ(worker_config_json(got.config), worker_config_json(sent.config));
  EXPECT_EQ(got.role, WorkerRole::kExpert);
  EXPECT_EQ(got.index, 1);
  EXPECT_EQ(got.tp_rank, 1);
  const WorkerConfig& w = got.config;
  EXPECT_EQ(w.engine.kv_cache_bytes, 3 << 20);
  EXPECT_EQ(w.engine.block_size, 16);
  EXPECT_EQ(w.engine.max_step_tokens, 96);
  EXPECT_EQ(w.engine.micro_batches, 2);
  EXPECT_DOUBLE_EQ(w.engine.attention_cost_per_position, 0.25);
  EXPECT_FALSE(w.engine.prefix_caching);
  EXPECT_EQ(w.engine.prefix_cache_salt, 18446744073709551557ull);
  EXPECT_EQ(w.tp_expert_reduce, ExpertReduce::kAllReduce);
  EXPECT_EQ(w.shared_experts, SharedExpertsOn::kExpert);
  EXPECT_EQ(w.routing, RoutingPolicy::kRoundRobin);
  EXPECT_EQ(w.transport, comm::TransportKind::kSocket);
  EXPECT_EQ(w.weights, kernels::cpu::WeightFormat::kInt8);
  EXPECT_EQ(w.placement.replicas[2], (std::vector<std::pair<int, double>>{{0, 0.25}, {1, 0.75}}));
  EXPECT_EQ(w.attention_device, "cuda:1");
  EXPECT_TRUE(w.resubmit && w.respawn);
  EXPECT_DOUBLE_EQ(w.rebalance_fixed_rows, 0.5);
  // What a document leaves out keeps WorkerConfig's defaults.
  auto minimal = worker_config_from_json(Json{{"model_dir", "m"}}, "doc");
  ASSERT_TRUE(minimal.ok()) << minimal.status().message();
  EXPECT_EQ(worker_config_json(*minimal), worker_config_json([] {
              WorkerConfig d;
              d.model_dir = "m";
              return d;
            }()));
}

// The configuration is the first line of the command pipe, read a byte at a
// time: the commands after it stay for the worker's channel.
TEST(ControlTest, AWorkerReadsItsConfigurationAndNothingMore) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string lines = encode(every_field_configure()) + "\n" + encode(Step{}) + "\n";
  ASSERT_EQ(::write(fds[1], lines.data(), lines.size()), static_cast<ssize_t>(lines.size()));
  auto c = read_configure(fds[0], 1000);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->config.model_dir, "/models/m");
  WorkerChannel ch(fds[0], fds[1], "worker");
  auto next = ch.next(1000);
  ASSERT_TRUE(next.has_value());
  EXPECT_TRUE(std::holds_alternative<Step>(*next));
  // Anything else first is an error naming what came; so is a closed pipe,
  // and nothing at all within the timeout.
  const std::string step = encode(Step{}) + "\n";
  ASSERT_EQ(::write(fds[1], step.data(), step.size()), static_cast<ssize_t>(step.size()));
  auto wrong = read_configure(fds[0], 1000);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("got 'step'"), std::string::npos)
      << wrong.status().message();
  auto none = read_configure(fds[0], 50);
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
  ::close(fds[1]);
  EXPECT_EQ(read_configure(fds[0], 1000).status().code(), StatusCode::kUnavailable);
  ::close(fds[0]);
}

// Prefill/decode disaggregation's messages keep every field: the sequence
// (its sampler state and K/V layout too), the staging card, the pool's
// region and blocks, the immediate.
TEST(ControlTest, PrefilledSequencesSurviveTheRoundTrip) {
  auto add = decode_command(encode(AddPrefilled{a_prefilled_sequence(), 65536}), "test");
  ASSERT_TRUE(add.ok()) << add.status().message();
  const AddPrefilled& a = std::get<AddPrefilled>(*add);
  EXPECT_EQ(a.bytes, 65536);
  EXPECT_EQ(a.sequence.tokens, (std::vector<int32_t>{5, 9, 22, 17}));
  EXPECT_EQ(a.sequence.rng, "123 456");
  EXPECT_EQ(a.sequence.kv_layout, 18446744073709551557ull);
  EXPECT_EQ(a.sequence.request.sampling.seed, 11u);
  EXPECT_EQ(a.sequence.request.prompt, (std::vector<int32_t>{5, 9, 22}));
  auto send = decode_command(encode(SendKv{42, 1, 1, 7, a_pool_target()}), "test");
  ASSERT_TRUE(send.ok()) << send.status().message();
  const SendKv& sk = std::get<SendKv>(*send);
  EXPECT_EQ(sk.imm, 7u);
  EXPECT_EQ(sk.target.region, a_pool_target().region);
  EXPECT_EQ(sk.target.placed.table, a_pool_target().placed.table);
  EXPECT_EQ(sk.target.placed.pool_blocks, 12);
  EXPECT_EQ(sk.target.placed.skip_blocks, 2);
  auto staged = decode_event(encode(KvPlaced{42, 0, {}}), "test");
  ASSERT_TRUE(staged.ok());
  EXPECT_TRUE(std::get<KvPlaced>(*staged).target.region.empty());
  auto ready = decode_event(encode(every_event()[0]), "test");
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(std::get<Ready>(*ready).kv_card, std::string("\x00kv card", 8));
  auto step = decode_event(encode(every_event()[1]), "test");
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(std::get<Stepped>(*step).prefilled.size(), 1u);
  EXPECT_EQ(std::get<Stepped>(*step).prefilled[0].bytes, 65536);
  EXPECT_EQ(std::get<Stepped>(*step).prefilled[0].sequence.generated, 1);
  GenerationRequest r;
  r.id = 1;
  r.prompt = {3};
  r.prefill_only = true;
  auto prefill = decode_command(encode(Add{r}), "test");
  ASSERT_TRUE(prefill.ok());
  EXPECT_TRUE(std::get<Add>(*prefill).request.prefill_only);
  for (const char* bad :
       {R"({"op": "add_prefilled", "bytes": -1, "sequence": {}})",
        R"({"op": "add_prefilled", "bytes": 8})", R"({"op": "connect_kv", "cards": ["zz"]})",
        R"({"op": "send_kv", "id": 1, "index": 0, "worker": 0, "imm": -1, "target": {}})",
        R"({"op": "send_kv", "id": 1, "index": 0, "worker": 0, "imm": 1})",
        R"({"op": "send_kv", "id": 1, "index": 0, "worker": 0, "imm": 1, "target": []})",
        R"({"op": "send_kv", "id": 1, "index": 0, "worker": 0, "imm": 1,
            "target": {"region": "00", "table": [[1, "a"]], "pool_blocks": 4}})",
        R"({"op": "send_kv", "id": 1, "index": 0, "worker": 0, "imm": 1,
            "target": {"region": "zz", "table": [], "pool_blocks": 4}})",
        R"({"op": "commit_kv", "id": 1, "index": 0})"}) {
    auto d = decode_command(bad, "test");
    EXPECT_FALSE(d.ok()) << bad;
  }
}

TEST(ControlTest, AnAddWithOnlyItsIdAndPromptTakesTheSamplingDefaults) {
  auto c = decode_command(R"({"op": "add", "id": 1, "prompt": [3]})", "test");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const SamplingParams& s = std::get<Add>(*c).request.sampling;
  const SamplingParams defaults;
  EXPECT_EQ(s.max_tokens, defaults.max_tokens);
  EXPECT_EQ(s.top_p, defaults.top_p);
  EXPECT_EQ(s.repetition_penalty, defaults.repetition_penalty);
  EXPECT_EQ(s.logprobs, defaults.logprobs);
}

TEST(ControlTest, MalformedMessagesAreErrorsNamingTheField) {
  struct Case {
    const char* line;
    const char* says;
  };
  const Case commands[] = {
      {"", "test command"},
      {"not json", "test command"},
      {"[1, 2]", "not a JSON object"},
      {R"({"id": 1})", "no \"op\""},
      {R"({"op": 7})", "no \"op\""},
      {R"({"op": "dance"})", "unknown op 'dance'"},
      {R"({"op": "add", "prompt": [1]})", "'id' is missing"},
      {R"({"op": "add", "id": "x", "prompt": [1]})", "'id' has the wrong type"},
      {R"({"op": "add", "id": 1, "prompt": [1.5]})", "'prompt'"},
      {R"({"op": "add", "id": 1, "prompt": [1], "max_tokens": 4294967296})", "'max_tokens'"},
      {R"({"op": "add", "id": 1, "prompt": [1], "seed": -1})", "'seed'"},
      {R"({"op": "drop_expert", "worker": true})", "'worker'"},
      {R"({"op": "add_expert", "worker": 1, "shares": [], "card": "zz"})", "not hex"},
      {R"({"op": "add_expert", "worker": 1, "shares": [[1]], "card": ""})", "'shares'"},
      {R"({"op": "prepare", "placement": 3})", "'placement'"},
      {R"({"op": "prepare", "placement": {"expert_workers": 0, "experts": []}})", "expert_workers"},
      {R"({"op": "units", "served": {}})", "'served'"},
      {R"({"op": "blobs", "blobs": ["0"]})", "not hex"},
      {R"({"op": "configure", "role": "expert", "index": 0})", "'config' is missing"},
      {R"({"op": "configure", "role": "chef", "index": 0, "config": {"model_dir": "m"}})",
       "unknown worker role 'chef'"},
      {R"({"op": "configure", "role": "expert", "index": 0, "config": {}})", "'model_dir'"},
      {R"({"op": "configure", "role": "expert", "index": 1, "config": {"model_dir": "m"}})",
       "expert worker 1 rank 0 is not in the deployment"},
      {R"({"op": "configure", "role": "expert", "index": 0,
           "config": {"model_dir": "m", "engine": {"micro_batches": 17}}})",
       "'engine.micro_batches' must be in 1..16"},
      {R"({"op": "configure", "role": "expert", "index": 0,
           "config": {"model_dir": "m", "engine": {"max_step_tokens": "many"}}})",
       "engine: field 'max_step_tokens'"},
      {R"({"op": "configure", "role": "expert", "index": 0,
           "config": {"model_dir": "m", "routing": "random"}})",
       "routing"},
      {R"({"op": "configure", "role": "expert", "index": 0,
           "config": {"model_dir": "m", "transport": "ib"}})",
       "field 'transport': unknown provider 'ib' (direct, socket, shm, tcp, verbs, efa)"},
      {R"({"op": "configure", "role": "expert", "index": 0,
           "config": {"model_dir": "m", "transport": 3}})",
       "transport"},
      {R"({"op": "configure", "role": "expert", "index": 0,
           "config": {"model_dir": "m", "placement": {"expert_workers": 2, "experts": [0, 1]}}})",
       "places experts on 2 expert workers, not 1"},
  };
  for (const Case& c : commands) {
    auto d = decode_command(c.line, "test");
    ASSERT_FALSE(d.ok()) << c.line;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << c.line;
    EXPECT_NE(d.status().message().find(c.says), std::string::npos)
        << c.line << " -> " << d.status().message();
  }
  const Case events[] = {
      {R"({"ready": 1})", "no \"event\""},
      {R"({"event": "ready", "index": 0})", "'protocol' is missing"},
      {R"({"event": "stepped", "events": [{"id": 1, "token": 2, "finished": "no", "reason": ""}]})",
       "'finished'"},
      {R"({"event": "stepped", "events": [{"id": 1, "token": 2, "finished": true, "reason": "tired"}]})",
       "unknown finish reason 'tired'"},
      {R"({"event": "stepped", "events": 3})", "'events'"},
      {R"({"event": "stats", "stats": 3})", "'stats'"},
      {R"({"event": "routed", "rows": [1, "2"]})", "'rows'"},
      {R"({"event": "nope"})", "unknown event 'nope'"},
  };
  for (const Case& c : events) {
    auto d = decode_event(c.line, "test");
    ASSERT_FALSE(d.ok()) << c.line;
    EXPECT_NE(d.status().message().find(c.says), std::string::npos)
        << c.line << " -> " << d.status().message();
  }
}

TEST(ControlTest, TheHandshakeChecksTheProtocolVersion) {
  Hello h{3, 1234, "node1", "10.0.0.1", "s3cret", kProtocolVersion};
  auto back = decode_hello(encode(h), "hello");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->secret, "s3cret");
  EXPECT_TRUE(check_protocol(back->protocol, "rank 3").ok());
  Status old = check_protocol(0, "expert worker 2");
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("expert worker 2 speaks control protocol 0"), std::string::npos)
      << old.message();
  // A hello without a version is a rank of an older build: refused at the check.
  auto unversioned = decode_hello(R"({"rank": 1, "secret": "x", "pid": "?"})", "hello");
  ASSERT_TRUE(unversioned.ok()) << unversioned.status().message();
  EXPECT_FALSE(check_protocol(unversioned->protocol, "rank 1").ok());
  EXPECT_FALSE(decode_hello(R"({"event": "ready", "rank": 1, "secret": "x"})", "hello").ok());
  EXPECT_FALSE(decode_hello(R"({"rank": 1})", "hello").ok());
}

TEST(ControlTest, ExpectNamesWhatCameInstead) {
  auto ok = expect<Added>(Event{Added{5}}, "attention worker 0");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->id, 5);
  auto err = expect<Added>(Event{Error{"no memory"}}, "attention worker 0");
  EXPECT_EQ(err.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(err.status().message(), "no memory");
  auto other = expect<Added>(Event{PlacementSet{}}, "attention worker 0");
  EXPECT_EQ(other.status().code(), StatusCode::kInternal);
  EXPECT_NE(other.status().message().find("expected the event 'added', got 'placement_set'"),
            std::string::npos);
}

TEST(ControlTest, RolesAndFinishReasonsAreEnums) {
  EXPECT_EQ(parse_worker_role("expert").value(), WorkerRole::kExpert);
  EXPECT_STREQ(worker_role_name(WorkerRole::kAttention), "attention");
  EXPECT_FALSE(parse_worker_role("router").ok());
  for (auto r : {FinishReason::kNone, FinishReason::kEos, FinishReason::kStop,
                 FinishReason::kLength, FinishReason::kError}) {
    EXPECT_EQ(parse_finish_reason(finish_reason_name(r)).value(), r);
  }
}

// A worker reads its commands through WorkerChannel: a line it cannot read is
// logged and answered with an error event, and the next command still comes.
TEST(ControlTest, AWorkerAnswersAMalformedOrUnknownCommandWithAnErrorAndGoesOn) {
  int to_worker[2], from_worker[2];
  ASSERT_EQ(::pipe2(to_worker, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(from_worker, O_CLOEXEC), 0);
  WorkerChannel ch(to_worker[0], from_worker[1], "expert worker 0");
  const std::string garbage = "{not json\n{\"op\": \"teleport\"}\n{\"op\": \"cancel\"}\n" +
                              encode(Command{Cancel{9}}) + "\n";
  ASSERT_EQ(::write(to_worker[1], garbage.data(), garbage.size()),
            static_cast<ssize_t>(garbage.size()));
  auto cmd = ch.next(/*timeout_ms=*/1000);
  ASSERT_TRUE(cmd.has_value());
  ASSERT_TRUE(std::holds_alternative<Cancel>(*cmd));
  EXPECT_EQ(std::get<Cancel>(*cmd).id, 9);
  ::close(from_worker[1]);
  std::string answers;
  char buf[4096];
  for (ssize_t n; (n = ::read(from_worker[0], buf, sizeof buf)) > 0;) answers.append(buf, n);
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = answers.find('\n', at)) != std::string::npos; at = nl + 1) {
    lines.push_back(answers.substr(at, nl - at));
  }
  ASSERT_EQ(lines.size(), 3u) << answers;
  const char* says[] = {"test", "unknown op 'teleport'", "'id' is missing"};
  for (size_t i = 0; i < 3; ++i) {
    auto ev = decode_event(lines[i], "worker");
    ASSERT_TRUE(ev.ok()) << lines[i];
    ASSERT_TRUE(std::holds_alternative<Error>(*ev)) << lines[i];
    EXPECT_EQ(std::get<Error>(*ev).message.rfind("expert worker 0: ", 0), 0u) << lines[i];
    if (i > 0) {
      EXPECT_NE(std::get<Error>(*ev).message.find(says[i]), std::string::npos) << lines[i];
    }
  }
  // The router closing its end is the end of the commands.
  ::close(to_worker[1]);
  bool eof = false;
  EXPECT_FALSE(ch.next(1000, &eof).has_value());
  EXPECT_TRUE(eof);
  ::close(to_worker[0]);
  ::close(from_worker[0]);
}

}  // namespace
}  // namespace msinfer::runtime::control
