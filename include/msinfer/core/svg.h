// A minimal SVG document builder for charts and timelines that a person reads
// in a browser. Coordinates are in pixels, origin top-left.
#pragma once

#include <string>
#include <vector>

#include "msinfer/core/status.h"

namespace msinfer {

class Svg {
 public:
  Svg(double width, double height);

  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& title = "", const std::string& stroke = "none");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke,
            double width = 1.0, const std::string& dash = "");
  // anchor: start | middle | end.
  void text(double x, double y, const std::string& s, double size = 12,
            const std::string& anchor = "start", const std::string& fill = "#222",
            bool rotate_vertical = false);
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                double width = 2.0);
  void circle(double cx, double cy, double r, const std::string& fill);

  std::string to_string() const;
  Status write_file(const std::string& path) const;

 private:
  double width_, height_;
  std::string body_;
};

// Escapes &, <, >, " for SVG text and attributes.
std::string svg_escape(const std::string& s);
// A categorical colour (colour-blind friendly palette), cycling.
const char* palette_color(int index);

}  // namespace msinfer
