// A fresh directory per test under gtest's temporary directory (removed when the binary exits), and
// the seed of the test's random inputs (fresh each run; printed so that a failure can be replayed
// with FLASHSERVE_TEST_SEED).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "support/temp_dirs.h"

// The tests that run the CPU runner skip in a build without OpenBLAS (CI always has it).
#if FLASHSERVE_WITH_BLAS
#define FLASHSERVE_SKIP_WITHOUT_BLAS() (void)0
inline constexpr bool kHaveBlas = true;
#else
#define FLASHSERVE_SKIP_WITHOUT_BLAS() GTEST_SKIP() << "skipped: built without OpenBLAS"
inline constexpr bool kHaveBlas = false;
#endif

namespace flashserve::model::testing {

inline std::string fresh_dir(const std::string& tag) {
  static int counter = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info->name();  // "Test/param" for a parameterized test: one directory
  std::replace(test.begin(), test.end(), '/', '_');
  return flashserve::testing::temp_dir("fs_model_" + test + "_" + tag + "_" +
                                       std::to_string(::getpid()) + "_" +
                                       std::to_string(counter++));
}

inline uint64_t test_seed() {
  if (const char* s = std::getenv("FLASHSERVE_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

}  // namespace flashserve::model::testing
