#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemv.h"
#include "model/step_graphs.h"

namespace flashserve::model::cuda {
namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorKind::kCuda, "",
                std::string(what) + ": cuBLAS status " + std::to_string(s) + " (" +
                    cublasLtGetStatusString(s) + ")");
}

// cuBLASLt is column-major. Row-major y[m, n] is column-major y^T [n, m], and
// y^T = w · x^T with w row-major [n, k] = column-major [k, n] taken transposed, x row-major [m, k]
// = column-major [k, m] as is. So: op(A) = w^T (A = column-major k×n, transa = T), B = x (k×m),
// C = D = y^T (n×m).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt offered no algorithm (kept, so it is asked once)
};

// The timed choice of an algorithm is made once per bucket of row counts, not once per row count:
// a serving engine's steps carry every token count up to its budget (a chunk plus the decodes of
// the moment), and timing 8 candidates x 6 runs for each new count stalled steps by tens of
// milliseconds through the first minutes of serving (H200, mistral-7b shape: TBT p99 27 ms
// measured against 15 predicted from a profile whose counts were all tuned). The buckets are
// model/step_graphs.h's token_bucket, shared with the runner's mixed-step graphs: a step padded to
// its bucket gets the algorithm of its own row count, so its graph computes its rows bit for bit.
int64_t tuning_bucket(int64_t m) {
  return token_bucket(m);
}

// m's bucket, n, k, y_float32, bias.
using ShapeKey = std::tuple<int64_t, int64_t, int64_t, bool, bool>;

// The timed choices, one per (device, shape bucket) for the whole process: every Gemm of the
// process takes the algorithm the first one timed. Each Gemm timing its own would let two runners
// of one model keep different algorithms, whose sums differ in the last bits (session 32, H100: a
// one-rank NCCL runner beside the plain runner differed at a different step each run).
class TimedAlgorithms {
 public:
  std::optional<cublasLtMatmulAlgo_t> find(int device, const ShapeKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = algos_.find({device, key});
    if (it == algos_.end()) return std::nullopt;
    return it->second;
  }
  // The shape's algorithm: `algo` if none was kept for it yet, else the one kept first.
  cublasLtMatmulAlgo_t keep(int device, const ShapeKey& key, const cublasLtMatmulAlgo_t& algo) {
    std::lock_guard<std::mutex> lock(mu_);
    return algos_.emplace(std::pair{device, key}, algo).first->second;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, ShapeKey>, cublasLtMatmulAlgo_t> algos_;
};

TimedAlgorithms& timed_algorithms() {
  static TimedAlgorithms t;
  return t;
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int device = 0;
  std::map<ShapeKey, Plan> plans;  // by exact m
  // The operands of the call that asks for a new plan, used to time the candidates.
  struct Operands {
    const void *x = nullptr, *w = nullptr, *bias = nullptr;
    void* y = nullptr;
    cudaStream_t stream = nullptr;
  } tune;

  const Plan& plan(int64_t m, int64_t n, int64_t k, bool y_float32, bool bias = false) {
    const ShapeKey key{m, n, k, y_float32, bias};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    check_blas(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
               "transa");
    check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
               "transb");
    if (bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      check_blas(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
          "epilogue");
    }
    const cudaDataType_t yt = y_float32 ? CUDA_R_32F : CUDA_R_16BF;
    check_blas(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k), "layout w");
    check_blas(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k), "layout x");
    check_blas(cublasLtMatrixLayoutCreate(&p.c, yt, n, m, n), "layout y");
    // The bucket's timed algorithm, where cuBLASLt accepts it for this m within the workspace.
    const ShapeKey bucket{tuning_bucket(m), n, k, y_float32, bias};
    const auto accepts = [&](const cublasLtMatmulAlgo_t& algo) {
      cublasLtMatmulHeuristicResult_t check{};
      return cublasLtMatmulAlgoCheck(handle, p.op, p.a, p.b, p.c, p.c, &algo, &check) ==
                 CUBLAS_STATUS_SUCCESS &&
             check.workspaceSize <= workspace_bytes;
    };
    if (auto t = timed_algorithms().find(device, bucket); t && accepts(*t)) {
      p.algo = *t;
      p.found = true;
      return plans.emplace(key, p).first->second;
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "preference");
    check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)),
               "preference workspace");
    // Up to 8 candidates; with real operands at hand (never inside a graph capture) each is
    // timed on them and the fastest kept. The heuristic's first pick is often not the fastest
    // for the skinny products of decode (m of 1 to 64), where the weights' read is the cost.
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref,
                                                            kCandidates, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p.found = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.found) {
      p.algo = results[0].algo;
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      cudaStreamIsCapturing(tune.stream, &capturing);
      if (found > 1 && tune.x && capturing == cudaStreamCaptureStatusNone) {
        if (bias)
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &tune.bias,
                                         sizeof(tune.bias));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        const float alpha = 1.0f, beta = 0.0f;
        float best = 1e30f;
        for (int i = 0; i < found; ++i) {
          if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
          auto once = [&] {
            return cublasLtMatmul(handle, p.op, &alpha, tune.w, p.a, tune.x, p.b, &beta, tune.y,
                                  p.c, tune.y, p.c, &results[i].algo, workspace, workspace_bytes,
                                  tune.stream);
          };
          if (once() != CUBLAS_STATUS_SUCCESS) continue;
          cudaEventRecord(e0, tune.stream);
          for (int r = 0; r < 5; ++r) once();
          cudaEventRecord(e1, tune.stream);
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (ms < best) best = ms, p.algo = results[i].algo;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaGetLastError();
      }
      // The bucket's algorithm, timed or (one candidate) the only one: every later row count of
      // the bucket takes it, so a mixed step padded to its bucket (model/step_graphs.h) runs the
      // algorithm of its unpadded rows; and every Gemm of the process on this device takes it
      // (another may have kept one first since the lookup above: then that one, where it takes
      // this m). Not from inside a capture (nothing was timed there).
      if (capturing == cudaStreamCaptureStatusNone) {
        const cublasLtMatmulAlgo_t kept = timed_algorithms().keep(device, bucket, p.algo);
        if (accepts(kept)) p.algo = kept;
      }
    }
    return plans.emplace(key, p).first->second;
  }

  ~Impl() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  check_cuda(cudaGetDevice(&impl_->device), "gemm device");
  check_blas(cublasLtCreate(&impl_->handle), "cublasLtCreate");
  check_cuda(cudaMalloc(&impl_->workspace, workspace_bytes), "gemm workspace");
  impl_->workspace_bytes = workspace_bytes;
}

