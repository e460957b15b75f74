#include "msinfer/planner/simulator.h"

#include "msinfer/core/stats.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <queue>
#include <random>
#include <unordered_map>

namespace msinfer::planner {
namespace {

enum class JobKind : uint8_t { kAttention, kDispatchSend, kDispatchRecv, kExpert, kCombineSend,
                               kCombineRecv };

struct Job {
  JobKind kind;
  int resource;
  int src;  // attention worker for dispatch/attention, expert for combine/expert
  int dst;  // receiving worker for *Recv jobs
  int iteration, micro_batch, layer;
  double duration;
  double ready;
  double start = 0;
};

struct Resource {
  bool busy = false;
  double busy_time = 0;
  std::deque<int> queue;  // job ids, first come first served
};

struct Event {
  double time;
  uint64_t seq;
  int job;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

class Engine {
 public:
  Engine(const Deployment& d, const SimOptions& o)
      : d_(d), o_(o), rng_(o.seed), n_a_(d.attention_nodes), E_(d.expert_nodes()),
        m_(d.micro_batches), L_(d.model.moe_layers) {
    const double b_a = static_cast<double>(d.batch_per_micro_batch);
    t_a_ = d.stage.t_attention(b_a);
    t_c_a_ = d.stage.t_comm_attention_side(b_a);
    const double rows = n_a_ * b_a * d.model.top_k;  // routed rows per (micro-batch, layer)
    // E_ is the expert nodes (workers); x experts each. k3 is per row, k4 the
    // weights and launch of x experts.
    const int x = d.experts_per_node();
    if (o.node_replica_shares.empty()) {
      // Node k holds experts k x .. k x + x - 1 (Zipf: the hottest together).
      const std::vector<double> expert =
          zipf_expert_shares(d.model.experts, d.model.top_k, o.zipf_s);
      for (int e = 0; e < E_; ++e) {
        double share = 0;
        for (int i = 0; i < x; ++i) share += expert[e * x + i];
        shares_.push_back(share);
        t_e_.push_back(d.stage.t_expert(rows * share));
      }
    } else {
      // A placement: a node runs one GEMM per replica it holds (each streams
      // one expert's weights: k4 / x).
      for (const auto& node : o.node_replica_shares) {
        double share = 0, t = 0;
        for (double f : node) {
          share += f;
          if (f > 0) t += d.stage.k3 * rows * f + d.stage.k4 / x;
        }
        shares_.push_back(share);
        t_e_.push_back(t);
      }
    }
    for (int e = 0; e < E_; ++e) {
      t_c_e_.push_back(d.stage.t_comm_expert_side(rows * shares_[e], d.attention_nodes));
    }
    // Resources: attention compute, attention send NIC, attention receive NIC,
    // then expert compute, expert send NIC, expert receive NIC.
    res_.resize(3 * n_a_ + 3 * E_);
  }

  SimResult run() {
    iter_start_.assign(n_a_, 0.0);
    mb_done_.assign(n_a_, 0);
    iter_of_.assign(n_a_, 0);
    for (int i = 0; i < n_a_; ++i) start_iteration(i, 0, 0.0);
    const double total = simulation_jobs(d_, o_);
    uint64_t done = 0;
    while (!events_.empty()) {
      if (o_.progress && (++done & 0xffff) == 0) o_.progress(std::min(1.0, done / total));
      Event ev = events_.top();
      events_.pop();
      now_ = ev.time;
      Job& job = jobs_[ev.job];
      Resource& r = res_[job.resource];
      r.busy = false;
      r.busy_time += job.duration;
      record(job);
      complete(ev.job);
      if (!r.busy && !r.queue.empty()) start_next(jobs_[ev.job].resource);
    }
    return finish();
  }

 private:
  int a_compute(int i) const { return i; }
  int a_send(int i) const { return n_a_ + i; }
  int a_recv(int i) const { return 2 * n_a_ + i; }
  int x_compute(int e) const { return 3 * n_a_ + e; }
  int x_send(int e) const { return 3 * n_a_ + E_ + e; }
  int x_recv(int e) const { return 3 * n_a_ + 2 * E_ + e; }

