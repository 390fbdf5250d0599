#include <string>

#include "common/float8_cuda.cuh"
#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/rope_kv_write.h"
#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {
namespace {

// Eight values of KV head `head` into an fp8 cache row: e4m3(x / scale), a correctly rounded
// float32 division (nvcc's default -prec-div=true, as the CPU's), then the saturating
// round-to-nearest-even conversion.
__device__ __forceinline__ void store8_e4m3(uint8_t* p, const float (&f)[kVec], float scale) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < kVec; ++i)
    w[i / 4] |= static_cast<uint32_t>(e4m3_from_float(f[i] / scale)) << (8 * (i % 4));
  *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
}

// One block per token. A work item is 8 rotation pairs of one q or k head (x[i..i+8) with
// x[i+d/2..i+d/2+8)) or 8 values of one v head; the angle pos * inv_freq[i] is formed in float32
// and its sine and cosine taken at full precision (positions reach 10^5 radians).
__global__ void rope_kv_kernel(RopeKvArgs a) {
  pdl::wait_for_producer();
  pdl::release_dependents();
  const int64_t t = blockIdx.x;
  const int d = a.head_dim, half = d / 2;
  const int pair_vecs = half / kVec, v_vecs = d / kVec;
  const int rope_items = (a.heads + a.kv_heads) * pair_vecs;
  const int items = rope_items + a.kv_heads * v_vecs;
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * d;
  const __nv_bfloat16* row = a.qkv + t * width;
  const float pos = static_cast<float>(a.positions[t]);
  const int64_t slot = a.slot_mapping[t];
  for (int item = threadIdx.x; item < items; item += blockDim.x) {
    if (item < rope_items) {
      const int head = item / pair_vecs;  // q heads, then k heads
      const int i0 = (item % pair_vecs) * kVec;
      const int64_t c = static_cast<int64_t>(head) * d + i0;
      float x1[kVec], x2[kVec];
      load8(row + c, x1);
      load8(row + c + half, x2);
      if (a.bias) {
        float b1[kVec], b2[kVec];
        load8(a.bias + c, b1);
        load8(a.bias + c + half, b2);
#pragma unroll
        for (int i = 0; i < kVec; ++i) x1[i] += b1[i], x2[i] += b2[i];
        round8(x1);  // the biased projection is a bf16 tensor in Hugging Face's model
        round8(x2);
      }
      float y1[kVec], y2[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        float s, co;
        sincosf(pos * a.inv_freq[i0 + i], &s, &co);
        s *= a.rope_scale;  // transformers scales cos and sin (float32) before rotating
        co *= a.rope_scale;
        y1[i] = x1[i] * co - x2[i] * s;
        y2[i] = x2[i] * co + x1[i] * s;
      }
      __nv_bfloat16* dst;
      if (head < a.heads) {
        dst = a.q_out + (t * a.heads + head) * d + i0;
      } else {
        if (slot < 0) continue;
        const int64_t at = (slot * a.kv_heads + (head - a.heads)) * d + i0;
        if (a.k_cache8) {
          const float scale = a.k_scale[head - a.heads];
          store8_e4m3(a.k_cache8 + at, y1, scale);
          store8_e4m3(a.k_cache8 + at + half, y2, scale);
          continue;
        }
        dst = a.k_cache + at;
      }
      store8(dst, y1);
      store8(dst + half, y2);
    } else {
      if (slot < 0) continue;
      const int v_item = item - rope_items;
      const int head = v_item / v_vecs;
      const int i0 = (v_item % v_vecs) * kVec;
      const int64_t c = static_cast<int64_t>(a.heads + a.kv_heads + head) * d + i0;
      float x[kVec];
      load8(row + c, x);
      if (a.bias) {
        float b[kVec];
        load8(a.bias + c, b);
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[i] += b[i];
      }
      const int64_t at = (slot * a.kv_heads + head) * d + i0;
      if (a.v_cache8)
        store8_e4m3(a.v_cache8 + at, x, a.v_scale[head]);
      else
        store8(a.v_cache + at, x);
    }
  }
}

}  // namespace

void rope_kv_write(const RopeKvArgs& args, cudaStream_t stream, bool pdl) {
  if (args.head_dim % (2 * kVec) != 0)
    throw Error(ErrorKind::kUnsupported, "head_dim",
                "must be a multiple of 16, got " + std::to_string(args.head_dim));
  if ((args.k_cache8 != nullptr) != (args.v_cache8 != nullptr) ||
      (args.k_cache8 && (!args.k_scale || !args.v_scale)))
    throw Error(ErrorKind::kInternal, "kv_cache",
                "an fp8 K/V write needs both e4m3 caches and both scales");
  if (args.n_tokens == 0) return;
  const int items = (args.heads + args.kv_heads) * (args.head_dim / 2 / kVec) +
                    args.kv_heads * (args.head_dim / kVec);
  int threads = ((items + 31) / 32) * 32;
  if (threads > 512) threads = 512;
  check_cuda(pdl::launch(pdl, rope_kv_kernel, dim3(static_cast<unsigned>(args.n_tokens)),
                         dim3(static_cast<unsigned>(threads)), 0, stream, args),
             "rope_kv_write");
}

}  // namespace flashserve::model::cuda
