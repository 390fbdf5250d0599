// The running worst of a test's errors, where NaN is the worst of all and stays so: with
// std::max(worst, error) a NaN error is dropped (max(a, NaN) is a), and a NaN result would pass a
// tolerance check unseen.
#pragma once

#include <cmath>

namespace flashserve::testing {

inline double worse(double worst, double error) {
  if (std::isnan(worst)) return worst;
  return std::isnan(error) || error > worst ? error : worst;
}

}  // namespace flashserve::testing