  double jitter(double t) {
    if (o_.jitter <= 0) return t;
    std::uniform_real_distribution<double> u(1.0 - o_.jitter, 1.0 + o_.jitter);
    return t * u(rng_);
  }

  int64_t slot_key(int it, int j, int l) const {
    return (static_cast<int64_t>(it) * m_ + j) * L_ + l;
  }

  void submit(JobKind kind, int resource, int src, int dst, int it, int j, int l, double dur) {
    Job job{kind, resource, src, dst, it, j, l, jitter(dur), now_};
    jobs_.push_back(job);
    int id = static_cast<int>(jobs_.size()) - 1;
    res_[resource].queue.push_back(id);
    if (!res_[resource].busy) start_next(resource);
  }

  void start_next(int resource) {
    Resource& r = res_[resource];
    int id = r.queue.front();
    r.queue.pop_front();
    r.busy = true;
    jobs_[id].start = now_;
    events_.push(Event{now_ + jobs_[id].duration, seq_++, id});
  }

  void start_iteration(int i, int it, double t) {
    iter_start_[i] = t;
    mb_done_[i] = 0;
    iter_of_[i] = it;
    for (int j = 0; j < m_; ++j) submit(JobKind::kAttention, a_compute(i), i, i, it, j, 0, t_a_);
  }

  void record(const Job& job) {
    if (job.iteration >= o_.gantt_iterations || job.layer >= o_.gantt_layers ||
        intervals_.size() >= 400000) {
      return;
    }
    Lane lane;
    switch (job.kind) {
      case JobKind::kAttention: lane = Lane::kAttention; break;
      case JobKind::kDispatchSend: lane = Lane::kDispatch; break;
      case JobKind::kExpert: lane = Lane::kExpert; break;
      case JobKind::kCombineSend: lane = Lane::kCombine; break;
      default: return;
    }
    intervals_.push_back(Interval{lane, job.src, job.iteration, job.micro_batch, job.layer,
                                  job.start, now_});
  }

  // A piece (src -> dst) arrives when both the sender's send job and the
  // receiver's receive job for it are done.
  bool piece_arrived(bool dispatch, const Job& job, int src, int dst) {
    int64_t key = ((slot_key(job.iteration, job.micro_batch, job.layer) * 2 + (dispatch ? 1 : 0)) *
                       std::max(n_a_, E_) + src) * std::max(n_a_, E_) + dst;
    int& c = pieces_[key];
    if (++c < 2) return false;
    pieces_.erase(key);
    return true;
  }

  void complete(int id) {
    const Job job = jobs_[id];
    const int64_t slot = slot_key(job.iteration, job.micro_batch, job.layer);
    switch (job.kind) {
      case JobKind::kAttention: {
        const int i = job.src;
        t_a_sum_ += job.duration;
        ++t_a_n_;
        last_ready_dispatch_[slot] = std::max(last_ready_dispatch_[slot], now_);
        submit(JobKind::kDispatchSend, a_send(i), i, -1, job.iteration, job.micro_batch,
               job.layer, t_c_a_);
        for (int e = 0; e < E_; ++e) {
          submit(JobKind::kDispatchRecv, x_recv(e), i, e, job.iteration, job.micro_batch,
                 job.layer, t_c_e_[e] / n_a_);
        }
        break;
      }
      case JobKind::kDispatchSend:
        for (int e = 0; e < E_; ++e) {
          if (piece_arrived(true, job, job.src, e)) dispatch_arrival(job, e);
        }
        break;
      case JobKind::kDispatchRecv:
        if (piece_arrived(true, job, job.src, job.dst)) dispatch_arrival(job, job.dst);
        break;
      case JobKind::kExpert: {
        const int e = job.src;
        t_e_sum_ += job.duration;
        ++t_e_n_;
        double& lr = last_ready_combine_[slot];
        lr = std::max(lr, now_);
        submit(JobKind::kCombineSend, x_send(e), e, -1, job.iteration, job.micro_batch, job.layer,
               t_c_e_[e]);
        for (int i = 0; i < n_a_; ++i) {
          submit(JobKind::kCombineRecv, a_recv(i), e, i, job.iteration, job.micro_batch,
                 job.layer, t_c_a_ * shares_[e]);
        }
        break;
      }
      case JobKind::kCombineSend:
        for (int i = 0; i < n_a_; ++i) {
          if (piece_arrived(false, job, job.src, i)) combine_arrival(job, i);
        }
        break;
      case JobKind::kCombineRecv:
        if (piece_arrived(false, job, job.src, job.dst)) combine_arrival(job, job.dst);
        break;
    }
  }

