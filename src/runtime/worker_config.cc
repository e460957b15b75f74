// WorkerConfig's JSON document (worker_config.h): one codec, its errors
// named, never an exception.
#include "msinfer/runtime/worker_config.h"

#include "internal/json_fields.h"

namespace msinfer::runtime {

Json worker_config_json(const WorkerConfig& c) {
  const EngineOptions& e = c.engine;
  Json j{{"model_dir", c.model_dir},
         {"attention_workers", c.attention_workers},
         {"expert_workers", c.expert_workers},
         {"engine",
          {{"kv_cache_bytes", e.kv_cache_bytes},
           {"block_size", e.block_size},
           {"max_step_tokens", e.max_step_tokens},
           {"micro_batches", e.micro_batches},
           {"attention_cost_per_token", e.attention_cost_per_token},
           {"attention_cost_per_position", e.attention_cost_per_position},
           {"prefix_caching", e.prefix_caching},
           {"prefix_cache_salt", e.prefix_cache_salt}}},
         {"tp_expert", c.tp_expert},
         {"tp_expert_reduce", expert_reduce_name(c.tp_expert_reduce)},
         {"shared_experts", shared_experts_name(c.shared_experts)},
         {"tp_attention", c.tp_attention},
         {"attention_threads", c.attention_threads},
         {"expert_threads", c.expert_threads},
         {"transport", comm::transport_name(c.transport)},
         {"address", c.address},
         {"timeout_ms", c.timeout_ms},
         {"weights", kernels::cpu::weight_format_name(c.weights)},
         {"attention_device", c.attention_device},
         {"expert_device", c.expert_device},
         {"routing", routing_policy_name(c.routing)},
         {"routing_load_slack", c.routing_load_slack},
         {"resubmit", c.resubmit},
         {"respawn", c.respawn},
         {"rebalance_every", c.rebalance_every},
         {"rebalance_slots", c.rebalance_slots},
         {"rebalance_gain", c.rebalance_gain},
         {"rebalance_fixed_rows", c.rebalance_fixed_rows},
         {"prefill_workers", c.prefill_workers},
         {"kv_transfer_bytes", c.kv_transfer_bytes}};
  if (c.placement.workers > 0) j["placement"] = c.placement.to_json();
  return j;
}

StatusOr<WorkerConfig> worker_config_from_json(const Json& j, const std::string& where) {
  using internal::Fields;
  if (!j.is_object()) return invalid_argument(where + ": not an object");
  WorkerConfig c;
  Fields f(j, where);
  f.required("model_dir", &c.model_dir)
      .optional("attention_workers", &c.attention_workers)
      .optional("expert_workers", &c.expert_workers)
      .optional("tp_expert", &c.tp_expert)
      .optional("tp_attention", &c.tp_attention)
      .optional("attention_threads", &c.attention_threads)
      .optional("expert_threads", &c.expert_threads)
      .optional("address", &c.address)
      .optional("timeout_ms", &c.timeout_ms)
      .optional("attention_device", &c.attention_device)
      .optional("expert_device", &c.expert_device)
      .optional("routing_load_slack", &c.routing_load_slack)
      .optional("resubmit", &c.resubmit)
      .optional("respawn", &c.respawn)
      .optional("rebalance_every", &c.rebalance_every)
      .optional("rebalance_slots", &c.rebalance_slots)
      .optional("rebalance_gain", &c.rebalance_gain)
      .optional("rebalance_fixed_rows", &c.rebalance_fixed_rows)
      .optional("prefill_workers", &c.prefill_workers)
      .optional("kv_transfer_bytes", &c.kv_transfer_bytes);
  MSI_RETURN_IF_ERROR(f.status());
  MSI_RETURN_IF_ERROR(
      internal::read_enum(f, "tp_expert_reduce", &c.tp_expert_reduce, where, parse_expert_reduce));
  MSI_RETURN_IF_ERROR(
      internal::read_enum(f, "shared_experts", &c.shared_experts, where, parse_shared_experts));
  MSI_RETURN_IF_ERROR(internal::read_enum(f, "routing", &c.routing, where, parse_routing_policy));
  MSI_RETURN_IF_ERROR(internal::read_enum(
      f, "transport", &c.transport, where,
      [](const std::string& name, const std::string& w) -> StatusOr<comm::TransportKind> {
        auto t = comm::parse_transport(name);
        if (!t.ok()) return invalid_argument(w + ": " + t.status().message());
        return t;
      }));
  MSI_RETURN_IF_ERROR(internal::read_enum(
      f, "weights", &c.weights, where,
      [](const std::string& name, const std::string& w) -> StatusOr<kernels::cpu::WeightFormat> {
        auto fmt = kernels::cpu::parse_weight_format(name);
        if (!fmt.ok()) return invalid_argument(w + ": " + fmt.status().message());
        return fmt;
      }));
  if (auto e = j.find("engine"); e != j.end()) {
    if (!e->is_object()) return invalid_argument(where + ": field 'engine' is not an object");
    EngineOptions& o = c.engine;
    MSI_RETURN_IF_ERROR(Fields(*e, where + ": engine")
                            .optional("kv_cache_bytes", &o.kv_cache_bytes)
                            .optional("block_size", &o.block_size)
                            .optional("max_step_tokens", &o.max_step_tokens)
                            .optional("micro_batches", &o.micro_batches)
                            .optional("attention_cost_per_token", &o.attention_cost_per_token)
                            .optional("attention_cost_per_position", &o.attention_cost_per_position)
                            .optional("prefix_caching", &o.prefix_caching)
                            .optional("prefix_cache_salt", &o.prefix_cache_salt)
                            .status());
  }
  // Ranges the workers rely on (the CLI checked them with the model at hand).
  auto in = [&](const char* name, int64_t v, int64_t lo, int64_t hi) -> Status {
    if (v >= lo && v <= hi) return ok_status();
    return invalid_argument(where + ": field '" + name + "' must be in " + std::to_string(lo) +
                            ".." + std::to_string(hi) + ", not " + std::to_string(v));
  };
  MSI_RETURN_IF_ERROR(in("attention_workers", c.attention_workers, 1, 128));
  MSI_RETURN_IF_ERROR(in("expert_workers", c.expert_workers, 1, 128));
  MSI_RETURN_IF_ERROR(in("tp_expert", c.tp_expert, 1, Placement::kMaxTp));
  MSI_RETURN_IF_ERROR(in("tp_attention", c.tp_attention, 1, Placement::kMaxTp));
  MSI_RETURN_IF_ERROR(in("engine.micro_batches", c.engine.micro_batches, 1, 16));
  MSI_RETURN_IF_ERROR(in("engine.max_step_tokens", c.engine.max_step_tokens, 1, 1 << 20));
  MSI_RETURN_IF_ERROR(in("engine.block_size", c.engine.block_size, 1, 1 << 16));
  MSI_RETURN_IF_ERROR(in("engine.kv_cache_bytes", c.engine.kv_cache_bytes, 1, int64_t{1} << 50));
  MSI_RETURN_IF_ERROR(in("timeout_ms", c.timeout_ms, 100, int64_t{1} << 30));
  MSI_RETURN_IF_ERROR(in("prefill_workers", c.prefill_workers, 0, 64));
  MSI_RETURN_IF_ERROR(in("kv_transfer_bytes", c.kv_transfer_bytes, 1, int64_t{1} << 40));
  if (j.contains("placement")) {
    MSI_ASSIGN_OR_RETURN(c.placement, internal::read_placement(j, where));
    if (c.placement.workers != c.expert_workers) {
      return invalid_argument(where + ": the placement places experts on " +
                              std::to_string(c.placement.workers) + " expert workers, not " +
                              std::to_string(c.expert_workers));
    }
  }
  return c;
}

}  // namespace msinfer::runtime
