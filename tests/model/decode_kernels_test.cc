// The CUDA runner's switches for small steps' kernels, read strictly from the environment
// (model/decode_kernels.h): unset or empty keeps the default, 0/1 set it, anything else is refused
// naming the variable.
#include "model/decode_kernels.h"

#include <gtest/gtest.h>

#include <string>

#include "flashserve/error.h"

namespace flashserve::model {
namespace {

TEST(DecodeKernels, UnsetOrEmptyKeepsTheDefaults) {
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const DecodeKernelOptions o = decode_kernel_options_from_env(unset, unset);
    EXPECT_EQ(o.gemv, kGemvByDefault);
    EXPECT_EQ(o.pdl, kPdlByDefault);
  }
}

TEST(DecodeKernels, ZeroAndOneSetEachSwitchAlone) {
  EXPECT_TRUE(decode_kernel_options_from_env("1", nullptr).gemv);
  EXPECT_FALSE(decode_kernel_options_from_env("0", nullptr).gemv);
  EXPECT_EQ(decode_kernel_options_from_env("1", nullptr).pdl, kPdlByDefault);
  EXPECT_TRUE(decode_kernel_options_from_env(nullptr, "1").pdl);
  EXPECT_FALSE(decode_kernel_options_from_env(nullptr, "0").pdl);
  EXPECT_EQ(decode_kernel_options_from_env(nullptr, "0").gemv, kGemvByDefault);
}

TEST(DecodeKernels, AnyOtherValueIsRefusedByName) {
  for (const char* bad : {"yes", "on", "2", " 1", "1 ", "true", "01"}) {
    try {
      decode_kernel_options_from_env(bad, nullptr);
      ADD_FAILURE() << "FLASHSERVE_GEMV=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_GEMV") << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
    try {
      decode_kernel_options_from_env(nullptr, bad);
      ADD_FAILURE() << "FLASHSERVE_PDL=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_PDL") << e.what();
    }
  }
}

}  // namespace
}  // namespace flashserve::model
