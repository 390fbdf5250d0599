// Attention launched programmatically (AttentionRunOptions::programmatic_launch; common/pdl.cuh):
// its kernels may be scheduled while the stream's previous kernel still runs, so each must wait
// for that kernel before reading anything. The kernel before here releases its dependents at once
// and then, after a long spin, writes the step's true q and key lengths over other (finite,
// in-bounds) values: a kernel of the run that read before its wait would see those. A decode
// step split by length (the item map, the split kernel and the combine, every one launched so),
// then a second layer that reuses the map, each against the float64 reference. On devices before
// sm_90 the option is ignored and the stream orders everything (the test passes the same way).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/pdl.cuh"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_copy.h"
#include "support/scoped_env.h"
#include "support/serving_step.h"

namespace flashserve::testing {
namespace {

// Lets the next kernel be scheduled, spins `cycles`, then copies src over dst (bytes, 4-aligned).
__global__ void late_copy(const uint32_t* src, uint32_t* dst, int64_t words, long long cycles) {
  pdl::release_dependents();
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int64_t i = threadIdx.x + int64_t{blockIdx.x} * blockDim.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

// The true contents of a device buffer kept aside, other values put in its place, and a
// late_copy that puts the true ones back.
struct LateBuffer {
  void* device = nullptr;
  void* truth = nullptr;
  size_t bytes = 0;
  LateBuffer(void* d, size_t n, const void* other_host) : device(d), bytes(n) {
    EXPECT_EQ(cudaMalloc(&truth, n), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(truth, d, n, cudaMemcpyDeviceToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, other_host, n, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~LateBuffer() { cudaFree(truth); }
  void restore_late(cudaStream_t stream) const {
    // About 0.1 ms at the H200's clock: far longer than the attention's kernels take to launch.
    late_copy<<<4, 256, 0, stream>>>(static_cast<const uint32_t*>(truth),
                                     static_cast<uint32_t*>(device),
                                     static_cast<int64_t>(bytes / 4), 200000);
  }
};

TEST(GpuProgrammaticAttention, EveryKernelWaitsForTheOneBefore) {
  SKIP_WITHOUT_CUDA();
  const ScopedEnv by_length("FLASHSERVE_DECODE_BALANCE", "1");
  CaseSpec s = serving_step(128, 16, 32, 8, {1, 1, 1, 1, 1}, {3000, 17, 700, 1, 2000});
  s.seed = 81;
  AttentionCase c(s);
  DeviceCopy dev(c);
  const HostLens lens(s);
  const AttentionPlan plan = plan_attention(dev.params(), lens.view(s));
  ASSERT_NE(plan.summary().find("by length"), std::string::npos) << plan.summary();
  AttentionParams p = dev.params(plan.workspace_bytes());
  ASSERT_TRUE(p.seqused_k.defined());

  // Other values: another seed's q, and each length cut to at most 1 key (every read in bounds).
  CaseSpec other_spec = s;
  other_spec.seed = 82;
  AttentionCase other(other_spec);
  const auto bufs = c.buffers();
  std::vector<int32_t> short_lens(lens.kv.size());
  std::transform(lens.kv.begin(), lens.kv.end(), short_lens.begin(),
                 [](int32_t n) { return std::min(n, 1); });
  const LateBuffer q(p.q.data, bufs[AttentionCase::kQ].bytes,
                     other.buffers()[AttentionCase::kQ].host);
  const LateBuffer used(p.seqused_k.data, short_lens.size() * 4, short_lens.data());

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  p.stream = stream;
  AttentionRunOptions options;
  options.programmatic_launch = true;
  for (int layer = 0; layer < 2; ++layer) {
    if (layer == 1) {  // again from the other values, the map reused from layer 0
      c.poison_outputs();
      dev.upload_outputs();
      ASSERT_EQ(cudaMemcpy(q.device, other.buffers()[AttentionCase::kQ].host, q.bytes,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      options.reuse_step_state = true;
    }
    q.restore_late(stream);
    if (layer == 0) used.restore_late(stream);  // the map kernel reads the lengths after it
    run_attention(plan, p, options);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    dev.download();
    EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype))
        << "layer " << layer << ": " << plan.summary();
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flashserve::testing
