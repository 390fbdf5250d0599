#!/usr/bin/env bash
# The sm90 kernel's first run on the H200 (issue 13), one call: build only test_gpu and bench_sm90
# for 90a, the sm90 GPU tests, compute-sanitizer memcheck on the small case, the SASS check (HGMMA
# count, registers/local memory of the sm90 kernels), and bench_sm90 (sm80 beside sm90).
#   bash scripts/sm90-check.sh          # OUT (default ./out) gets sm90-check.log
# Environment: JOBS (default nproc), BUILD (default build/sm90), SKIP_BUILD=1 (binaries carried in).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build/sm90}
JOBS=${JOBS:-$(nproc)}
exec > >(tee "$OUT/sm90-check.log") 2>&1
status=0
step() { echo; echo "== $* ($(date -u +%T))"; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  step build
  t0=$(date +%s)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j "$JOBS" --target test_gpu bench_sm90 >"$OUT/build.log" 2>&1 ||
    { tail -n 60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
  echo "build ok in $(( $(date +%s) - t0 )) s"
fi

step "tests (expect every Sm90* test to pass; none skipped on the H200)"
timeout 240 "$BUILD/tests/test_gpu" --gtest_filter='*Sm90*' --gtest_brief=1 || status=1

step "compute-sanitizer memcheck, small case (expect 'ERROR SUMMARY: 0 errors')"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 "$BUILD/tests/test_gpu" \
  --gtest_filter='Sm90Sanitize.*' --gtest_brief=1 2>&1 | tail -n 5
[ "${PIPESTATUS[0]}" = 0 ] || status=1

step "SASS: HGMMA count (expect 112 = 8 kernels x (8+8 at d128, 4+8 at d64); 0 means no wgmma)"
cuobjdump -sass "$BUILD/tests/test_gpu" > "$OUT/sass.txt" 2>/dev/null
echo "HGMMA: $(grep -c HGMMA "$OUT/sass.txt")"
echo "sm90 kernels' LDL/STL (local memory) lines: $(awk '/Function : .*sm9010fwd_kernel/{k=1} /Function : /&&!/sm9010fwd_kernel/{k=0} k' "$OUT/sass.txt" | grep -cE 'LDL|STL')"
rm -f "$OUT/sass.txt"
step "sm90 kernels' resources (expect REG:168, STACK:0, LOCAL:0)"
cuobjdump -res-usage "$BUILD/tests/test_gpu" 2>/dev/null | grep -A1 'sm9010fwd_kernel' | grep -o 'REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*' | sort | uniq -c

step "bench_sm90 (TFLOP/s, d128 bf16, 16k tokens, sm80 beside sm90)"
timeout 120 "$BUILD/bench/bench_sm90" --seqlens 4096,8192 --iters 20 || status=1

echo; echo "sm90-check: $([ $status = 0 ] && echo OK || echo FAILED)"
exit $status
