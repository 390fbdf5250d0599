// The fp8 forward's V^T pre-pass alone (src/attention/sm90/fp8_vt.h), so that a failure of the
// fp8 attention tests can be told apart from a wrong V^T: every byte of V^T against V read on the
// host, for dense V and for varlen V with seqused_k (each sequence its own slab, keys in the
// order of fp8_vt_key within every 32, zeros past kv_len in the last block). Plain CUDA (no sm90
// instruction): runs on any CUDA device; skips without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/sm90/fp8_vt.h"
#include "support/cuda_skip.h"

namespace flashserve::testing {
namespace {

using attention::sm90::fp8_vt_key;
using attention::sm90::fp8_vt_keys;
using attention::sm90::VtArgs;

template <int kD>
void check_vt(int batch, int h_kv, const std::vector<int>& kv_len, bool varlen, bool used,
              int block_keys = 128) {
  // Rows per sequence (dense: the longest + 5 spare rows, read by nobody when seqused_k is given)
  // or in all (varlen).
  int max_kv = 0;
  for (int n : kv_len) max_kv = std::max(max_kv, n);
  const int seq_rows = max_kv + (used ? 5 : 0);
  std::vector<int32_t> cu(batch + 1, 0);
  for (int b = 0; b < batch; ++b) cu[b + 1] = cu[b] + (varlen ? kv_len[b] + (used ? 3 : 0) : 0);
  const int64_t rows = varlen ? cu[batch] : int64_t{batch} * seq_rows;
  const int64_t row_stride = int64_t{h_kv} * kD, head_stride = kD;
  std::vector<uint8_t> v(rows * row_stride);
  std::mt19937 rng(kD * 131 + batch);
  for (uint8_t& x : v) x = static_cast<uint8_t>(rng());
  const int64_t keys = fp8_vt_keys(max_kv);
  const int64_t vt_bytes = int64_t{batch} * h_kv * kD * keys;
  uint8_t *dv = nullptr, *dvt = nullptr;
  int32_t *dcu = nullptr, *dused = nullptr;
  ASSERT_EQ(cudaMalloc(&dv, v.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dvt, vt_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dvt, 0xAB, vt_bytes), cudaSuccess);  // what the pre-pass leaves alone
  ASSERT_EQ(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  VtArgs a{};
  a.v = dv;
  a.batch_stride = varlen ? 0 : int64_t{seq_rows} * row_stride;
  a.row_stride = row_stride;
  a.head_stride = head_stride;
  if (varlen) {
    ASSERT_EQ(cudaMalloc(&dcu, cu.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    a.cu_seqlens_k = dcu;
  }
  if (used) {
    ASSERT_EQ(cudaMalloc(&dused, batch * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dused, kv_len.data(), batch * 4, cudaMemcpyHostToDevice), cudaSuccess);
    a.seqused_k = dused;
  }
  a.seqlen_k = varlen ? static_cast<int>(rows) : seq_rows;
  a.vt = dvt;
  a.h_kv = h_kv;
  a.keys = keys;
  a.block_keys = block_keys;
  attention::sm90::launch_fp8_transpose_v<kD>(a, batch, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> vt(vt_bytes);
  ASSERT_EQ(cudaMemcpy(vt.data(), dvt, vt_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t bad = 0;
  for (int b = 0; b < batch; ++b)
    for (int hk = 0; hk < h_kv; ++hk)
      for (int n = 0; n < kD; ++n)
        for (int64_t key = 0; key < keys; ++key) {
          const int kv = varlen && !used ? cu[b + 1] - cu[b] : kv_len[b];
          // The kernel's blocks reach round_up(kv, block_keys); the pre-pass writes whole pieces
          // of 128 keys up to there (zeros past kv: with 192-key blocks a sequence of 100 keys
          // has keys 128..255 written, 192..255 included), below `keys`. The first device run
          // expected 0xAB from 192 on there: the test's error, not the pre-pass's.
          const int64_t block_end =
              (kv + block_keys - 1) / block_keys * block_keys;  // what the kernel reads
          const bool written = attention::sm90::fp8_vt_writes(key / 128 * 128, kv, block_keys);
          EXPECT_TRUE(key >= block_end || written) << "key " << key << " read but not written";
          const uint8_t got = vt[((int64_t{b} * h_kv + hk) * kD + n) * keys + key];
          uint8_t want = 0xAB;
          if (written) {
            const int64_t j = key / 32 * 32 + fp8_vt_key(static_cast<int>(key % 32));
            const int64_t row = (varlen ? cu[b] : int64_t{b} * seq_rows) + j;
            want = j < kv ? v[row * row_stride + hk * head_stride + n] : 0;
          }
          if (got != want && bad++ < 10)
            ADD_FAILURE() << "d" << kD << " b " << b << " hk " << hk << " n " << n << " key " << key
                          << ": got " << int{got} << ", want " << int{want};
        }
  EXPECT_EQ(bad, 0);
  cudaFree(dv);
  cudaFree(dvt);
  cudaFree(dcu);
  cudaFree(dused);
}

TEST(Fp8VtPrepass, DenseVarlenAndSequsedKeys) {
  SKIP_WITHOUT_CUDA();
  check_vt<64>(2, 3, {300, 300}, false, false);
  check_vt<128>(3, 2, {1, 129, 256}, false, true);
  check_vt<256>(3, 1, {200, 0, 33}, true, false);
  check_vt<128>(2, 4, {7, 400}, true, true);
  // 192-key blocks (FLASHSERVE_FP8_BLOCK_N=192): a sequence of 100 keys in a batch whose longest
  // has 1000 reads keys up to 192, past its own 128-key box.
  check_vt<128>(2, 2, {100, 1000}, true, false, 192);
  check_vt<128>(3, 1, {200, 385, 1}, false, true, 192);
}

}  // namespace
}  // namespace flashserve::testing
