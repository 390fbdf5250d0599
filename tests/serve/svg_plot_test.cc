// The SVG writer: well-formed output with one polyline per series, escaping, the reference line,
// and a clear error when there is nothing to draw.
#include <gtest/gtest.h>

#include <cmath>

#include "flashserve/error.h"
#include "serve/svg_plot.h"

namespace fs = flashserve::serve;

namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(SvgPlot, RendersSeriesLegendAndReferenceLine) {
  fs::SvgPlot p;
  p.title = "p99 <TBT> & rate";
  p.x_label = "rate";
  p.y_label = "ms";
  p.series.push_back({"sarathi", {1, 2, 3}, {10, 20, 30}, true});
  p.series.push_back({"vllm", {1, 2, 3}, {15, 90, 400}});
  p.ref_lines.push_back({100, "SLO"});
  p.y_max = 200;
  const std::string s = p.render();
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(s, "<polyline"), 2);
  EXPECT_EQ(count(s, "<circle"), 3);
  EXPECT_NE(s.find("p99 &lt;TBT&gt; &amp; rate"), std::string::npos);
  EXPECT_EQ(s.find("<TBT>"), std::string::npos);
  EXPECT_NE(s.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(s.find(">sarathi<"), std::string::npos);
  EXPECT_NE(s.find(">vllm<"), std::string::npos);
  EXPECT_EQ(count(s, "<"), count(s, ">"));  // no stray brackets
}

TEST(SvgPlot, LogAxisSkipsNonPositiveAndEmptyPlotThrows) {
  fs::SvgPlot p;
  p.log_x = true;
  p.series.push_back({"a", {0, -1}, {1, 2}});
  EXPECT_THROW(p.render(), flashserve::Error);
  p.series[0].x = {0.5, 50};
  const std::string s = p.render();
  EXPECT_NE(s.find(">0.1<"), std::string::npos);  // decades 0.1 .. 100
  EXPECT_NE(s.find(">100<"), std::string::npos);
  EXPECT_THROW(p.write("/nonexistent/dir/plot.svg"), flashserve::Error);
}

TEST(SvgPlot, NiceTicks) {
  const auto t = fs::nice_ticks(0, 1, 5);
  ASSERT_EQ(t.size(), 6u);
  for (size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(t[i], 0.2 * i, 1e-12);
  const auto u = fs::nice_ticks(3, 97, 6);
  EXPECT_EQ(u.front(), 20);
  EXPECT_EQ(u.back(), 80);
}

}  // namespace
