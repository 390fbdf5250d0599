#!/usr/bin/env bash
# One short call on the GPU machine for issue 21's mixed-step CUDA graphs: the model's GPU tests
# (the mixed-graph ones first: bit-identical logits graph vs eager, replays, padding rows that write
# no cache slot; then the rest of test_model_gpu), then bench_model --mixed: mixed-step time,
# graph vs eager, at budget 512 with 0-256 decodes (mistral-7b shape, random weights). Logs under
# $OUT. About 2 minutes on one H200 with binaries built elsewhere.
#
#   OUT=... bash scripts/mixed-graph-check.sh                # builds the two targets for 90a
#   BIN_TAR=.xfer/mixgraph-bin.tar.xz OUT=... bash scripts/mixed-graph-check.sh
# The binaries travel compressed; on the build machine:
#   BINARIES="tests/test_model_gpu bench/bench_model" \
#     bash scripts/gpu-quick.sh --pack build/mg90 .xfer/mixgraph-bin.tar.xz
# BUDGET (512), DECODES (0,1,16,64,128,256), SHAPE (mistral-7b) and STEPS (30) set the timing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/mixed-graph-check.log") 2>&1

if [ -n "${BIN_TAR:-}" ]; then
  BIN=${BIN:-/tmp/fsbin-mixed}
  mkdir -p "$BIN" && xz -dc "$BIN_TAR" | tar -C "$BIN" -xf - || { echo "unpack failed"; exit 1; }
  LIBS="$BIN/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib"
elif [ -z "${BIN:-}" ]; then
  BIN=build/mixed-graph
  cmake -S . -B $BIN -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/configure.log" 2>&1 &&
    cmake --build $BIN -j "${JOBS:-$(nproc)}" --target test_model_gpu bench_model \
      >"$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
fi
RUN=(env "LD_LIBRARY_PATH=${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
rc=0

echo; echo "== mixed-step graphs: bit for bit against eager, replays, padding ($(date -u +%T))"
timeout 120 "${RUN[@]}" "$BIN/tests/test_model_gpu" --gtest_filter='GpuMixedGraphs.*' \
  >"$OUT/test_mixed_graphs.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|differs|captures|seed " \
  "$OUT/test_mixed_graphs.log" | head -40

echo; echo "== the rest of the model's GPU tests ($(date -u +%T))"
timeout 150 "${RUN[@]}" "$BIN/tests/test_model_gpu" --gtest_filter='-GpuMixedGraphs.*' \
  --gtest_brief=1 >"$OUT/test_model_gpu.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$OUT/test_model_gpu.log" | head -30

echo; echo "== mixed-step time, graph vs eager ($(date -u +%T))"
COMMIT=${COMMIT:-unknown} timeout 240 "${RUN[@]}" "$BIN/bench/bench_model" --mixed \
  --shape "${SHAPE:-mistral-7b}" --budget "${BUDGET:-512}" \
  --decodes "${DECODES:-0,1,16,64,128,256}" --steps "${STEPS:-30}" 2>&1 |
  tee "$OUT/bench_mixed.log" || rc=1
echo; echo "== done rc=$rc ($(date -u +%T))"
exit $rc
