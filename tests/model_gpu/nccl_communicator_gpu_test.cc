// The NCCL communicator group (model/nccl_communicator.h) on every GPU of the machine, ranks as
// threads: the all-reduce is the sum on every rank with the same bits (two ranks: the exact float
// sum, a + b being b + a; more: within the reordered-sum bound gamma_{N-1} sum |x|), and the
// all-gather places every rank's block in an output poisoned first. Skips without NCCL in the
// build or without a CUDA device; with one it is a group of one rank (the ranks' exchange needs
// nvidia-h200-x2 or larger).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "device_buffer.h"
#include "flashserve/error.h"
#include "model/nccl_communicator.h"

namespace flashserve::model {
namespace {

TEST(NcclCommunicator, AllReduceAndAllGatherOverEveryGpu) {
  if (!nccl_available()) GTEST_SKIP() << "skipped: built without NCCL";
  const int size = nccl_device_count();
  // One GPU: a group of one rank, NCCL's own single-rank path (the sum and the gather are the
  // input), so a one-GPU machine runs the whole communicator (init, streams, both collectives).
  if (size < 1) GTEST_SKIP() << "skipped: no CUDA device";
  std::vector<int> devices(static_cast<size_t>(size));
  for (int d = 0; d < size; ++d) devices[static_cast<size_t>(d)] = d;
  auto group = make_nccl_group(devices);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t count : {int64_t{1}, int64_t{4097}, int64_t{1} << 20}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<std::vector<float>> in(static_cast<size_t>(size));
    for (auto& v : in) {
      v.resize(static_cast<size_t>(count));
      for (float& x : v) x = u(rng);
    }
    std::vector<std::vector<float>> reduced(in.size()), gathered(in.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r)
      threads.emplace_back([&, r] {
        ASSERT_EQ(cudaSetDevice(devices[static_cast<size_t>(r)]), cudaSuccess);
        testing::DeviceBuffer<float> data(in[static_cast<size_t>(r)]);
        testing::DeviceBuffer<float> send(in[static_cast<size_t>(r)]);
        testing::DeviceBuffer<float> all(static_cast<size_t>(size * count), std::nanf(""));
        Communicator& comm = group->rank(r);
        comm.set_stream(nullptr);
        comm.all_reduce_sum(data.get(), count, DType::kFloat32);
        comm.all_gather(send.get(), all.get(), count, DType::kFloat32);
        reduced[static_cast<size_t>(r)] = data.download();  // synchronises the device
        gathered[static_cast<size_t>(r)] = all.download();
      });
    for (auto& t : threads) t.join();
    const double gamma =
        (size - 1) * std::ldexp(1.0, -24) / (1 - (size - 1) * std::ldexp(1.0, -24));
    for (int64_t i = 0; i < count; ++i) {
      double exact = 0, abs_sum = 0;
      for (const auto& v : in)
        exact += v[static_cast<size_t>(i)], abs_sum += std::fabs(v[static_cast<size_t>(i)]);
      for (int r = 0; r < size; ++r) {
        const float got = reduced[static_cast<size_t>(r)][static_cast<size_t>(i)];
        ASSERT_EQ(std::memcmp(&got, &reduced[0][static_cast<size_t>(i)], 4), 0)
            << "rank " << r << " element " << i << " differs from rank 0's";
        if (size == 1)
          ASSERT_EQ(got, in[0][static_cast<size_t>(i)]) << i;
        else if (size == 2)
          ASSERT_EQ(got, in[0][static_cast<size_t>(i)] + in[1][static_cast<size_t>(i)]) << i;
        else
          ASSERT_LE(std::fabs(got - exact), gamma * abs_sum + 1e-30) << i;
        for (int s = 0; s < size; ++s)
          ASSERT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(s * count + i)],
                    in[static_cast<size_t>(s)][static_cast<size_t>(i)])
              << "rank " << r << "'s copy of rank " << s << "'s element " << i;
      }
    }
  }
}

TEST(NcclCommunicator, BadDeviceListsAreRefusedByName) {
  if (!nccl_available()) GTEST_SKIP() << "skipped: built without NCCL";
  EXPECT_THROW(make_nccl_group({}), Error);
  EXPECT_THROW(make_nccl_group({0, 0}), Error);
  try {
    // Two distinct devices past the machine's last (on a machine without GPUs {0, 0} would be
    // refused as a repeat, not as missing).
    make_nccl_group({nccl_device_count(), nccl_device_count() + 1});
    FAIL() << "a device beyond the machine's was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "tensor_parallel_size") << e.what();
  }
}

}  // namespace
}  // namespace flashserve::model
