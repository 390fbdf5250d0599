// The checked option parsers: every malformed, non-finite, overflowing or out-of-range number is a
// UsageError naming the option; every number in range reads back exactly.
#include "cli/options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cli/usage_error_of.h"

namespace flashserve::cli {
namespace {

TEST(Options, IntegersInRangeReadBackExactly) {
  std::mt19937_64 rng(7);
  const Range<int64_t> all{std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()};
  for (int i = 0; i < 2000; ++i) {
    const int64_t x = static_cast<int64_t>(rng()) >> (rng() % 63);
    EXPECT_EQ(parse_int("--n", std::to_string(x), all), x);
  }
  EXPECT_EQ(parse_uint("--seed", "18446744073709551615", {0, ~uint64_t{0}}), ~uint64_t{0});
}

TEST(Options, MalformedIntegersNameTheOption) {
  const Range<int64_t> r{1, 100};
  for (const char* bad : {"", "1e3", "1.5", "12k", " 5", "5 ", "+5", "0x10", "five", "--5"})
    EXPECT_EQ(error_of([&] { parse_int("--budget", bad, r); }),
              std::string("--budget: '") + bad + "' is not a whole number")
        << bad;
  EXPECT_EQ(error_of([&] { parse_int("--budget", "0", r); }), "--budget: '0' is outside [1, 100]");
  EXPECT_EQ(error_of([&] { parse_int("--budget", "101", r); }),
            "--budget: '101' is outside [1, 100]");
  EXPECT_EQ(error_of([&] { parse_int("--budget", "9223372036854775808", r); }),
            "--budget: '9223372036854775808' is out of range");
  EXPECT_EQ(error_of([&] {
              parse_uint("--seed", "-1", {0, 10});
            }),
            "--seed: '-1' must not be negative");
  EXPECT_EQ(error_of([&] {
              parse_uint("--seed", "18446744073709551616", {0, ~uint64_t{0}});
            }),
            "--seed: '18446744073709551616' is out of range");
}

TEST(Options, RealsAreFiniteAndInTheirInterval) {
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "infinity"})
    EXPECT_EQ(error_of([&] {
                parse_real("--rate", bad, {0, 1e6, Open::kLow});
              }),
              std::string("--rate: '") + bad + "' is not finite")
        << bad;
  for (const char* bad : {"1e999", "1e-400", "-1e999"})
    EXPECT_EQ(error_of([&] {
                parse_real("--rate", bad, {-1e300, 1e300});
              }),
              std::string("--rate: '") + bad + "' is out of range")
        << bad;
  EXPECT_EQ(error_of([&] {
              parse_real("--rate", "0", {0, 1e6, Open::kLow});
            }),
            "--rate: '0' is outside (0, 1000000]");
  EXPECT_EQ(error_of([&] {
              parse_real("--w", "1", {0, 1, Open::kHigh});
            }),
            "--w: '1' is outside [0, 1)");
  EXPECT_EQ(error_of([&] {
              parse_real("--cv", "1e-160", {0.01, 100});
            }),
            "--cv: '1e-160' is outside [0.01, 100]");
  EXPECT_EQ(error_of([&] { parse_real("--x", "2.5.1", {0, 10}); }), "--x: '2.5.1' is not a number");
  // Random reals print and parse back bit for bit (%.17g round-trips a double).
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  for (int i = 0; i < 2000; ++i) {
    const double x = u(rng);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    EXPECT_EQ(parse_real("--x", buf, {-1e6, 1e6}), x) << buf;
  }
}

// Through CLI11: the options bind the variable, keep the default when absent, and parse() turns
// every error into kUsageExit.
int run(std::vector<std::string> args, int64_t& n, double& x) {
  CLI::App app{"test"};
  add_int(app, "--n", n, {1, 10}, "n");
  add_real(app, "--x", x, {0, 1}, "x");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse(app, static_cast<int>(argv.size()), argv.data());
}

TEST(Options, ParseBindsAndExitsWithTheUsageStatus) {
  int64_t n = 3;
  double x = 0.5;
  EXPECT_EQ(run({"t"}, n, x), -1);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(run({"t", "--n", "7", "--x", "0.25"}, n, x), -1);
  EXPECT_EQ(n, 7);
  EXPECT_EQ(x, 0.25);
  for (std::vector<std::string> bad : {std::vector<std::string>{"t", "--n", "11"},
                                       {"t", "--n", "1e1"},
                                       {"t", "--x", "nan"},
                                       {"t", "--bogus"},
                                       {"t", "--n"},
                                       {"t", "--n", "2", "--n", "3"}})
    EXPECT_EQ(run(bad, n, x), kUsageExit) << bad[1];
  EXPECT_EQ(run({"t", "--help"}, n, x), 0);
}

TEST(Options, RefuseUnlessNamesTheIgnoredOption) {
  CLI::App app{"test"};
  double cv = 1;
  auto* opt = add_real(app, "--cv", cv, {0.01, 100}, "cv");
  std::string a0 = "t", a1 = "--cv", a2 = "2";
  char* argv[] = {a0.data(), a1.data(), a2.data()};
  ASSERT_EQ(parse(app, 3, argv), -1);
  EXPECT_EQ(error_of([&] { refuse_unless(opt, false, "only applies to --arrival gamma"); }),
            "--cv: only applies to --arrival gamma");
  EXPECT_EQ(error_of([&] { refuse_unless(opt, true, "unused"); }), "accepted");
}

// check_option: a library's invalid-argument Error becomes a UsageError naming the flag (the
// library's own name for it dropped, a path kept); other kinds pass through; a value comes back.
TEST(Options, CheckOptionNamesTheFlag) {
  auto throws = [](ErrorKind kind, const char* arg, const char* what) {
    return [=]() -> int { throw Error(kind, arg, what); };
  };
  auto usage = [](const std::string& flag, auto f) {
    try {
      check_option(flag, f);
    } catch (const UsageError& e) {
      EXPECT_EQ(e.option(), flag);
      return std::string(e.what());
    }
    return std::string("no UsageError");
  };
  EXPECT_EQ(usage("--shape", throws(ErrorKind::kInvalidArgument, "shape", "'x' is not one of a")),
            "--shape: 'x' is not one of a");
  EXPECT_EQ(usage("--predict-gpu", throws(ErrorKind::kInvalidArgument, "gpu", "'h9' is not")),
            "--predict-gpu: 'h9' is not");
  EXPECT_EQ(usage("--model", throws(ErrorKind::kInvalidArgument, "/x", "is not a model directory")),
            "--model: /x: is not a model directory");
  EXPECT_THROW(check_option("--model", throws(ErrorKind::kUnsupported, "device", "no CUDA")),
               Error);
  EXPECT_EQ(check_option("--n", [] { return 7; }), 7);
}

}  // namespace
}  // namespace flashserve::cli
