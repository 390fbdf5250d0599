#!/usr/bin/env bash
# One call on the GPU machine for head dims off 64/128/256 on CUDA (issue 24: multiples of 8 from
# 32 to 256, q/k's unlike v's, on sm80's padded kernels), most valuable first so that a call cut
# short still returns what ran: their GPU tests (`*HeadDim*`, against the float64 reference, NaN
# padding of out checked untouched), compute-sanitizer memcheck on their small cases, the PyTorch
# tests (python/tests/test_gpu_head_dims.py, the refusal test of test_gpu_torch_ops.py and the
# NumPy CPU-path test), bench/head_dim_cost.py (the speed table: d96/160/192 and 192/128 beside
# the padded kernel's own head dim and PyTorch SDPA), every other forward GPU test in 8 shards (the
# kernels and the plan changed around them: the backward tests are left out, nothing of theirs
# changed), and racecheck on the small cases. About 6-8 minutes on one H200. Logs under $OUT.
# Binaries built here for 90a and carried:
#   cmake -S . -B build/hdim -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a
#   cmake --build build/hdim -j2 --target test_gpu flashserve_c
#   BINARIES="tests/test_gpu src/libflashserve_c.so" \
#     bash scripts/gpu-quick.sh --pack build/hdim .xfer/hdim.tar.xz
# then (carry .xfer): BIN_TAR=.xfer/hdim.tar.xz OUT=$OUT bash scripts/hdim-gpu-check.sh
# SKIP="regression racecheck bench" leaves those steps out.
set -uo pipefail
cd "$(dirname "$0")/.."
# The padded kernels are on by default since this run passed (session 18); set here so that the
# check runs whatever the default (kPaddedHeadDimsByDefault).
export FLASHSERVE_PADDED_HEAD_DIMS=1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/hdim-check.log") 2>&1
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
declare -A result
ran() { result[$1]=$([ "$2" = 0 ] && echo ok || echo "FAILED (rc $2)"); }
skipped() { [[ " ${SKIP:-} " == *" $1 "* ]] && result[$1]=skipped; }
BIN=${BIN:-/tmp/fsbin}
mkdir -p "$BIN" && xz -dc "${BIN_TAR:?BIN_TAR names the packed binaries}" | tar -C "$BIN" -xf - ||
  { echo "unpack failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
py() { env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 PYTHONPATH=python \
  FLASHSERVE_LIBRARY="$BIN/src/libflashserve_c.so" "$@"; }
gtest_shards() {  # gtest_shards N LOGNAME TIMEOUT FILTER: N shards at once; rc 1 on any failure
  local n=$1 name=$2 t=$3 filter=$4 i rc=0 pids=()
  for ((i = 0; i < n; i++)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i LD_LIBRARY_PATH=$BIN/lib timeout "$t" \
      "$BIN/tests/test_gpu" --gtest_filter="$filter" --gtest_brief=1 >"$OUT/$name.$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  cat "$OUT/$name".*.log >"$OUT/$name.log" && rm -f "$OUT/$name".*.log
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests? ran|Failure" "$OUT/$name.log" | sort | uniq -c
  grep -A12 "Failure" "$OUT/$name.log" | head -n 60
  return $rc
}

step "the head-dim GPU tests (*HeadDim*: 140 tests, none skipped on the H200), 4 shards"
gtest_shards 4 headdim 150 '*HeadDim*'
ran headdim $?

step "compute-sanitizer memcheck: the head-dim Sanitize cases"
LD_LIBRARY_PATH=$BIN/lib timeout 90 compute-sanitizer --tool memcheck --error-exitcode 99 \
  "$BIN/tests/test_gpu" --gtest_filter='Sanitize/GpuHeadDim*' --gtest_brief=1 2>&1 | tail -n 6
ran memcheck "${PIPESTATUS[0]}"

step "PyTorch: test_gpu_head_dims.py, the fast path's refusal test, the NumPy CPU-path test"
py timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_gpu_head_dims.py \
  python/tests/test_head_dims_cpu.py 2>&1 | tail -n 12
rc=${PIPESTATUS[0]}
py timeout 60 python3 -m pytest -q -p no:cacheprovider python/tests/test_gpu_torch_ops.py \
  -k test_fast_path_errors_name_the_argument 2>&1 | tail -n 4
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
ran python $rc

if ! skipped bench; then
  step "bench/head_dim_cost.py: padded head dims beside their kernel's own and PyTorch SDPA"
  py timeout 150 python3 bench/head_dim_cost.py --csv "$OUT/head_dim_cost.csv"
  ran bench $?
fi

if ! skipped regression; then
  step "every other GPU test but the backward's, 8 shards (the sm80/sm90 forward, serving, plans)"
  gtest_shards 8 regression 240 '-*HeadDim*:*Backward*'
  ran regression $?
fi

if ! skipped racecheck; then
  step "compute-sanitizer racecheck: the head-dim Sanitize cases"
  LD_LIBRARY_PATH=$BIN/lib timeout 120 compute-sanitizer --tool racecheck --error-exitcode 99 \
    "$BIN/tests/test_gpu" --gtest_filter='Sanitize/GpuHeadDim*' --gtest_brief=1 2>&1 | tail -n 6
  ran racecheck "${PIPESTATUS[0]}"
fi

echo
echo "== summary (${SECONDS}s)"
status=0
for k in headdim memcheck python bench regression racecheck; do
  printf '%-11s %s\n' "$k" "${result[$k]:-not run}"
  [[ "${result[$k]:-}" == FAILED* ]] && status=1
done
exit $status
