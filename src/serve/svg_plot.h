// A small SVG line-plot writer (no dependency): axes with ticks, optional log x axis, one polyline
// per series, dashed horizontal reference lines, a legend. Enough for CDFs and rate sweeps.
#pragma once

#include <string>
#include <vector>

namespace flashserve::serve {

struct SvgSeries {
  std::string name;
  std::vector<double> x, y;
  bool markers = false;
};

struct SvgRefLine {
  double y = 0;
  std::string label;
};

struct SvgPlot {
  std::string title, x_label, y_label;
  bool log_x = false;
  double y_max = 0;  // > 0: the y axis stops here and larger values are drawn on its top edge
  int width = 720, height = 440;
  std::vector<SvgSeries> series;
  std::vector<SvgRefLine> ref_lines;

  std::string render() const;  // throws Error if there is nothing finite to plot
  void write(const std::string& path) const;
};

// "Nice" tick positions (1, 2, 5 x 10^k steps) covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace flashserve::serve
