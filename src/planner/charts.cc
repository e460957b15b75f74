// SVG output of the simulator: the Gantt timeline and the sweep chart.
#include <algorithm>
#include <cmath>
#include <map>

#include "msinfer/core/svg.h"
#include "msinfer/core/table.h"
#include "msinfer/planner/simulator.h"

namespace msinfer::planner {
namespace {

// A "nice" tick step for a range (1, 2 or 5 times a power of ten).
double nice_step(double range, int target_ticks) {
  double raw = range / std::max(1, target_ticks);
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

std::string tick_label(double v) {
  if (std::fabs(v - std::round(v)) < 1e-9) return fmt(v, 0);
  if (std::fabs(v * 10 - std::round(v * 10)) < 1e-9) return fmt(v, 1);
  return fmt(v, 2);
}

}  // namespace

Status write_gantt_svg(const Deployment& d, const SimResult& r, const std::string& path) {
  if (r.intervals.empty()) return invalid_argument("--gantt: the simulation recorded no jobs");
  constexpr int kMaxRowsPerKind = 8;
  const int n_a = std::min(d.attention_nodes, kMaxRowsPerKind);
  const int E = std::min(d.expert_nodes(), kMaxRowsPerKind);
  struct Row {
    Lane lane;
    int worker;
    std::string label;
  };
  std::vector<Row> rows;
  for (int i = 0; i < n_a; ++i) rows.push_back({Lane::kAttention, i, "attention " + std::to_string(i)});
  for (int i = 0; i < n_a; ++i) rows.push_back({Lane::kDispatch, i, "M2N from attn " + std::to_string(i)});
  for (int e = 0; e < E; ++e) rows.push_back({Lane::kCombine, e, "N2M from expert " + std::to_string(e)});
  for (int e = 0; e < E; ++e) rows.push_back({Lane::kExpert, e, "expert " + std::to_string(e)});

  double t_end = 0;
  int shown_layers = 0, shown_iterations = 0;
  for (const auto& iv : r.intervals) {
    t_end = std::max(t_end, iv.end);
    shown_layers = std::max(shown_layers, iv.layer + 1);
    shown_iterations = std::max(shown_iterations, iv.iteration + 1);
  }
  const double ms_end = t_end * 1e3;
  const double left = 150, right = 30, top = 70, row_h = 22, gap = 6;
  const double plot_w = 1100;
  const double height = top + rows.size() * (row_h + gap) + 90;
  Svg svg(left + plot_w + right, height);
  auto x_of = [&](double t) { return left + t * 1e3 / ms_end * plot_w; };

  svg.text(left, 24,
           d.model.name + ": " + std::to_string(d.attention_nodes) + " attention x " +
               std::to_string(d.expert_nodes()) + " expert workers, m = " +
               std::to_string(d.micro_batches) + ", b_a = " +
               std::to_string(d.batch_per_micro_batch) + ", " +
               std::to_string(d.model.moe_layers) + " layers",
           15);
  svg.text(left, 44,
           "T_a = " + fmt(d.stage.t_attention(d.batch_per_micro_batch) * 1e3, 3) +
               " ms, T_e = " + fmt(r.t_expert * 1e3, 3) + " ms, T_c = " +
               fmt(r.t_comm * 1e3, 3) + " ms; busy: attention " + fmt_pct(r.attention_busy) +
               ", experts " + fmt_pct(r.expert_busy) + "; shown: layers 0-" +
               std::to_string(shown_layers - 1) + " of the first " +
               std::to_string(shown_iterations) + " iteration(s)",
           12, "start", "#444");

  // Time grid.
  const double step = nice_step(ms_end, 10);
  const double grid_bottom = top + rows.size() * (row_h + gap);
  for (double t = 0; t <= ms_end + 1e-9; t += step) {
    double x = left + t / ms_end * plot_w;
    svg.line(x, top - 4, x, grid_bottom, "#ddd");
    svg.text(x, grid_bottom + 16, tick_label(t), 11, "middle", "#444");
  }
  svg.text(left + plot_w / 2, grid_bottom + 34, "time (ms)", 12, "middle");

  std::map<std::pair<int, int>, int> row_index;
  for (size_t k = 0; k < rows.size(); ++k) {
    double y = top + k * (row_h + gap);
    svg.text(left - 8, y + row_h * 0.7, rows[k].label, 11, "end");
    svg.rect(left, y, plot_w, row_h, "#f6f6f6");
    row_index[{static_cast<int>(rows[k].lane), rows[k].worker}] = static_cast<int>(k);
  }
  for (const auto& iv : r.intervals) {
    auto it = row_index.find({static_cast<int>(iv.lane), iv.worker});
    if (it == row_index.end()) continue;
    double y = top + it->second * (row_h + gap);
    double x0 = x_of(iv.start), x1 = x_of(iv.end);
    std::string title = "iteration " + std::to_string(iv.iteration) + ", micro-batch " +
                        std::to_string(iv.micro_batch) + ", layer " + std::to_string(iv.layer) +
                        ": " + fmt(iv.start * 1e3, 3) + "-" + fmt(iv.end * 1e3, 3) + " ms";
    const char* color = palette_color(iv.micro_batch);
    // Odd iterations get a dark top stripe so iteration boundaries stay visible.
    svg.rect(x0, y + 1, std::max(0.5, x1 - x0), row_h - 2, color, title, "white");
    if (iv.iteration % 2) svg.rect(x0, y + 1, std::max(0.5, x1 - x0), 3, "#333");
    if (x1 - x0 > 18) {
      svg.text((x0 + x1) / 2, y + row_h * 0.68, std::to_string(iv.layer), 9, "middle", "white");
    }
  }
  // Legend.
  double lx = left, ly = grid_bottom + 52;
  for (int j = 0; j < std::min(d.micro_batches, 8); ++j) {
    svg.rect(lx, ly, 14, 14, palette_color(j));
    svg.text(lx + 18, ly + 11, "micro-batch " + std::to_string(j), 11);
    lx += 110;
  }
  svg.text(lx + 10, ly + 11,
           "numbers: layer; dark top stripe: odd iterations; hover a box for its times", 11,
           "start", "#444");
  return svg.write_file(path);
}

Status write_sweep_svg(SweepParameter p, const std::vector<SweepRow>& rows,
                       const std::string& path) {
  if (rows.empty()) return invalid_argument("--plot: the sweep produced no rows");
  const double left = 80, right = 80, top = 50, plot_w = 640, plot_h = 340;
  Svg svg(left + plot_w + right, top + plot_h + 80);
  double x_min = rows.front().value, x_max = rows.back().value;
  if (x_max == x_min) x_max = x_min + 1;
  double thr_max = 0, tbt_max = 0;
  for (const auto& r : rows) {
    thr_max = std::max(thr_max, r.sim.per_gpu);
    tbt_max = std::max(tbt_max, r.sim.tbt_mean * 1e3);
  }
  thr_max *= 1.1;
  tbt_max *= 1.1;
  auto x_of = [&](double v) { return left + (v - x_min) / (x_max - x_min) * plot_w; };
  auto y_thr = [&](double v) { return top + plot_h - v / thr_max * plot_h; };
  auto y_tbt = [&](double v) { return top + plot_h - v / tbt_max * plot_h; };
  const std::string name = p == SweepParameter::kAttentionNodes ? "attention nodes n_a"
                                                                 : "micro-batches m";
  svg.text(left, 28, "Per-GPU throughput and time between tokens vs " + name +
                         " (b_a fixed, simulated)", 14);
  svg.rect(left, top, plot_w, plot_h, "none", "", "#888");
  const double ys = nice_step(thr_max, 6), ts = nice_step(tbt_max, 6);
  for (double v = 0; v <= thr_max; v += ys) {
    svg.line(left, y_thr(v), left + plot_w, y_thr(v), "#eee");
    svg.text(left - 6, y_thr(v) + 4, tick_label(v), 10, "end", palette_color(0));
  }
  for (double v = 0; v <= tbt_max; v += ts) {
    svg.text(left + plot_w + 6, y_tbt(v) + 4, tick_label(v), 10, "start", palette_color(1));
  }
  const double xs = std::max(1.0, nice_step(x_max - x_min, 12));
  for (double v = x_min; v <= x_max + 1e-9; v += xs) {
    svg.text(x_of(v), top + plot_h + 16, tick_label(v), 10, "middle");
  }
  svg.text(left + plot_w / 2, top + plot_h + 36, name, 12, "middle");
  svg.text(22, top + plot_h / 2, "tokens/s per GPU", 12, "middle", palette_color(0), true);
  svg.text(left + plot_w + 60, top + plot_h / 2, "TBT (ms)", 12, "middle", palette_color(1),
           true);
  std::vector<std::pair<double, double>> thr, tbt;
  for (const auto& r : rows) {
    thr.emplace_back(x_of(r.value), y_thr(r.sim.per_gpu));
    tbt.emplace_back(x_of(r.value), y_tbt(r.sim.tbt_mean * 1e3));
  }
  svg.polyline(thr, palette_color(0));
  svg.polyline(tbt, palette_color(1));
  for (const auto& [x, y] : thr) svg.circle(x, y, 3, palette_color(0));
  for (const auto& [x, y] : tbt) svg.circle(x, y, 3, palette_color(1));
  svg.rect(left + 10, top + plot_h + 50, 12, 12, palette_color(0));
  svg.text(left + 26, top + plot_h + 60, "tokens/s per GPU", 11);
  svg.rect(left + 170, top + plot_h + 50, 12, 12, palette_color(1));
  svg.text(left + 186, top + plot_h + 60, "time between tokens (ms)", 11);
  return svg.write_file(path);
}

}  // namespace msinfer::planner
