// Integer arithmetic where sizes the user chose meet (token counts, element counts, byte sizes):
// signed overflow is undefined behaviour, so every such sum and product goes through one of these.
// checked_* throw an Error naming the argument whose size overflowed; saturating_* clamp to the
// int64 range, for comparisons against a limit ("is the product larger than what fits?") that
// must give the right answer without throwing.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "flashserve/error.h"

namespace flashserve {

inline int64_t checked_add(int64_t a, int64_t b, const std::string& argument) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw Error(ErrorKind::kInvalidArgument, argument,
                std::to_string(a) + " + " + std::to_string(b) + " overflows 64-bit integers");
  return r;
}

inline int64_t checked_mul(int64_t a, int64_t b, const std::string& argument) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Error(ErrorKind::kInvalidArgument, argument,
                std::to_string(a) + " x " + std::to_string(b) + " overflows 64-bit integers");
  return r;
}

inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

inline int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min()
                            : std::numeric_limits<int64_t>::max();
}

}  // namespace flashserve
