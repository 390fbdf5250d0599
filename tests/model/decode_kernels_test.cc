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
    const DecodeKernelOptions o = decode_kernel_options_from_env(unset, unset, unset, unset);
    EXPECT_EQ(o.gemv_rows, kGemvRowsByDefault);
    EXPECT_EQ(o.pdl, kPdlByDefault);
    EXPECT_EQ(o.pdl_attention, kPdlAttentionByDefault);
    EXPECT_EQ(o.early_weights, kEarlyWeightsByDefault);
  }
  EXPECT_FALSE(kPdlAttentionByDefault);  // measured no faster at batch 1 (session 35)
  EXPECT_FALSE(kEarlyWeightsByDefault);  // measured no faster (session 36)
}

TEST(DecodeKernels, ZeroAndOneSetEachSwitchAlone) {
  EXPECT_EQ(decode_kernel_options_from_env("1", nullptr, nullptr, nullptr).gemv_rows,
            kGemvMaxProductRows);
  EXPECT_EQ(decode_kernel_options_from_env("0", nullptr, nullptr, nullptr).gemv_rows, 0);
  EXPECT_EQ(decode_kernel_options_from_env("1", nullptr, nullptr, nullptr).pdl, kPdlByDefault);
  EXPECT_TRUE(decode_kernel_options_from_env(nullptr, "1", nullptr, nullptr).pdl);
  EXPECT_FALSE(decode_kernel_options_from_env(nullptr, "0", nullptr, nullptr).pdl);
  EXPECT_EQ(decode_kernel_options_from_env(nullptr, "0", nullptr, nullptr).gemv_rows,
            kGemvRowsByDefault);
  EXPECT_TRUE(decode_kernel_options_from_env(nullptr, nullptr, "1", nullptr).pdl_attention);
  EXPECT_FALSE(decode_kernel_options_from_env(nullptr, nullptr, "0", nullptr).pdl_attention);
  EXPECT_EQ(decode_kernel_options_from_env(nullptr, nullptr, "1", nullptr).pdl, kPdlByDefault);
  EXPECT_TRUE(decode_kernel_options_from_env(nullptr, nullptr, nullptr, "1").early_weights);
  EXPECT_FALSE(decode_kernel_options_from_env(nullptr, nullptr, nullptr, "0").early_weights);
  EXPECT_EQ(decode_kernel_options_from_env(nullptr, nullptr, nullptr, "1").pdl_attention,
            kPdlAttentionByDefault);
}

TEST(DecodeKernels, AnyOtherValueIsRefusedByName) {
  for (const char* bad : {"yes", "on", "2", " 1", "1 ", "true", "01"}) {
    try {
      decode_kernel_options_from_env(bad, nullptr, nullptr, nullptr);
      ADD_FAILURE() << "FLASHSERVE_GEMV=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_GEMV") << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
    try {
      decode_kernel_options_from_env(nullptr, bad, nullptr, nullptr);
      ADD_FAILURE() << "FLASHSERVE_PDL=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_PDL") << e.what();
    }
    try {
      decode_kernel_options_from_env(nullptr, nullptr, bad, nullptr);
      ADD_FAILURE() << "FLASHSERVE_PDL_ATTENTION=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_PDL_ATTENTION") << e.what();
    }
    try {
      decode_kernel_options_from_env(nullptr, nullptr, nullptr, bad);
      ADD_FAILURE() << "FLASHSERVE_EARLY_WEIGHTS=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_EARLY_WEIGHTS") << e.what();
    }
  }
}

TEST(DecodeFusion, OffByDefaultAndSetStrictlyByName) {
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const DecodeFusion f = decode_fusion_from_env(unset, unset);
    EXPECT_EQ(f.norm, kFuseNormByDefault);
    EXPECT_EQ(f.silu, kFuseSiluByDefault);
  }
  EXPECT_FALSE(kFuseNormByDefault);  // unmeasured on a GPU: the default kernels stay
  EXPECT_FALSE(kFuseSiluByDefault);
  EXPECT_TRUE(decode_fusion_from_env("1", nullptr).norm);
  EXPECT_FALSE(decode_fusion_from_env("1", nullptr).silu);
  EXPECT_TRUE(decode_fusion_from_env(nullptr, "1").silu);
  EXPECT_FALSE(decode_fusion_from_env("0", "0").any());
  for (const char* bad : {"yes", "2", " 1", "true"}) {
    try {
      decode_fusion_from_env(bad, nullptr);
      ADD_FAILURE() << "FLASHSERVE_FUSE_NORM=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_FUSE_NORM") << e.what();
    }
    try {
      decode_fusion_from_env(nullptr, bad);
      ADD_FAILURE() << "FLASHSERVE_FUSE_SILU=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_FUSE_SILU") << e.what();
    }
  }
}

// The fused GEMV takes steps of at most kFusedMaxTokens tokens, and the norm prologue hidden sizes
// of at most kFusedNormMaxColumns; everything else keeps the unfused kernels.
TEST(DecodeFusion, AppliesOnlyToSmallStepsAndHiddenSizesItTakes) {
  DecodeFusion both;
  both.norm = both.silu = true;
  for (int64_t tokens : {int64_t{1}, int64_t{2}, kFusedMaxTokens}) {
    EXPECT_TRUE(both.for_step(tokens, 4096).norm) << tokens;
    EXPECT_TRUE(both.for_step(tokens, 4096).silu) << tokens;
    EXPECT_TRUE(both.for_step(tokens, kFusedNormMaxColumns).norm) << tokens;
  }
  EXPECT_FALSE(both.for_step(kFusedMaxTokens + 1, 4096).any());
  EXPECT_FALSE(both.for_step(512, 4096).any());
  const DecodeFusion wide = both.for_step(1, kFusedNormMaxColumns + 8);
  EXPECT_FALSE(wide.norm);
  EXPECT_TRUE(wide.silu);
  EXPECT_FALSE(DecodeFusion{}.for_step(1, 4096).any());
}

}  // namespace
}  // namespace flashserve::model
