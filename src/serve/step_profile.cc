#include "serve/step_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "profile", what);
}

// The segment [i, i + 1] of `axis` that interpolates (or, outside, extrapolates) at v, and v's
// weight on its upper end (outside [0, 1] when extrapolating). A one-point axis: (0, 0).
std::pair<size_t, double> segment(const std::vector<double>& axis, double v) {
  if (axis.size() < 2) return {0, 0.0};
  size_t i = std::upper_bound(axis.begin(), axis.end(), v) - axis.begin();
  i = std::clamp<size_t>(i, 1, axis.size() - 1) - 1;
  return {i, (v - axis[i]) / (axis[i + 1] - axis[i])};
}

void check_axis(const std::vector<double>& axis, const std::string& what) {
  if (axis.empty()) bad(what + " has no points");
  for (size_t i = 0; i < axis.size(); ++i) {
    if (!(axis[i] >= 0) || !std::isfinite(axis[i]))
      bad(what + " has a negative or non-finite point");
    if (i > 0 && !(axis[i] > axis[i - 1])) bad(what + " is not strictly increasing");
  }
}

void check_values(const std::vector<double>& s, const std::string& what) {
  for (double v : s)
    if (!(v >= 0) || !std::isfinite(v)) bad(what + " has a negative or non-finite time");
}

}  // namespace

double ProfileTable1::at(double v) const {
  if (x.size() == 1) return std::max(seconds[0], 0.0);
  const auto [i, w] = segment(x, v);
  return std::max((1 - w) * seconds[i] + w * seconds[i + 1], 0.0);
}

double ProfileTable2::at(double u, double v) const {
  const auto [i, wu] = segment(x, u);
  const auto [j, wv] = segment(y, v);
  const bool two_x = x.size() > 1, two_y = y.size() > 1;
  auto s = [&](size_t a, size_t b) { return cell(a, b); };
  const double lo = two_y ? (1 - wv) * s(i, j) + wv * s(i, j + 1) : s(i, j);
  if (!two_x) return std::max(lo, 0.0);
  const double hi = two_y ? (1 - wv) * s(i + 1, j) + wv * s(i + 1, j + 1) : s(i + 1, j);
  return std::max((1 - wu) * lo + wu * hi, 0.0);
}

void make_monotone(ProfileTable1& t) {
  for (size_t i = 1; i < t.seconds.size(); ++i)
    t.seconds[i] = std::max(t.seconds[i], t.seconds[i - 1]);
}

void make_monotone(ProfileTable2& t) {
  // Along y in every row, then along x in every column: the second pass keeps the first's order
  // (a running maximum of columns that are each non-decreasing in y stays non-decreasing in y).
  for (size_t i = 0; i < t.x.size(); ++i)
    for (size_t j = 1; j < t.y.size(); ++j) t.cell(i, j) = std::max(t.cell(i, j), t.cell(i, j - 1));
  for (size_t j = 0; j < t.y.size(); ++j)
    for (size_t i = 1; i < t.x.size(); ++i) t.cell(i, j) = std::max(t.cell(i, j), t.cell(i - 1, j));
}

double StepProfile::all_reduce_seconds(double tokens) const {
  if (all_reduce.x.empty()) return 0;
  return static_cast<double>(all_reduces_per_step) *
         all_reduce.at(tokens * all_reduce_bytes_per_token);
}

double StepProfile::logits_gather_seconds(double sampled) const {
  if (all_gather.x.empty() || sampled <= 0) return 0;
  return all_gather.at(sampled * logits_gather_bytes_per_row);
}

