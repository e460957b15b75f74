#include "msinfer/core/svg.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace msinfer {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

}  // namespace

std::string svg_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* palette_color(int index) {
  // Okabe-Ito plus two neutrals.
  static const char* kColors[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                  "#56B4E9", "#D55E00", "#F0E442", "#999999"};
  int n = static_cast<int>(sizeof(kColors) / sizeof(kColors[0]));
  return kColors[((index % n) + n) % n];
}

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& title, const std::string& stroke) {
  body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
           num(h) + "\" fill=\"" + fill + "\" stroke=\"" + stroke + "\"";
  if (title.empty()) {
    body_ += "/>\n";
  } else {
    body_ += "><title>" + svg_escape(title) + "</title></rect>\n";
  }
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke,
               double width, const std::string& dash) {
  body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
           num(y2) + "\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) + "\"";
  if (!dash.empty()) body_ += " stroke-dasharray=\"" + dash + "\"";
  body_ += "/>\n";
}

void Svg::text(double x, double y, const std::string& s, double size, const std::string& anchor,
               const std::string& fill, bool rotate_vertical) {
  body_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + num(size) +
           "\" text-anchor=\"" + anchor + "\" fill=\"" + fill + "\"";
  if (rotate_vertical) body_ += " transform=\"rotate(-90 " + num(x) + " " + num(y) + ")\"";
  body_ += ">" + svg_escape(s) + "</text>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points,
                   const std::string& stroke, double width) {
  body_ += "<polyline fill=\"none\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) +
           "\" points=\"";
  for (const auto& [x, y] : points) body_ += num(x) + "," + num(y) + " ";
  body_ += "\"/>\n";
}

void Svg::circle(double cx, double cy, double r, const std::string& fill) {
  body_ += "<circle cx=\"" + num(cx) + "\" cy=\"" + num(cy) + "\" r=\"" + num(r) + "\" fill=\"" +
           fill + "\"/>\n";
}

std::string Svg::to_string() const {
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width_) << "\" height=\""
      << num(height_) << "\" viewBox=\"0 0 " << num(width_) << " " << num(height_)
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      << "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << body_ << "</svg>\n";
  return out.str();
}

Status Svg::write_file(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return not_found(path + ": cannot open for writing");
  out << to_string();
  out.close();
  if (!out) return internal_error(path + ": write failed");
  return ok_status();
}

}  // namespace msinfer
