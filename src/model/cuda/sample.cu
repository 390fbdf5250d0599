// How a row is sampled without sorting the vocabulary (32k-152k entries). Every token gets a
// 64-bit key that orders it as the rule does: its logit (a float mapped to an unsigned integer that
// orders like the value) above the complement of its index (ties to the lower index). The kept sets
// of top-k and top-p are then "keys >= some threshold", and the inverse CDF is "the largest key
// whose prefix mass exceeds u * kept mass". Each threshold is found by a radix descent over the
// key, 8 bits at a time (8 passes over the row, a 256-bin histogram per pass). Masses are
// fixed-point integers of e = exp((l - max) / T) <= 1 (e * 2^32), so that the sums are exact and
// the same on every run whatever the order of the atomic adds.
#include "model/cuda/check.h"
#include "model/cuda/reduce.cuh"
#include "model/cuda/sample.h"
#include "model/sampling.h"

namespace flashserve::model::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 256;

struct Row {
  const float* logits;
  int64_t vocab;
  float max, inv_t;
};

__device__ __forceinline__ float unnormalised(const Row& r, int64_t i) {
  return expf((r.logits[i] - r.max) * r.inv_t);  // full precision: the CPU sampler uses double
}
__device__ __forceinline__ uint64_t key_of(float logit, int64_t i) {
  const uint32_t b = __float_as_uint(logit);
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xffffffffull - static_cast<uint64_t>(i));
}
__device__ __forceinline__ uint64_t mass_of(float e) {
  return static_cast<uint64_t>(e * 4294967296.0f);
}

// The largest key t (among keys >= floor) such that the weight of {key >= t, key >= floor} is at
// least `target` (weight 1 per token when by_count, else its mass). Requires target >= 1 and the
// total weight above floor >= target.
__device__ uint64_t radix_descend(const Row& r, uint64_t floor, uint64_t target, bool by_count,
                                  unsigned long long* hist, uint64_t* shared_result) {
  uint64_t prefix = 0, above = 0;
  for (int level = 7; level >= 0; --level) {
    const int shift = level * 8;
    const uint64_t high_mask = level == 7 ? 0 : (~0ull << (shift + 8));
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < r.vocab; i += blockDim.x) {
      const uint64_t key = key_of(r.logits[i], i);
      if (key < floor || (key & high_mask) != prefix) continue;
      atomicAdd(&hist[(key >> shift) & 0xff],
                static_cast<unsigned long long>(by_count ? 1 : mass_of(unnormalised(r, i))));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      uint64_t acc = above;
      for (int b = kBins - 1; b >= 0; --b) {
        if (acc + hist[b] >= target) {
          chosen = b;
          break;
        }
        acc += hist[b];
      }
      if (chosen < 0) {  // not reachable with a consistent target; keep the lowest present bin
        acc = above;
        for (int b = 0; b < kBins; ++b)
          if (hist[b]) chosen = chosen < 0 ? b : chosen;
        for (int b = kBins - 1; b > chosen; --b) acc += hist[b];
        if (chosen < 0) chosen = 0;
      }
      shared_result[0] = prefix | (static_cast<uint64_t>(chosen) << shift);
      shared_result[1] = acc;
    }
    __syncthreads();
    prefix = shared_result[0];
    above = shared_result[1];
    __syncthreads();
  }
  return prefix;
}

__device__ uint64_t kept_mass(const Row& r, uint64_t floor, unsigned long long* total) {
  if (threadIdx.x == 0) *total = 0;
  __syncthreads();
  unsigned long long local = 0;
  for (int64_t i = threadIdx.x; i < r.vocab; i += blockDim.x) {
    if (key_of(r.logits[i], i) >= floor) local += mass_of(unnormalised(r, i));
  }
  atomicAdd(total, local);
  __syncthreads();
  const uint64_t m = *total;
  __syncthreads();
  return m;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, const RowSampling* __restrict__ params,
                  int32_t* __restrict__ tokens, int64_t vocab) {
  __shared__ float scratch[32];
  __shared__ int64_t scratch_idx[32];
  __shared__ unsigned long long hist[kBins];
  __shared__ uint64_t result[2];
  __shared__ unsigned long long total;
  const int64_t row = blockIdx.x;
  const RowSampling p = params[row];
  const float* l = logits + row * vocab;

  // The maximum and, for greedy, its lowest index.
  float best = -INFINITY;
  int64_t best_i = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = l[i];
    if (v > best) best = v, best_i = i;  // increasing i per thread: the first maximum stays
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) best = ov, best_i = oi;
  }
  if (lane == 0) scratch[warp] = best, scratch_idx[warp] = best_i;
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? scratch[lane] : -INFINITY;
    best_i = lane < kThreads / 32 ? scratch_idx[lane] : vocab;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ov > best || (ov == best && oi < best_i)) best = ov, best_i = oi;
    }
    if (lane == 0) scratch[0] = best, scratch_idx[0] = best_i;
  }
  __syncthreads();
  best = scratch[0];
  best_i = scratch_idx[0];
  // Every token banned (-inf) leaves nothing to draw from: the lowest index, as greedy would.
  if (p.temperature <= 0.0f || best == -INFINITY) {
    if (threadIdx.x == 0) tokens[row] = static_cast<int32_t>(best_i);
    return;
  }
  const Row r{l, vocab, best, 1.0f / p.temperature};

  // Min-p keeps the tokens with e >= min_p, a prefix of the key order: a count, like top-k's.
  int64_t k = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  if (p.min_p > 0.0f) {
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    unsigned long long local = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
      local += unnormalised(r, i) >= p.min_p;
    atomicAdd(&total, local);
    __syncthreads();
    const int64_t kept = static_cast<int64_t>(total);
    __syncthreads();
    k = kept < 1 ? 1 : (kept < k ? kept : k);
  }
  // Top-k: the k-th largest key is the floor of the kept set.
  uint64_t floor = 0;
  if (k < vocab) floor = radix_descend(r, 0, static_cast<uint64_t>(k), true, hist, result);
  // Top-p: the shortest prefix (in key order) whose mass reaches top_p of the top-k set's mass.
  uint64_t mass = kept_mass(r, floor, &total);
  if (p.top_p < 1.0f) {
    uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(p.top_p) * mass));
    if (target < 1) target = 1;
    if (target < mass) {
      floor = radix_descend(r, floor, target, false, hist, result);
      mass = kept_mass(r, floor, &total);
    }
  }
  // Inverse CDF: the first token whose prefix mass exceeds u * kept mass.
  const float u = sample_uniform(p.seed, p.position);
  const uint64_t target = static_cast<uint64_t>(static_cast<double>(u) * mass) + 1;
  const uint64_t key = radix_descend(r, floor, target < mass ? target : mass, false, hist, result);
  if (threadIdx.x == 0) tokens[row] = static_cast<int32_t>(0xffffffffull - (key & 0xffffffffull));
}

}  // namespace

void sample_tokens(const float* logits, const RowSampling* params, int32_t* tokens, int64_t rows,
                   int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return;
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, params, tokens,
                                                                      vocab);
  check_launch("sample_tokens");
}

}  // namespace flashserve::model::cuda
