// NaN and infinity semantics of the CPU path and of the float64 reference (issue 9): a NaN in q or
// in a key a row sees, or a score overflowing float32, gives a NaN row and NaN LSE, never the zero
// row with LSE -inf that means "saw no key"; rows that see no key stay zero / -inf; every other row
// still matches the reference. Which rows must be NaN is predicted from the mask alone
// (support/nan_inputs.h).
#include <gtest/gtest.h>

#include "support/compare.h"
#include "support/nan_cases.h"

namespace flashserve::testing {
namespace {

class CpuNan : public ::testing::TestWithParam<NanCase> {};

TEST_P(CpuNan, RowsThatSeeAPoisonedInputAreNan) {
  expect_nan_rule(
      GetParam(),
      [](AttentionCase& c) {
        c.poison_outputs();
        attention_forward(c.params());
        return read_output(c.params());
      },
      "cpu path");
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuNan,
                         ::testing::ValuesIn(nan_cases({DType::kFloat32, DType::kFloat16,
                                                        DType::kBFloat16})),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flashserve::testing
