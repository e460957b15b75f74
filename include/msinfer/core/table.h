// A small text table for human output: a header row, aligned columns (numbers
// right-aligned, text left-aligned), and a rule under the header.
#pragma once

#include <string>
#include <vector>

namespace msinfer {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  // A row with fewer cells than the header is padded with empty cells.
  void add_row(std::vector<std::string> cells);
  std::string to_string() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Fixed-point formatting with `digits` decimals ("12.35").
std::string fmt(double value, int digits = 2);
// Three significant figures in engineering style for large ranges ("1.23e+06" -> "1.23M").
std::string fmt_si(double value);
// Percent with one decimal ("87.5%") from a fraction (0.875).
std::string fmt_pct(double fraction);

}  // namespace msinfer
