#!/usr/bin/env bash
# One call on the H200 for issue 23's sm90 float8_e4m3fn forward (docs/fp8.md, "The sm90 fp8
# forward"): its GPU tests against float64 (FLASHSERVE_FP8_ATTENTION=1 inside the tests) and of
# the V^T pre-pass alone (Fp8VtPrepass: tells a wrong V^T from a wrong kernel), the sm90
# bf16 tests beside them (nothing regressed), compute-sanitizer memcheck and racecheck on the
# small fp8 case, the SASS of the fp8 kernels (GMMA ... E4M3 count, registers, local memory),
# then bench_sm90 --fp8 (fp8 beside the bf16 sm90 kernel, FA3 grid: 16k tokens, L 512..16k,
# d64/128/256, causal and not; d128 again with FLASHSERVE_FP8_BLOCK_N=192). Logs under $OUT.
# About 4-5 minutes with binaries built elsewhere.
#
# The binaries travel compressed; on the build machine:
#   cmake -S . -B build/fp8 -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a
#   cmake --build build/fp8 -j2 --target test_gpu bench_sm90
#   BINARIES="tests/test_gpu bench/bench_sm90" \
#     bash scripts/gpu-quick.sh --pack build/fp8 .xfer/fp8.tar.xz
# then, on the GPU machine (carry .xfer):
#   BIN_TAR=.xfer/fp8.tar.xz OUT=$OUT bash scripts/fp8-gpu-check.sh
# Environment: HEAD_DIMS (64,128,256), SEQLENS (512,...,16384), SKIP="fp8_tests sm90_tests
# sanitize sass bench" leaves steps out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/fp8-gpu-check.log") 2>&1
HEAD_DIMS=${HEAD_DIMS:-64,128,256}
SEQLENS=${SEQLENS:-512,1024,2048,4096,8192,16384}
status=0
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }

BIN=/tmp/fsbin-fp8
mkdir -p "$BIN" && xz -dc "${BIN_TAR:?BIN_TAR names the packed binaries}" | tar -C "$BIN" -xf - ||
  { echo "unpack failed"; exit 1; }
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "commit ${COMMIT:-unknown}"

# Runs test_gpu with gtest filter $2 in $1 shards side by side (the float64 references are
# CPU-bound), logs as $OUT/$3-shard*.log; waits by pid (a bare `wait` also waits for the log's
# tee, which never ends).
sharded() {
  local shards=$1 filter=$2 name=$3 pids=() i
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 240 "$BIN/tests/test_gpu" \
      --gtest_filter="$filter" > "$OUT/$name-shard$i.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$OUT/$name"-shard*.log > "$OUT/$name.log" && rm -f "$OUT/$name"-shard*.log
  echo "$name: $(grep -c '^\[       OK \]' "$OUT/$name.log") passed, $(grep -c '^\[  FAILED  \] .*(' "$OUT/$name.log") failed, $(grep -c '^\[  SKIPPED \] .*(' "$OUT/$name.log") skipped"
  grep -E "^\[  FAILED  \] .*\(" "$OUT/$name.log" | head -40
  grep -q "^\[  FAILED" "$OUT/$name.log" && rc=1
  return $rc
}

if want fp8_tests; then
  step "fp8 tests: every Sm90Fp8* test passes against float64 (none skipped on the H200)"
  sharded 8 '*Sm90Fp8*:Fp8VtPrepass.*' fp8-tests || status=1
  # The measured error / bound and RMS ratios, one line per case (the record of this run).
  grep -E "error / bound" "$OUT/fp8-tests.log" | grep -v "^oracle" | sort |
    tee "$OUT/fp8-errors.txt" | head -80
fi
if want sm90_tests; then
  step "sm90 bf16/fp16 tests beside them: nothing regressed"
  sharded 8 '*Sm90*:-*Fp8*' sm90-tests || status=1
fi
if want sanitize; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool on Sm90Fp8Sanitize and the V^T pre-pass (expect 0 errors / 0 hazards)"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 "$BIN/tests/test_gpu" \
      --gtest_filter='Sm90Fp8Sanitize.*:Fp8VtPrepass.*' --gtest_brief=1 2>&1 | tail -n 4
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if want sass; then
  # The warpgroup MMAs: HGMMA for 16-bit types; the 8-bit ones may print as QGMMA, so any
  # *GMMA counts, and those naming E4M3 are the fp8 ones.
  step "SASS of the fp8 kernels: GMMA with E4M3 (expect > 0), local memory (expect 4 bytes masked), resources"
  cuobjdump -sass "$BIN/tests/test_gpu" > "$OUT/sass.txt" 2>/dev/null
  awk '/Function : .*Fp8TileConfig/{k=1} /Function : /&&!/Fp8TileConfig/{k=0} k' "$OUT/sass.txt" \
    > "$OUT/sass-fp8.txt"
  e4m3=$(grep -E '[A-Z]GMMA' "$OUT/sass-fp8.txt" | grep -c E4M3)
  echo "fp8 kernels: $(grep -c 'Function : ' "$OUT/sass-fp8.txt"), GMMA: $(grep -cE '[A-Z]GMMA' "$OUT/sass-fp8.txt"), GMMA E4M3: $e4m3, LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass-fp8.txt")"
  grep -oE '[A-Z]GMMA\.[0-9a-zA-Z.]*' "$OUT/sass-fp8.txt" | sort | uniq -c
  # The kernels must hold warpgroup MMAs; that they name E4M3 is expected, and its absence is
  # printed (the mnemonics above say what they are) rather than failing the run.
  [ "$(grep -cE '[A-Z]GMMA' "$OUT/sass-fp8.txt")" -gt 0 ] || status=1
  [ "$e4m3" -gt 0 ] || echo "NOTE: no GMMA mnemonic names E4M3 in the fp8 kernels"
  cuobjdump -res-usage "$BIN/tests/test_gpu" 2>/dev/null |
    grep -A1 -E 'Fp8TileConfig|fp8_transpose_v' | grep -oE 'Function [^ ]*|REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*' |
    paste - - | sed 's/_ZN10flashserve9attention4sm90//' | cut -c1-160
  xz -T4 "$OUT/sass-fp8.txt"; rm -f "$OUT/sass.txt"
fi
if want bench; then
  for d in ${HEAD_DIMS//,/ }; do
    step "bench_sm90 --fp8, d$d (TFLOP/s, 16k tokens: bf16 sm90 beside fp8, same values)"
    timeout 150 "$BIN/bench/bench_sm90" --fp8 --head-dim "$d" --seqlens "$SEQLENS" --iters 20 |
      tee -a "$OUT/bench_fp8.txt" || status=1
  done
  # d128's 192-key blocks beside the default 128 (the A/B switch; the tile column says which ran).
  step "bench_sm90 --fp8, d128, FLASHSERVE_FP8_BLOCK_N=192 (128 x 192 beside the rows above)"
  FLASHSERVE_FP8_BLOCK_N=192 timeout 150 "$BIN/bench/bench_sm90" --fp8 --head-dim 128 \
    --seqlens "$SEQLENS" --iters 20 | tee -a "$OUT/bench_fp8.txt" || status=1
fi
echo; echo "fp8-gpu-check: $([ $status = 0 ] && echo OK || echo FAILED) (${SECONDS}s)"
exit $status
