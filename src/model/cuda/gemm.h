// The model's one matrix product, through cuBLASLt: y[m, n] = x[m, k] · w[n, k]^T, x and w bf16
// row-major (w in Hugging Face's [out, in] layout, as stored in the checkpoint), y bf16 or float32,
// float32 accumulation. The algorithm is chosen once per shape and kept: cuBLASLt's candidates
// for the shape are timed on the call's own operands once per bucket of row counts
// (model/step_graphs.h's token_bucket), and later row counts of the bucket take that pick (a
// host-only check), so a serving engine's varying token counts do not each pay for a timing, and a
// mixed step padded to its bucket in a CUDA graph runs the algorithm of its unpadded rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

namespace flashserve::model::cuda {

class Gemm {
 public:
  // Allocates the cuBLASLt handle and its workspace on the current device.
  explicit Gemm(size_t workspace_bytes = size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Products of at most `rows` rows of x (decode at small batch; 0 to kGemvMaxRows) go to
  // gemv.h's kernel (the runner decides: model/decode_kernels.h), launched with programmatic
  // dependent launch when set_pdl (sm_90 and later only), loading their first weights before the
  // wait for the kernel before when set_early_weights (model/decode_kernels.h).
  void set_gemv_rows(int64_t rows);
  void set_pdl(bool on) { pdl_ = on; }
  void set_early_weights(bool on) { early_weights_ = on; }

  // y_float32: y is float32 (the LM head's logits), else bf16. All pointers 16-byte aligned,
  // k and n multiples of 8.
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool y_float32, int64_t m,
           int64_t n, int64_t k, cudaStream_t stream);

  // y = x w^T + bias (bf16 y, bias [n]) in cuBLASLt's epilogue: the sum is rounded to bf16 once,
  // as a bf16 nn.Linear with bias does. Returns false (and does nothing) when cuBLASLt has no
  // algorithm with the bias epilogue for the shape; the caller then adds the bias itself.
  bool run_bias(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

  // Chooses the algorithms of the shape for every bucket of row counts up to max_m now (one call
  // per bucket, as run() or, with a bias, run_bias() as the forward calls them), so that no later
  // call of the shape with up to max_m rows times anything. x and y must hold max_m rows; their
  // contents are read and overwritten.
  void warm(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
            bool y_float32, int64_t max_m, int64_t n, int64_t k, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t gemv_rows_ = 0;
  bool pdl_ = false;
  bool early_weights_ = false;
};

}  // namespace flashserve::model::cuda
