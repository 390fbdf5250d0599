#!/usr/bin/env bash
# One short call on the GPU machine for issue 21's fused decode kernels (model/cuda/fused_gemv.h;
# FLASHSERVE_FUSE_NORM, FLASHSERVE_FUSE_SILU, both off by default): their GPU tests (each variant
# against the float64 reference and bit for bit against the unfused GEMV path; the runner's decode
# steps fused against unfused), the rest of the model's GPU tests with both fusions on (the
# runner's logits against the CPU runner's, graphs against eager, through the fused path), then
# bench_model --fuse-ab: batch-1 and batch-4 decode steps at the mistral-7b shape, 1k keys, the
# default, the unfused GEMV and the three fused modes alternated in one process, medians, ms per
# step and x of the weight-read floor. Logs under $OUT. About 2-3 minutes on one H200 with
# binaries built elsewhere (the steps' timeouts add to 260 s). Failures of the second step that
# compare a sequence's bits across batch sizes would be the fusion's expected difference from
# cuBLASLt (as FLASHSERVE_GEMV=1's), not a bug: the log names the test.
#
#   OUT=... bash scripts/decode-fuse-check.sh              # builds the two targets for 90a
#   BIN_TAR=.xfer/decode-fuse-bin.tar.xz OUT=... bash scripts/decode-fuse-check.sh
# The binaries travel compressed; on the build machine:
#   cmake --build build/d90 -j1 --target test_model_gpu bench_model
#   BINARIES="tests/test_model_gpu bench/bench_model" \
#     bash scripts/gpu-quick.sh --pack build/d90 .xfer/decode-fuse-bin.tar.xz
# BATCHES (1,4), ROUNDS (7), STEPS (30), CONTEXT (1024) and SHAPE (mistral-7b) set the timing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/decode-fuse-check.log") 2>&1

if [ -n "${BIN_TAR:-}" ]; then
  BIN=${BIN:-/tmp/fsbin-decode-fuse}
  mkdir -p "$BIN" && xz -dc "$BIN_TAR" | tar -C "$BIN" -xf - || { echo "unpack failed"; exit 1; }
  LIBS="$BIN/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib"
elif [ -z "${BIN:-}" ]; then
  BIN=build/decode-fuse
  cmake -S . -B $BIN -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/configure.log" 2>&1 &&
    cmake --build $BIN -j "${JOBS:-$(nproc)}" --target test_model_gpu bench_model \
      >"$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
fi
RUN=(env "LD_LIBRARY_PATH=${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
rc=0

echo; echo "== fused GEMV: reference, bit for bit against the unfused path, runner ($(date -u +%T))"
timeout 60 "${RUN[@]}" "$BIN/tests/test_model_gpu" --gtest_filter='GpuFusedGemv.*' \
  >"$OUT/test_fused_gemv.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|Expected|Which is|bad|differs" \
  "$OUT/test_fused_gemv.log" | head -40

echo; echo "== the rest of the model's GPU tests, both fusions on ($(date -u +%T))"
FLASHSERVE_FUSE_NORM=1 FLASHSERVE_FUSE_SILU=1 timeout 110 "${RUN[@]}" \
  "$BIN/tests/test_model_gpu" --gtest_filter='-GpuFusedGemv.*' --gtest_brief=1 \
  >"$OUT/test_model_gpu_fused.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$OUT/test_model_gpu_fused.log" | head -30

echo; echo "== decode step A/B: default, GEMV, fused silu / norm / both ($(date -u +%T))"
COMMIT=${COMMIT:-unknown} timeout 90 "${RUN[@]}" "$BIN/bench/bench_model" --fuse-ab \
  --shape "${SHAPE:-mistral-7b}" --batches "${BATCHES:-1,4}" --rounds "${ROUNDS:-7}" \
  --steps "${STEPS:-30}" --context "${CONTEXT:-1024}" 2>&1 | tee "$OUT/bench_fuse_ab.log" || rc=1
echo; echo "== done rc=$rc ($(date -u +%T))"
exit $rc