  void dispatch_arrival(const Job& job, int e) {
    const int64_t slot = slot_key(job.iteration, job.micro_batch, job.layer);
    int& c = expert_arrivals_[slot * E_ + e];
    if (++c < n_a_) return;
    expert_arrivals_.erase(slot * E_ + e);
    t_c_sum_ += now_ - last_ready_dispatch_[slot];
    ++t_c_n_;
    if (++experts_started_[slot] == E_) {
      experts_started_.erase(slot);
      last_ready_dispatch_.erase(slot);
    }
    submit(JobKind::kExpert, x_compute(e), e, e, job.iteration, job.micro_batch, job.layer,
           t_e_[e]);
  }

  void combine_arrival(const Job& job, int i) {
    const int64_t slot = slot_key(job.iteration, job.micro_batch, job.layer);
    int& c = attention_arrivals_[slot * n_a_ + i];
    if (++c < E_) return;
    attention_arrivals_.erase(slot * n_a_ + i);
    t_c_sum_ += now_ - last_ready_combine_[slot];
    ++t_c_n_;
    if (++attention_combined_[slot] == n_a_) {
      attention_combined_.erase(slot);
      last_ready_combine_.erase(slot);
    }
    if (job.layer + 1 < L_) {
      submit(JobKind::kAttention, a_compute(i), i, i, job.iteration, job.micro_batch,
             job.layer + 1, t_a_);
      return;
    }
    // Micro-batch finished the iteration on worker i.
    tokens_ += d_.batch_per_micro_batch;
    if (++mb_done_[i] == m_) {
      tbt_.push_back(now_ - iter_start_[i]);
      if (iter_of_[i] + 1 < o_.iterations) start_iteration(i, iter_of_[i] + 1, now_);
    }
  }

  SimResult finish() {
    SimResult r;
    r.makespan = now_;
    r.tokens = tokens_;
    r.throughput = tokens_ / now_;
    r.per_gpu = r.throughput / d_.gpus();
    r.per_cost = r.throughput / d_.cost();
    r.per_watt = r.throughput / d_.power_w();
    r.tbt_mean = mean(tbt_);
    r.tbt_p50 = percentile(tbt_, 0.50);
    r.tbt_p99 = percentile(tbt_, 0.99);
    for (int i = 0; i < n_a_; ++i) {
      r.attention_busy += res_[a_compute(i)].busy_time / now_ / n_a_;
      r.attention_nic_busy += res_[a_send(i)].busy_time / now_ / n_a_;
    }
    for (int e = 0; e < E_; ++e) {
      double b = res_[x_compute(e)].busy_time / now_;
      r.expert_busy += b / E_;
      r.expert_busy_max = std::max(r.expert_busy_max, b);
    }
    r.attention_bubble = (1 - r.attention_busy) * r.tbt_mean;
    r.expert_bubble = (1 - r.expert_busy) * r.tbt_mean;
    r.t_attention = t_a_n_ ? t_a_sum_ / t_a_n_ : 0;
    r.t_expert = t_e_n_ ? t_e_sum_ / t_e_n_ : 0;
    r.t_comm = t_c_n_ ? t_c_sum_ / t_c_n_ : 0;
    r.expert_load_share = shares_;
    r.intervals = std::move(intervals_);
    return r;
  }

  const Deployment& d_;
  const SimOptions& o_;
  std::mt19937_64 rng_;
  const int n_a_, E_, m_, L_;
  std::vector<double> shares_;
  double t_a_ = 0, t_c_a_ = 0;
  std::vector<double> t_e_, t_c_e_;

  std::vector<Job> jobs_;
  std::vector<Resource> res_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;