void StepProfile::validate(const std::string& name) const {
  auto one = [&](const ProfileTable1& t, const char* table) {
    const std::string what = name + ": table " + table;
    check_axis(t.x, what);
    if (t.seconds.size() != t.x.size()) bad(what + ": values do not match its axis");
    check_values(t.seconds, what);
    for (size_t i = 1; i < t.seconds.size(); ++i)
      if (t.seconds[i] < t.seconds[i - 1]) bad(what + " decreases along x");
  };
  auto two = [&](const ProfileTable2& t, const char* table) {
    const std::string what = name + ": table " + table;
    check_axis(t.x, what + "'s x");
    check_axis(t.y, what + "'s y");
    if (t.seconds.size() != t.x.size() * t.y.size()) bad(what + ": values do not match its axes");
    check_values(t.seconds, what);
    for (size_t i = 0; i < t.x.size(); ++i)
      for (size_t j = 0; j < t.y.size(); ++j) {
        if (i > 0 && t.cell(i, j) < t.cell(i - 1, j)) bad(what + " decreases along x");
        if (j > 0 && t.cell(i, j) < t.cell(i, j - 1)) bad(what + " decreases along y");
      }
  };
  one(linear, "linear");
  one(decode_base, "decode_base");
  two(prefill_attn, "prefill_attn");
  two(decode_attn, "decode_attn");
  for (auto [v, what] : {std::pair{sample_row_s, "sample_row"}, std::pair{overhead_s, "overhead"}})
    if (!(v >= 0) || !std::isfinite(v)) bad(name + ": " + what + " must be finite and >= 0");
  // The all-reduce table and the step's count of them come together, or neither does.
  const bool counts = all_reduces_per_step > 0 && all_reduce_bytes_per_token > 0 &&
                      std::isfinite(all_reduce_bytes_per_token);
  if (all_reduce.x.empty() != !counts ||
      (!counts && (all_reduces_per_step != 0 || all_reduce_bytes_per_token != 0)))
    bad(name +
        ": tensor parallelism needs both the all_reduce table and one all_reduces row "
        "(positive all-reduces a step and bytes a token)");
  if (!all_reduce.x.empty()) one(all_reduce, "all_reduce");
  // So do the all-gather table and its bytes a row; a tensor-parallel step has both collectives.
  const bool gather = logits_gather_bytes_per_row > 0 && std::isfinite(logits_gather_bytes_per_row);
  if (all_gather.x.empty() != !gather || (!gather && logits_gather_bytes_per_row != 0))
    bad(name +
        ": the logits' all-gather needs both the all_gather table and one logits_gather row "
        "(positive bytes a sampled row)");
  if (all_reduce.x.empty() != all_gather.x.empty())
    bad(name +
        ": tensor parallelism needs both collectives' tables, all_reduce and all_gather (a "
        "profile without all_gather predates the logits' gather: measure it again)");
  if (!all_gather.x.empty()) one(all_gather, "all_gather");
}

void StepProfile::write_csv(std::ostream& out) const {
  out << "# flashserve step profile (docs/serving.md: Profile cost model)\n";
  for (const auto& [k, v] : meta) out << "# " << k << ": " << v << "\n";
  out << "table,x,y,seconds\n";
  char buf[128];
  auto row = [&](const char* t, double x, double y, double s) {
    std::snprintf(buf, sizeof buf, "%s,%.17g,%.17g,%.17g\n", t, x, y, s);
    out << buf;
  };
  for (size_t i = 0; i < linear.x.size(); ++i) row("linear", linear.x[i], 0, linear.seconds[i]);
  for (size_t i = 0; i < decode_base.x.size(); ++i)
    row("decode_base", decode_base.x[i], 0, decode_base.seconds[i]);
  for (const auto& [t, tab] :
       {std::pair{"prefill_attn", &prefill_attn}, std::pair{"decode_attn", &decode_attn}})
    for (size_t i = 0; i < tab->x.size(); ++i)
      for (size_t j = 0; j < tab->y.size(); ++j) row(t, tab->x[i], tab->y[j], tab->cell(i, j));
  row("sample_row", 0, 0, sample_row_s);
  row("overhead", 0, 0, overhead_s);
  for (size_t i = 0; i < all_reduce.x.size(); ++i)
    row("all_reduce", all_reduce.x[i], 0, all_reduce.seconds[i]);
  if (!all_reduce.x.empty())
    row("all_reduces", static_cast<double>(all_reduces_per_step), all_reduce_bytes_per_token, 0);
  for (size_t i = 0; i < all_gather.x.size(); ++i)
    row("all_gather", all_gather.x[i], 0, all_gather.seconds[i]);
  if (!all_gather.x.empty()) row("logits_gather", logits_gather_bytes_per_row, 0, 0);
}

