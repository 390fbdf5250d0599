#include "serve/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string SvgPlot::render() const {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = 0, y1 = -x0;
  auto usable_x = [&](double x) { return std::isfinite(x) && (!log_x || x > 0); };
  for (const auto& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (usable_x(s.x[i]) && std::isfinite(s.y[i])) {
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
        y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
      }
  if (!std::isfinite(x0)) throw Error(ErrorKind::kInvalidArgument, "plot", title + ": no data");
  for (const auto& r : ref_lines) y1 = std::max(y1, r.y);
  if (log_x) {
    x0 = std::pow(10.0, std::floor(std::log10(x0)));
    x1 = std::pow(10.0, std::ceil(std::log10(x1)));
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y_max > 0)
    y1 = std::min(y1 * 1.05, y_max);
  else
    y1 *= 1.05;
  if (y1 <= y0) y1 = y0 + 1;
  const double L = 70, R = 170, T = 40, B = 55;  // margins; the legend sits on the right
  const double pw = width - L - R, ph = height - T - B;
  auto sx = [&](double x) {
    const double f = log_x ? (std::log10(x) - std::log10(x0)) / (std::log10(x1) - std::log10(x0))
                           : (x - x0) / (x1 - x0);
    return L + f * pw;
  };
  auto sy = [&](double y) { return T + ph - (std::min(y, y1) - y0) / (y1 - y0) * ph; };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
    << esc(title) << "</text>\n";
  // Grid and ticks.
  std::vector<double> xt;
  if (log_x) {
    for (double v = x0; v <= x1 * 1.0001; v *= 10) xt.push_back(v);
  } else {
    xt = nice_ticks(x0, x1);
  }
  for (double v : xt) {
    if (v < x0 || v > x1 * 1.0001) continue;
    o << "<line x1=\"" << sx(v) << "\" y1=\"" << T << "\" x2=\"" << sx(v) << "\" y2=\"" << T + ph
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << sx(v) << "\" y=\"" << T + ph + 16
      << "\" text-anchor=\"middle\">" << fmt(v) << "</text>\n";
  }
  for (double v : nice_ticks(y0, y1)) {
    o << "<line x1=\"" << L << "\" y1=\"" << sy(v) << "\" x2=\"" << L + pw << "\" y2=\"" << sy(v)
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << L - 6 << "\" y=\"" << sy(v) + 4
      << "\" text-anchor=\"end\">" << fmt(v) << "</text>\n";
  }
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"" << height - 12 << "\" text-anchor=\"middle\">"
    << esc(x_label) << "</text>\n"
    << "<text transform=\"translate(18," << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << esc(y_label) << "</text>\n";
  for (const auto& r : ref_lines) {
    o << "<line x1=\"" << L << "\" y1=\"" << sy(r.y) << "\" x2=\"" << L + pw << "\" y2=\""
      << sy(r.y) << "\" stroke=\"black\" stroke-dasharray=\"6,4\"/>\n<text x=\"" << L + pw - 4
      << "\" y=\"" << sy(r.y) - 5 << "\" text-anchor=\"end\">" << esc(r.label) << "</text>\n";
  }
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (usable_x(s.x[i]) && std::isfinite(s.y[i])) o << sx(s.x[i]) << ',' << sy(s.y[i]) << ' ';
    o << "\"/>\n";
    if (s.markers)
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
        if (usable_x(s.x[i]) && std::isfinite(s.y[i]))
          o << "<circle cx=\"" << sx(s.x[i]) << "\" cy=\"" << sy(s.y[i]) << "\" r=\"3\" fill=\""
            << color << "\"/>\n";
    const double ly = T + 10 + 20 * static_cast<double>(k);
    o << "<line x1=\"" << L + pw + 12 << "\" y1=\"" << ly << "\" x2=\"" << L + pw + 36 << "\" y2=\""
      << ly << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n<text x=\"" << L + pw + 42
      << "\" y=\"" << ly + 4 << "\">" << esc(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

void SvgPlot::write(const std::string& path) const {
  const std::string s = render();
  std::ofstream f(path);
  if (!f) throw Error(ErrorKind::kInvalidArgument, "plot", "cannot write '" + path + "'");
  f << s;
  if (!f) throw Error(ErrorKind::kInvalidArgument, "plot", "failed writing '" + path + "'");
}

}  // namespace flashserve::serve
