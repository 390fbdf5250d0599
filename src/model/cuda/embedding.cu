#include "model/cuda/check.h"
#include "model/cuda/embedding.h"
#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {
namespace {

// One block per token row; each thread copies 16-byte chunks (a pure gather: bandwidth-bound).
__global__ void embed_kernel(const uint4* __restrict__ table, const int32_t* __restrict__ ids,
                             uint4* __restrict__ out, int64_t row_vecs, int64_t vocab) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  uint4* dst = out + t * row_vecs;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < row_vecs; i += blockDim.x) dst[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* src = table + static_cast<int64_t>(id) * row_vecs;
  for (int64_t i = threadIdx.x; i < row_vecs; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void embed_tokens(const __nv_bfloat16* table, const int32_t* ids, __nv_bfloat16* out,
                  int64_t n_tokens, int64_t hidden, int64_t vocab, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int64_t row_vecs = hidden / kVec;
  const int threads = static_cast<int>(row_vecs < 256 ? row_vecs : 256);
  embed_kernel<<<static_cast<unsigned>(n_tokens), threads, 0, stream>>>(
      reinterpret_cast<const uint4*>(table), ids, reinterpret_cast<uint4*>(out), row_vecs, vocab);
  check_launch("embed_tokens");
}

}  // namespace flashserve::model::cuda
