#include "cli/options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <system_error>

namespace flashserve::cli {
namespace {

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

// %.17g, so that the bounds in a message are the bounds the check uses.
std::string number(double x) {
  char buf[40];
  if (x == std::trunc(x) && std::abs(x) < 1e15) {  // 100, not 1e+02
    std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", x);
  // Trim "1.0000000000000001e-05"-style noise when a shorter form reads back the same.
  for (int digits = 1; digits < 17; ++digits) {
    char shorter[40];
    std::snprintf(shorter, sizeof shorter, "%.*g", digits, x);
    if (std::strtod(shorter, nullptr) == x) return shorter;
  }
  return buf;
}
std::string number(int64_t x) {
  return std::to_string(x);
}
std::string number(uint64_t x) {
  return std::to_string(x);
}
std::string number(int32_t x) {
  return std::to_string(x);
}

template <typename T>
std::string interval(const Range<T>& r) {
  const bool lo_open = r.open == Open::kLow || r.open == Open::kBoth;
  const bool hi_open = r.open == Open::kHigh || r.open == Open::kBoth;
  return std::string(lo_open ? "(" : "[") + number(r.lo) + ", " + number(r.hi) +
         (hi_open ? ")" : "]");
}

template <typename T>
bool inside(T x, const Range<T>& r) {
  const bool lo_open = r.open == Open::kLow || r.open == Open::kBoth;
  const bool hi_open = r.open == Open::kHigh || r.open == Open::kBoth;
  return (lo_open ? x > r.lo : x >= r.lo) && (hi_open ? x < r.hi : x <= r.hi);
}

// from_chars over the whole text: a trailing "k", "1.5" for an int or an empty value is an error.
template <typename T>
T whole(std::string_view option, std::string_view text, const char* what) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range)
    throw UsageError(std::string(option), quoted(text) + " is out of range");
  if (ec != std::errc() || ptr != end || text.empty())
    throw UsageError(std::string(option), quoted(text) + " is not " + what);
  return value;
}

template <typename T>
T checked(std::string_view option, std::string_view text, T value, const Range<T>& range) {
  if (!inside(value, range))
    throw UsageError(std::string(option), quoted(text) + " is outside " + interval(range));
  return value;
}

// An option whose text `parse` turns into the bound variable; the help shows the type, the range
// and the variable's value as the default.
template <typename T, typename Parse>
CLI::Option* bind_option(CLI::App& app, const std::string& name, T& target, const Parse& parse,
                         const char* type, const std::string& range, const std::string& help) {
  auto* opt = app.add_option_function<std::string>(
      name, [&target, parse](const std::string& s) { target = parse(s); }, help);
  opt->type_name(std::string(type) + " in " + range);
  opt->default_str(number(target));
  return opt;
}

}  // namespace

int64_t parse_int(std::string_view option, std::string_view text, Range<int64_t> range) {
  return checked(option, text, whole<int64_t>(option, text, "a whole number"), range);
}

uint64_t parse_uint(std::string_view option, std::string_view text, Range<uint64_t> range) {
  // from_chars would read "-1" as an error already, but say why.
  if (!text.empty() && text[0] == '-')
    throw UsageError(std::string(option), quoted(text) + " must not be negative");
  return checked(option, text, whole<uint64_t>(option, text, "a whole number"), range);
}

double parse_real(std::string_view option, std::string_view text, Range<double> range) {
  const double x = whole<double>(option, text, "a number");
  if (!std::isfinite(x)) throw UsageError(std::string(option), quoted(text) + " is not finite");
  return checked(option, text, x, range);
}

CLI::Option* add_int(CLI::App& app, const std::string& name, int64_t& target, Range<int64_t> range,
                     const std::string& help) {
  const auto parse = [name, range](const std::string& s) { return parse_int(name, s, range); };
  return bind_option(app, name, target, parse, "INT", interval(range), help);
}

CLI::Option* add_int(CLI::App& app, const std::string& name, int32_t& target, Range<int64_t> range,
                     const std::string& help) {
  constexpr int64_t lo = std::numeric_limits<int32_t>::min();
  constexpr int64_t hi = std::numeric_limits<int32_t>::max();
  if (range.lo < lo || range.hi > hi)
    throw std::logic_error(name + ": range " + interval(range) + " exceeds int32");
  const auto parse = [name, range](const std::string& s) {
    return static_cast<int32_t>(parse_int(name, s, range));
  };
  return bind_option(app, name, target, parse, "INT", interval(range), help);
}

CLI::Option* add_uint(CLI::App& app, const std::string& name, uint64_t& target,
                      const std::string& help) {
  const Range<uint64_t> range{0, std::numeric_limits<uint64_t>::max()};
  const auto parse = [name, range](const std::string& s) { return parse_uint(name, s, range); };
  return bind_option(app, name, target, parse, "UINT", interval(range), help);
}

CLI::Option* add_real(CLI::App& app, const std::string& name, double& target, Range<double> range,
                      const std::string& help) {
  const auto parse = [name, range](const std::string& s) { return parse_real(name, s, range); };
  return bind_option(app, name, target, parse, "REAL", interval(range), help);
}

int parse(CLI::App& app, int argc, char** argv, std::FILE* errors) {
  const char* command = argc > 0 ? argv[0] : "?";
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(errors, "flashserve %s: error: %s\n", command, e.what());
  } catch (const UsageError& e) {
    std::fprintf(errors, "flashserve %s: error: %s\n", command, e.what());
  }
  std::fprintf(errors, "run 'flashserve %s --help' for the options\n", command);
  return kUsageExit;
}

void refuse_unless(const CLI::Option* option, bool applies, const std::string& why) {
  if (option->count() > 0 && !applies) throw UsageError(option->get_name(), why);
}

}  // namespace flashserve::cli
