#include "engine/collective_profiler.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "flashserve/error.h"

#if defined(FLASHSERVE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace flashserve::engine {

namespace {

// A rank's message buffer: host memory, or its GPU's.
class RankBuffer {
 public:
  RankBuffer(int device, size_t bytes) : device_(device) {
    if (device_ < 0) {
      host_.assign(bytes / sizeof(float) + 1, 1.0f);
      return;
    }
#if defined(FLASHSERVE_WITH_CUDA)
    if (cudaSetDevice(device_) != cudaSuccess || cudaMalloc(&dev_, bytes + 16) != cudaSuccess ||
        cudaMemset(dev_, 0, bytes + 16) != cudaSuccess)
      throw Error(ErrorKind::kCuda, "device",
                  "cannot allocate " + std::to_string(bytes) + " bytes on CUDA device " +
                      std::to_string(device_));
#else
    throw Error(ErrorKind::kUnsupported, "device", "cuda: this flashserve is built without CUDA");
#endif
  }
  ~RankBuffer() {
#if defined(FLASHSERVE_WITH_CUDA)
    if (dev_) cudaFree(dev_);
#endif
  }
  RankBuffer(const RankBuffer&) = delete;
  RankBuffer& operator=(const RankBuffer&) = delete;
  void* data() {
    return device_ < 0 ? static_cast<void*>(host_.data()) : dev_;
  }
  // Waits for the collectives this rank enqueued (a host collective has finished already).
  void finish() const {
#if defined(FLASHSERVE_WITH_CUDA)
    if (device_ >= 0 && cudaStreamSynchronize(nullptr) != cudaSuccess)
      throw Error(ErrorKind::kCuda, "device", "a collective failed on its stream");
#endif
  }

 private:
  int device_;
  std::vector<float> host_;
  void* dev_ = nullptr;
};

}  // namespace

CollectiveGrid CollectiveGrid::for_counts(Collective collective, const std::vector<int64_t>& counts,
                                          int64_t bytes_per_unit, DType dtype) {
  CollectiveGrid g;
  g.collective = collective;
  g.dtype = dtype;
  for (int64_t c : counts) g.bytes.push_back(c * bytes_per_unit);
  return g;
}

serve::ProfileTable1 profile_collective(model::CommunicatorGroup& group,
                                        const std::vector<int>& devices,
                                        const CollectiveGrid& grid) {
  const int n = group.size();
  const int64_t elem = static_cast<int64_t>(dtype_size(grid.dtype));
  if (grid.bytes.empty() || grid.reps < 1 || grid.warmup < 0)
    throw Error(ErrorKind::kInvalidArgument, "grid", "needs sizes and at least one rep");
  for (size_t i = 0; i < grid.bytes.size(); ++i)
    if (grid.bytes[i] <= 0 || grid.bytes[i] % elem != 0 ||
        (i > 0 && grid.bytes[i] <= grid.bytes[i - 1]))
      throw Error(ErrorKind::kInvalidArgument, "grid",
                  "sizes must be positive, increasing multiples of the element size");
  if (!devices.empty() && static_cast<int>(devices.size()) != n)
    throw Error(ErrorKind::kInvalidArgument, "devices",
                std::to_string(devices.size()) + " devices for " + std::to_string(n) + " ranks");

  serve::ProfileTable1 table;
  for (int64_t b : grid.bytes) table.x.push_back(static_cast<double>(b));
  table.seconds.assign(grid.bytes.size(), 0.0);
  std::barrier start(n);
  std::mutex mu;
  std::exception_ptr failed;
  auto rank = [&](int r) {
    try {
      // An all-gather's send buffer is followed by its receive buffer of n messages.
      const bool gather = grid.collective == Collective::kAllGather;
      const size_t largest = static_cast<size_t>(grid.bytes.back());
      RankBuffer buf(devices.empty() ? -1 : devices[static_cast<size_t>(r)],
                     gather ? largest * static_cast<size_t>(n + 1) : largest);
      model::Communicator& comm = group.rank(r);
      for (size_t i = 0; i < grid.bytes.size(); ++i) {
        std::vector<double> times;
        const int64_t count = grid.bytes[i] / elem;
        for (int k = 0; k < grid.warmup + grid.reps; ++k) {
          start.arrive_and_wait();
          const auto t0 = std::chrono::steady_clock::now();
          if (gather)
            comm.all_gather(buf.data(), static_cast<char*>(buf.data()) + largest, count,
                            grid.dtype);
          else
            comm.all_reduce_sum(buf.data(), count, grid.dtype);
          buf.finish();
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (k >= grid.warmup) times.push_back(s);
        }
        if (r == 0) {
          std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
          table.seconds[i] = times[times.size() / 2];
        }
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) failed = std::current_exception();
      }
      group.abort();
      start.arrive_and_drop();  // the others' barriers no longer wait for this rank
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(rank, r);
  rank(0);
  for (auto& t : threads) t.join();
  if (failed) {
    group.recover();
    std::rethrow_exception(failed);
  }
  serve::make_monotone(table);
  return table;
}

}  // namespace flashserve::engine
