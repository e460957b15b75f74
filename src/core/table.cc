#include "msinfer/core/table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace msinfer {
namespace {

bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char c = s[0];
  return (c >= '0' && c <= '9') || ((c == '-' || c == '+' || c == '.') && s.size() > 1);
}

}  // namespace

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(std::max(cells.size(), header_.size()));
  rows_.push_back(std::move(cells));
}

std::string Table::to_string() const {
  size_t ncol = header_.size();
  for (const auto& r : rows_) ncol = std::max(ncol, r.size());
  std::vector<size_t> width(ncol, 0);
  for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const auto& r : rows_) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& cells, bool header) {
    std::string line;
    for (size_t c = 0; c < ncol; ++c) {
      std::string cell = c < cells.size() ? cells[c] : "";
      size_t pad = width[c] - cell.size();
      if (c > 0) line += "  ";
      if (!header && looks_numeric(cell)) line += std::string(pad, ' ') + cell;
      else line += cell + std::string(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(header_, true);
  size_t total = 0;
  for (size_t c = 0; c < ncol; ++c) total += width[c] + (c > 0 ? 2 : 0);
  out += std::string(total, '-') + "\n";
  for (const auto& r : rows_) emit(r, false);
  return out;
}

std::string fmt(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

std::string fmt_si(double value) {
  const char* suffix[] = {"", "k", "M", "G", "T", "P"};
  double a = std::fabs(value);
  int i = 0;
  while (a >= 1000.0 && i < 5) {
    a /= 1000.0;
    value /= 1000.0;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), a >= 100 ? "%.0f%s" : (a >= 10 ? "%.1f%s" : "%.2f%s"), value,
                suffix[i]);
  return buf;
}

std::string fmt_pct(double fraction) { return fmt(100.0 * fraction, 1) + "%"; }

}  // namespace msinfer
