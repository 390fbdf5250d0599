// The one way every flashserve subcommand reads a number from the command line. CLI11's own
// conversions accept "1e3" for an int as 1000 but wrap "2^64" silently in places, let NaN and inf
// through for doubles and exit with its own codes (104, 105, 109, ...); these helpers parse with
// std::from_chars (no locale, exact overflow detection), check the range, name the option in the
// error, and every usage error leaves with kUsageExit.
//
//   int64_t budget = 512;
//   add_int(app, "--budget", budget, {1, 1 << 20}, "tokens per step");
//   add_real(app, "--rate", rate, {0, 1e6, Open::kLow}, "requests per second");
//   if (int rc = parse(app, argc, argv); rc >= 0) return rc;  // --help, or a usage error
//   refuse_unless(cv_opt, arrival == "gamma", "only applies to --arrival gamma");
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "flashserve/error.h"

namespace flashserve::cli {

// The exit status of every command-line usage error (bad number, unknown option, conflicting
// options, an argument the library refuses); 1 is left for failures at run time.
inline constexpr int kUsageExit = 2;

// A usage error naming the option: "--budget: 0 is outside [1, 1048576]".
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& option, const std::string& what)
      : std::runtime_error(option + ": " + what), option_(option) {}
  const std::string& option() const { return option_; }

 private:
  std::string option_;
};

// Which ends of a real range are excluded.
enum class Open { kNone, kLow, kHigh, kBoth };

template <typename T>
struct Range {
  T lo, hi;
  Open open = Open::kNone;
};

// Parses `text` as a whole decimal integer in [range.lo, range.hi] (no sign for unsigned).
int64_t parse_int(std::string_view option, std::string_view text, Range<int64_t> range);
uint64_t parse_uint(std::string_view option, std::string_view text, Range<uint64_t> range);
// Parses `text` as a finite decimal real in the range (NaN, inf, overflow and underflow to 0 of a
// non-zero literal are errors: "1e-400" is not silently 0).
double parse_real(std::string_view option, std::string_view text, Range<double> range);

// Options bound to a variable through the parsers above; the help shows the range and the
// variable's value as the default.
CLI::Option* add_int(CLI::App& app, const std::string& name, int64_t& target, Range<int64_t> range,
                     const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& name, int32_t& target, Range<int64_t> range,
                     const std::string& help);
CLI::Option* add_uint(CLI::App& app, const std::string& name, uint64_t& target,
                      const std::string& help);
CLI::Option* add_real(CLI::App& app, const std::string& name, double& target, Range<double> range,
                      const std::string& help);

// Parses argv into app. Returns -1 to go on, 0 after printing --help, kUsageExit after printing a
// usage error (CLI11's or ours) to `errors` as "flashserve <command>: error: ...".
int parse(CLI::App& app, int argc, char** argv, std::FILE* errors = stderr);

// Runs `check` (a library call that validates the option's value: a preset name, say) at once,
// and turns the invalid-argument Error it throws into a UsageError naming `option`: the error
// names the flag the user typed, and comes before any long work (loading a model).
template <typename F>
auto check_option(const std::string& option, F&& check) {
  try {
    return std::forward<F>(check)();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument) throw;
    // "shape: 'x' is not one of ..." under --shape drops the library's name for the flag; an
    // argument that is not that name (a path) stays: "--model: /x: is not a model directory".
    std::string what = e.what(), name = option.substr(option.find_first_not_of('-'));
    for (char& c : name) c = c == '-' ? '_' : c;
    const std::string& arg = e.argument();
    if (!arg.empty() && name.size() >= arg.size() &&
        name.compare(name.size() - arg.size(), arg.size(), arg) == 0)
      what.erase(0, arg.size() + 2);
    throw UsageError(option, what);
  }
}

// Throws UsageError when `option` was given but does not apply (`why`): every option is either
// used or refused, never silently ignored.
void refuse_unless(const CLI::Option* option, bool applies, const std::string& why);

}  // namespace flashserve::cli
