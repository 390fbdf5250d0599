#!/usr/bin/env bash
# One device call for the serving-attention work (issue 15): the serving benchmark on a quiet GPU,
# then every GPU test (6 gtest shards in parallel) beside compute-sanitizer memcheck and racecheck
# on the *Sanitize* subset. Binaries are taken from bin/ (built elsewhere for sm_90a) when they run
# here, else built. Logs under $OUT (tarred: the device tool returns few files).
#   OUT=... bash bench/serve_check.sh [--no-tests] [--bench-args "..."]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/logs"
tests=1 bench_args=""
while (($#)); do
  case "$1" in
    --no-tests) tests=0 ;;
    --bench-args) bench_args=$2; shift ;;
  esac
  shift
done
export LD_LIBRARY_PATH=$PWD/bin:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/logs/gpu.txt"
echo "commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD), $(date -u +%FT%TZ)"
B=bin
if ! "$B/test_gpu" --gtest_list_tests >/dev/null 2>&1; then
  echo "== carried binaries do not run here: building"
  t0=$(date +%s)
  cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a >/dev/null &&
    cmake --build build/gpu -j 16 --target test_gpu bench_serve_attn >"$OUT/logs/build.log" 2>&1 ||
    { tail -40 "$OUT/logs/build.log"; exit 1; }
  B=build/gpu/bin; mkdir -p $B
  cp build/gpu/tests/test_gpu build/gpu/bench/bench_serve_attn $B/
  echo "== built in $(( $(date +%s) - t0 )) s"
fi
timeout 90 "$B/bench_serve_attn" --md "$OUT/serve.md" $bench_args 2>&1 | tee "$OUT/logs/bench.log"
echo "== bench rc=$?"
if ((tests)); then
  t0=$(date +%s)
  for i in 0 1 2 3 4 5; do
    GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i timeout 150 "$B/test_gpu" >"$OUT/logs/test_gpu.$i.log" 2>&1 &
  done
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 "$B/test_gpu" \
      --gtest_filter='*Sanitize*' >"$OUT/logs/sanitize-$tool.log" 2>&1 &
  done
  wait
  echo "== tests and sanitizers in $(( $(date +%s) - t0 )) s"
  cat "$OUT"/logs/test_gpu.*.log | grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|Failure|error" | head -40
  for tool in memcheck racecheck; do
    echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize-$tool.log" | tail -1)," \
      "$(grep -c '^\[       OK' "$OUT/logs/sanitize-$tool.log") OK, $(grep -c '^\[  FAILED' "$OUT/logs/sanitize-$tool.log") failed"
  done
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
