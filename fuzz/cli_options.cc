// Fuzzes the checked number parsers every subcommand uses (cli/options.h), against an independent
// oracle: parse_int accepts exactly an optional '-' and decimal digits whose value (strtoll) is in
// the range; parse_real accepts only finite values in the range that strtod reads back the same;
// every refusal is a UsageError naming the option. Then the same bytes as an argv through CLI11
// with options of every kind: parse() returns -1 (values then in range), 0 or kUsageExit.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "cli/options.h"

using namespace flashserve::cli;

namespace {
[[noreturn]] void fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "cli_options fuzz: %s: '%s'\n", what, text.c_str());
  std::abort();
}

bool decimal_integer(const std::string& s) {
  size_t i = s.size() > 0 && s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

void check_int(const std::string& text, Range<int64_t> r) {
  int64_t got = 0;
  bool ok = true;
  try {
    got = parse_int("--n", text, r);
  } catch (const UsageError& e) {
    if (e.option() != "--n") fail("UsageError names another option", text);
    ok = false;
  }
  errno = 0;
  const long long want = decimal_integer(text) ? std::strtoll(text.c_str(), nullptr, 10) : 0;
  const bool should = decimal_integer(text) && errno != ERANGE && want >= r.lo && want <= r.hi;
  if (ok != should) fail(ok ? "parse_int accepted" : "parse_int refused", text);
  if (ok && got != want) fail("parse_int value differs from strtoll", text);
}

void check_real(const std::string& text, Range<double> r) {
  double got = 0;
  bool ok = true;
  try {
    got = parse_real("--x", text, r);
  } catch (const UsageError& e) {
    if (e.option() != "--x") fail("UsageError names another option", text);
    ok = false;
  }
  if (!ok) return;
  if (!std::isfinite(got) || got < r.lo || got > r.hi) fail("parse_real out of range", text);
  if ((r.open == Open::kLow || r.open == Open::kBoth) && got == r.lo) fail("open low end", text);
  if ((r.open == Open::kHigh || r.open == Open::kBoth) && got == r.hi) fail("open high end", text);
  char* end = nullptr;
  const double want = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || want != got)
    fail("parse_real differs from strtod", text);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashserve::fuzz::ByteReader in(data, size);
  const int64_t lo = in.flag() ? in.raw<int64_t>() : in.in(-10, 10);
  const int64_t hi = in.flag() ? in.raw<int64_t>() : in.in(-10, 1 << 20);
  const Range<double> real_range{-1e6, 1e6, static_cast<Open>(in.in(0, 3))};
  std::string text = in.rest();
  if (text.find('\0') == std::string::npos) {  // argv strings have no NUL
    check_int(text, {std::min(lo, hi), std::max(lo, hi)});
    check_real(text, real_range);
  }
  // The bytes as an argv (split at NUL and newline) through CLI11.
  std::vector<std::string> args{"cmd"};
  std::string cur;
  for (char ch : text) {
    if (ch == '\0' || ch == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  args.push_back(cur);
  CLI::App app{"fuzz"};
  int64_t n = 5;
  int32_t m = 1;
  uint64_t seed = 0;
  double x = 0.5, rate = 1;
  add_int(app, "--n", n, {1, 1 << 20}, "n");
  add_int(app, "--m", m, {-5, 5}, "m");
  add_uint(app, "--seed", seed, "seed");
  add_real(app, "--x", x, {0, 1, Open::kHigh}, "x");
  auto* rate_opt = add_real(app, "--rate", rate, {0, 1e6, Open::kLow}, "rate");
  std::string name;
  app.add_option("--name", name, "name");
  bool flag = false;
  app.add_flag("--flag", flag, "flag");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  // Usage errors are the common case here: printed to /dev/null, not into the fuzzer's log.
  static std::FILE* const quiet = std::fopen("/dev/null", "w");
  const int rc = parse(app, static_cast<int>(argv.size()), argv.data(), quiet ? quiet : stderr);
  if (rc != -1 && rc != 0 && rc != kUsageExit) fail("parse returned another status", text);
  if (rc == -1) {
    if (n < 1 || n > (1 << 20) || m < -5 || m > 5 || !(x >= 0 && x < 1) ||
        !(rate > 0 && rate <= 1e6))
      fail("an option out of its range was accepted", text);
    try {
      refuse_unless(rate_opt, !flag, "not with --flag");
      if (rate_opt->count() > 0 && flag) fail("refuse_unless let an ignored option through", text);
    } catch (const UsageError& e) {
      if (e.option() != "--rate") fail("refuse_unless names another option", text);
    }
  }
  return 0;
}
