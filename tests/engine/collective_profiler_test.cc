// The collective profiler (engine/collective_profiler.h) over the in-process group: each table has
// the grid's message sizes as its axis and positive, non-decreasing times (both collectives,
// several rank counts); a malformed grid and a device list of the wrong length are refused by
// name. The times themselves are the host's and assert nothing about speed.
#include "engine/collective_profiler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashserve/error.h"
#include "model/local_communicator.h"

namespace flashserve::engine {
namespace {

TEST(CollectiveProfiler, TablesFollowTheGridForBothCollectives) {
  for (const int ranks : {2, 3})
    for (const Collective c : {Collective::kAllReduce, Collective::kAllGather}) {
      auto group = model::make_local_group(ranks);
      CollectiveGrid grid = CollectiveGrid::for_counts(c, {1, 8, 64}, 2048, DType::kFloat32);
      EXPECT_EQ(grid.bytes, (std::vector<int64_t>{2048, 16384, 131072}));
      grid.reps = 2;
      grid.warmup = 1;
      const serve::ProfileTable1 t = profile_collective(*group, {}, grid);
      ASSERT_EQ(t.x, (std::vector<double>{2048, 16384, 131072}));
      ASSERT_EQ(t.seconds.size(), 3u);
      EXPECT_GT(t.seconds[0], 0);
      for (size_t i = 1; i < t.seconds.size(); ++i) EXPECT_GE(t.seconds[i], t.seconds[i - 1]);
    }
}

TEST(CollectiveProfiler, MalformedGridsAndDeviceListsAreRefusedByName) {
  auto group = model::make_local_group(2);
  const auto argument = [&](const CollectiveGrid& g, const std::vector<int>& devices) {
    try {
      profile_collective(*group, devices, g);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("(accepted)");
  };
  CollectiveGrid g;
  g.collective = Collective::kAllGather;
  EXPECT_EQ(argument(g, {}), "grid");  // no sizes
  g.bytes = {4096, 4096};
  EXPECT_EQ(argument(g, {}), "grid");  // not increasing
  g.bytes = {4098};
  EXPECT_EQ(argument(g, {}), "grid");  // not a multiple of float32's 4 bytes
  g.bytes = {4096};
  EXPECT_EQ(argument(g, {0, 1, 2}), "devices");  // three devices for two ranks
  // The group is still usable after the refusals (none reached a collective).
  g.reps = 1;
  g.warmup = 0;
  EXPECT_EQ(argument(g, {}), "(accepted)");
}

}  // namespace
}  // namespace flashserve::engine