  std::unordered_map<int64_t, int> pieces_;
  std::unordered_map<int64_t, int> expert_arrivals_, attention_arrivals_;
  std::unordered_map<int64_t, int> experts_started_, attention_combined_;
  std::unordered_map<int64_t, double> last_ready_dispatch_, last_ready_combine_;
  std::vector<double> iter_start_;
  std::vector<int> mb_done_, iter_of_;
  std::vector<double> tbt_;
  int64_t tokens_ = 0;
  double t_a_sum_ = 0, t_e_sum_ = 0, t_c_sum_ = 0;
  int64_t t_a_n_ = 0, t_e_n_ = 0, t_c_n_ = 0;
  std::vector<Interval> intervals_;
};

}  // namespace

std::vector<double> zipf_expert_shares(int experts, int top_k, double s) {
  std::vector<double> p(experts);
  for (int e = 0; e < experts; ++e) p[e] = 1.0 / std::pow(e + 1.0, s);
  const double cap = 1.0 / top_k;
  // Water-filling: clamp at cap, spread the excess proportionally over the rest.
  std::vector<bool> fixed(experts, false);
  for (int round = 0; round < experts; ++round) {
    double fixed_sum = 0, free_sum = 0;
    for (int e = 0; e < experts; ++e) (fixed[e] ? fixed_sum : free_sum) += fixed[e] ? cap : p[e];
    bool changed = false;
    for (int e = 0; e < experts; ++e) {
      if (fixed[e]) continue;
      double v = p[e] / free_sum * (1.0 - fixed_sum);
      if (v > cap + 1e-15) {
        fixed[e] = true;
        changed = true;
      }
    }
    if (!changed) {
      for (int e = 0; e < experts; ++e) p[e] = fixed[e] ? cap : p[e] / free_sum * (1.0 - fixed_sum);
      return p;
    }
  }
  for (int e = 0; e < experts; ++e) p[e] = 1.0 / experts;
  return p;
}

Json SimResult::to_json() const {
  return Json{{"throughput_tokens_per_s", throughput},
              {"throughput_per_gpu", per_gpu},
              {"throughput_per_cost", per_cost},
              {"throughput_per_watt", per_watt},
              {"tbt_ms", tbt_mean * 1e3},
              {"tbt_p50_ms", tbt_p50 * 1e3},
              {"tbt_p99_ms", tbt_p99 * 1e3},
              {"t_attention_ms", t_attention * 1e3},
              {"t_expert_ms", t_expert * 1e3},
              {"t_comm_ms", t_comm * 1e3},
              {"attention_busy", attention_busy},
              {"expert_busy", expert_busy},
              {"expert_busy_max", expert_busy_max},
              {"attention_nic_busy", attention_nic_busy},
              {"attention_bubble_ms_per_iteration", attention_bubble * 1e3},
              {"expert_bubble_ms_per_iteration", expert_bubble * 1e3},
              {"simulated_ms", makespan * 1e3},
              {"tokens", tokens}};
}

double simulation_jobs(const Deployment& d, const SimOptions& options) {
  return static_cast<double>(options.iterations) * d.micro_batches * d.model.moe_layers *
         (2.0 * d.attention_nodes * d.expert_nodes() +
          2.0 * (d.attention_nodes + d.expert_nodes()));
}

StatusOr<SimResult> simulate(const Deployment& d, const SimOptions& options) {
  if (options.iterations < 1) return invalid_argument("--iterations must be >= 1");
  if (options.jitter < 0 || options.jitter >= 1) {
    return invalid_argument("--jitter must be in [0, 100) percent");
  }
  if (options.zipf_s < 0) return invalid_argument("--imbalance zipf:S needs S >= 0");
  if (!options.node_replica_shares.empty()) {
    if (static_cast<int>(options.node_replica_shares.size()) != d.expert_nodes()) {
      return invalid_argument("the placement has " +
                              std::to_string(options.node_replica_shares.size()) +
                              " expert workers; the deployment has " +
                              std::to_string(d.expert_nodes()) + " expert nodes");
    }
    double total = 0;
    for (const auto& node : options.node_replica_shares) {
      for (double f : node) {
        if (!(f >= 0) || !std::isfinite(f)) return invalid_argument("placement shares must be >= 0");
        total += f;
      }
    }
    if (std::fabs(total - 1) > 1e-6) {
      return invalid_argument("placement shares sum to " + std::to_string(total) + ", not 1");
    }
  }
  MSI_RETURN_IF_ERROR(d.model.validate());
  if (d.attention_nodes < 1 || d.micro_batches < 1 || d.batch_per_micro_batch < 1) {
    return invalid_argument("deployment needs attention_nodes, micro_batches and batch >= 1");
  }
  const double jobs = simulation_jobs(d, options);
  if (jobs > kMaxSimulationJobs) {
    return invalid_argument("simulation too large (" + std::to_string(static_cast<int64_t>(jobs)) +
                            " jobs); lower --iterations");
  }
  Engine engine(d, options);
  return engine.run();
}

Status parse_sweep(const std::string& spec, SweepParameter* p, int* from, int* to) {
  auto eq = spec.find('=');
  auto dots = spec.find("..");
  if (eq == std::string::npos || dots == std::string::npos || dots < eq) {
    return invalid_argument("--sweep: expected NAME=FROM..TO (attention-nodes=1..16 or "
                            "micro-batches=1..4), got '" + spec + "'");
  }
  std::string name = spec.substr(0, eq);
  if (name == "attention-nodes" || name == "attention_nodes") {
    *p = SweepParameter::kAttentionNodes;
  } else if (name == "micro-batches" || name == "micro_batches") {
    *p = SweepParameter::kMicroBatches;
  } else {
    return invalid_argument("--sweep: unknown parameter '" + name +
                            "' (attention-nodes or micro-batches)");
  }
  try {
    size_t used = 0;
    std::string a = spec.substr(eq + 1, dots - eq - 1), b = spec.substr(dots + 2);
    *from = std::stoi(a, &used);
    if (used != a.size()) throw std::invalid_argument(a);
    *to = std::stoi(b, &used);
    if (used != b.size()) throw std::invalid_argument(b);
  } catch (const std::exception&) {
    return invalid_argument("--sweep: range must be integers FROM..TO, got '" + spec + "'");
  }
  if (*from < 1 || *to < *from || *to > 256) {
    return invalid_argument("--sweep: need 1 <= FROM <= TO <= 256, got '" + spec + "'");
  }
  return ok_status();
}

const char* sweep_parameter_name(SweepParameter p) {
  return p == SweepParameter::kAttentionNodes ? "attention_nodes" : "micro_batches";
}

StatusOr<std::vector<SweepRow>> sweep(const Deployment& base, SweepParameter p, int from, int to,
                                      const SimOptions& options,
                                      const std::function<void(int)>& progress) {
  // The whole sweep gets the budget of one simulation (issue 12: a sweep of
  // micro-batches=1..256 used to run for 20 minutes).
  double total = 0;
  for (int v = from; v <= to; ++v) {
    Deployment d = base;
    if (p == SweepParameter::kAttentionNodes)
      d.attention_nodes = v;
    else
      d.micro_batches = v;
    total += simulation_jobs(d, options);
  }
  if (total > kMaxSimulationJobs) {
    return invalid_argument("--sweep too large (" + std::to_string(static_cast<int64_t>(total)) +
                            " simulated jobs over " + std::to_string(to - from + 1) +
                            " runs, at most " +
                            std::to_string(static_cast<int64_t>(kMaxSimulationJobs)) +
                            "); narrow the range or lower --iterations");
  }
  std::vector<SweepRow> rows;
  for (int v = from; v <= to; ++v) {
    if (progress) progress(v);
    SweepRow row;
    row.value = v;
    row.deployment = base;
    if (p == SweepParameter::kAttentionNodes) row.deployment.attention_nodes = v;
    else row.deployment.micro_batches = v;
    MSI_ASSIGN_OR_RETURN(row.sim, simulate(row.deployment, options));
    row.sim.intervals.clear();
    row.closed_form = predict(row.deployment);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace msinfer::planner