StepProfile StepProfile::read_csv(std::istream& in, const std::string& name) {
  StepProfile p;
  std::string line;
  int64_t lineno = 0;
  bool header = false, have_sample = false, have_overhead = false, have_counts = false,
       have_gather_bytes = false;
  auto fail = [&](const std::string& what) {
    bad(name + ":" + std::to_string(lineno) + ": " + what);
  };
  std::map<double, double> lin, dbase, ar, ag;
  std::map<std::pair<double, double>, double> pa, da;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line[0] == '#') {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        auto trim = [](std::string s) {
          s.erase(0, s.find_first_not_of(" \t#"));
          s.erase(s.find_last_not_of(" \t") + 1);
          return s;
        };
        p.meta[trim(line.substr(0, colon))] = trim(line.substr(colon + 1));
      }
      continue;
    }
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) {
      c.erase(0, c.find_first_not_of(" \t"));
      c.erase(c.find_last_not_of(" \t") + 1);
      f.push_back(c);
    }
    if (!header) {
      if (f != std::vector<std::string>{"table", "x", "y", "seconds"})
        fail("the header must be 'table,x,y,seconds'");
      header = true;
      continue;
    }
    if (f.size() != 4) fail("expected 4 fields");
    double v[3];
    for (int k = 0; k < 3; ++k) {
      try {
        size_t pos = 0;
        v[k] = std::stod(f[k + 1], &pos);
        if (pos != f[k + 1].size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        fail("'" + f[k + 1] + "' is not a number");
      }
      if (!(v[k] >= 0) || !std::isfinite(v[k])) fail("'" + f[k + 1] + "' must be finite and >= 0");
    }
    const std::string& t = f[0];
    bool fresh = true;
    if (t == "linear" || t == "decode_base" || t == "all_reduce" || t == "all_gather") {
      if (v[1] != 0) fail(t + " has one axis: y must be 0");
      fresh = (t == "linear"        ? lin
               : t == "decode_base" ? dbase
               : t == "all_reduce"  ? ar
                                    : ag)
                  .emplace(v[0], v[2])
                  .second;
    } else if (t == "all_reduces") {
      if (v[0] != std::floor(v[0])) fail("all_reduces: x counts all-reduces: a whole number");
      fresh = !have_counts;
      have_counts = true;
      p.all_reduces_per_step = static_cast<int64_t>(v[0]);
      p.all_reduce_bytes_per_token = v[1];
    } else if (t == "logits_gather") {
      if (v[1] != 0 || v[2] != 0) fail("logits_gather: x is bytes a sampled row; y and seconds 0");
      fresh = !have_gather_bytes;
      have_gather_bytes = true;
      p.logits_gather_bytes_per_row = v[0];
    } else if (t == "prefill_attn" || t == "decode_attn") {
      fresh = (t == "prefill_attn" ? pa : da).emplace(std::pair{v[0], v[1]}, v[2]).second;
    } else if (t == "sample_row" || t == "overhead") {
      bool& have = t == "sample_row" ? have_sample : have_overhead;
      fresh = !have;
      have = true;
      (t == "sample_row" ? p.sample_row_s : p.overhead_s) = v[2];
    } else {
      fail("unknown table '" + t + "'");
    }
    if (!fresh) fail("duplicate point of table " + t);
  }
  if (!header) bad(name + ": no 'table,x,y,seconds' header");
  if (!have_sample || !have_overhead) bad(name + ": lacks the sample_row or overhead row");
  for (auto [m, tab] : {std::pair{&lin, &p.linear}, std::pair{&dbase, &p.decode_base},
                        std::pair{&ar, &p.all_reduce}, std::pair{&ag, &p.all_gather}})
    for (const auto& [x, s] : *m) tab->x.push_back(x), tab->seconds.push_back(s);
  for (auto [m, tab, t] : {std::tuple{&pa, &p.prefill_attn, "prefill_attn"},
                           std::tuple{&da, &p.decode_attn, "decode_attn"}}) {
    std::set<double> xs, ys;
    for (const auto& [xy, s] : *m) xs.insert(xy.first), ys.insert(xy.second);
    tab->x.assign(xs.begin(), xs.end());
    tab->y.assign(ys.begin(), ys.end());
    if (m->size() != xs.size() * ys.size())
      bad(name + ": table " + t + "'s " + std::to_string(m->size()) +
          " points do not form the full " + std::to_string(xs.size()) + " x " +
          std::to_string(ys.size()) + " grid");
    for (const auto& [xy, s] : *m) tab->seconds.push_back(s);  // map order: x outer, y inner
  }
  p.validate(name);
  return p;
}

StepProfile StepProfile::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad("cannot open '" + path + "'");
  return read_csv(in, path);
}

}  // namespace flashserve::serve