Gemm::~Gemm() = default;

void Gemm::set_gemv_rows(int64_t rows) {
  if (rows < 0 || rows > kGemvMaxRows)
    throw Error(ErrorKind::kInvalidArgument, "gemv_rows",
                "must be 0 to " + std::to_string(kGemvMaxRows) + ", got " + std::to_string(rows));
  gemv_rows_ = rows;
}

void Gemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool y_float32, int64_t m,
               int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0) return;
  if (m <= gemv_rows_)
    return gemv(x, w, nullptr, y, y_float32, m, n, k, stream, pdl_, early_weights_);
  impl_->tune = {x, w, nullptr, y, stream};
  const Plan& p = impl_->plan(m, n, k, y_float32);
  if (!p.found)
    throw Error(ErrorKind::kUnsupported, "gemm",
                "cuBLASLt has no algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) +
                    " k=" + std::to_string(k));
  const float alpha = 1.0f, beta = 0.0f;
  check_blas(cublasLtMatmul(impl_->handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                            &p.algo, impl_->workspace, impl_->workspace_bytes, stream),
             "cublasLtMatmul");
}

bool Gemm::run_bias(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                    __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0) return true;
  if (m <= gemv_rows_) {
    gemv(x, w, bias, y, false, m, n, k, stream, pdl_, early_weights_);
    return true;
  }
  impl_->tune = {x, w, bias, y, stream};
  const Plan& p = impl_->plan(m, n, k, false, true);
  if (!p.found) return false;
  // The bias pointer is an attribute of the descriptor: set per call (a host-side write).
  check_blas(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
      "bias pointer");
  const float alpha = 1.0f, beta = 0.0f;
  check_blas(cublasLtMatmul(impl_->handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                            &p.algo, impl_->workspace, impl_->workspace_bytes, stream),
             "cublasLtMatmul (bias)");
  return true;
}

void Gemm::warm(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
                bool y_float32, int64_t max_m, int64_t n, int64_t k, cudaStream_t stream) {
  for (int64_t bucket = 1; max_m > 0; bucket = tuning_bucket(bucket + 1)) {
    const int64_t m = std::min(bucket, max_m);
    auto* y16 = static_cast<__nv_bfloat16*>(y);
    if (bias == nullptr || !run_bias(x, w, bias, y16, m, n, k, stream))
      run(x, w, y, y_float32, m, n, k, stream);
    if (bucket >= max_m) break;
  }
}

}  // namespace flashserve::model::cuda
