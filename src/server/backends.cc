// The two generation backends the server drives: the co-located Engine and
// the Router of a disaggregated deployment (kept apart from the scheduler,
// which only knows the GenerationBackend interface).
#include "msinfer/server/scheduler.h"

#include "msinfer/runtime/balance.h"

namespace msinfer::server {
namespace {

class EngineBackend final : public GenerationBackend {
 public:
  explicit EngineBackend(std::unique_ptr<runtime::Engine> e) : e_(std::move(e)) {}
  Status add(const runtime::GenerationRequest& r) override { return e_->add(r); }
  StatusOr<std::vector<runtime::TokenEvent>> step() override { return e_->step(); }
  Status cancel(int64_t id) override {
    e_->cancel(id);
    return ok_status();
  }
  bool idle() const override { return e_->idle(); }
  int64_t running() const override { return e_->running(); }
  int64_t waiting() const override { return e_->waiting(); }
  double kv_usage() const override { return e_->kv_usage(); }
  runtime::EngineCounters counters() const override { return e_->counters(); }
  StatusOr<Json> routing(const std::vector<Json>&) override {
    const runtime::RoutingWindow* w = e_->routing();
    if (w == nullptr) return Json();
    return runtime::RoutingStats::from_window(*w).to_json();
  }

 private:
  std::unique_ptr<runtime::Engine> e_;
};

class RouterBackend final : public GenerationBackend {
 public:
  RouterBackend(std::unique_ptr<runtime::Router> r, int layers, int experts)
      : r_(std::move(r)), layers_(layers), experts_(experts) {}
  Status add(const runtime::GenerationRequest& r) override { return r_->add(r); }
  StatusOr<std::vector<runtime::TokenEvent>> step() override { return r_->step(); }
  Status cancel(int64_t id) override { return r_->cancel(id); }
  bool idle() const override { return r_->idle(); }
  int64_t running() const override { return r_->in_flight(); }
  int64_t waiting() const override { return 0; }
  double kv_usage() const override { return r_->kv_usage(); }
  runtime::EngineCounters counters() const override { return r_->counters(); }
  Status health() const override { return r_->stopped(); }
  std::optional<runtime::DeploymentHealth> deployment_health() const override {
    return r_->health();
  }
  StatusOr<std::vector<Json>> worker_stats() override { return r_->stats(/*reset=*/false); }
  StatusOr<Json> routing(const std::vector<Json>& workers) override {
    MSI_ASSIGN_OR_RETURN(auto stats, r_->routing(workers, layers_, experts_));
    return stats.to_json();
  }

 private:
  std::unique_ptr<runtime::Router> r_;
  int layers_, experts_;
};

}  // namespace

std::unique_ptr<GenerationBackend> engine_backend(std::unique_ptr<runtime::Engine> e) {
  return std::make_unique<EngineBackend>(std::move(e));
}
std::unique_ptr<GenerationBackend> router_backend(std::unique_ptr<runtime::Router> r, int layers,
                                                  int experts) {
  return std::make_unique<RouterBackend>(std::move(r), layers, experts);
}

}  // namespace msinfer::server
