#!/usr/bin/env bash
# One call on the GPU machine for softcap and ALiBi in the CUDA forward (issue 24): their GPU
# tests (`*ScoreMod*`, against the float64 reference), the PyTorch tests of the modifiers, every
# other GPU test in 8 shards (the plan routes modifier calls, so the rest must not move), and
# bench/score_mod_cost.py once with the default dispatch and once forced to sm80. Logs under $OUT.
# Binaries built here for 90a and carried:
#   BINARIES="tests/test_gpu src/libflashserve_c.so" \
#     bash scripts/gpu-quick.sh --pack build/dev90 .xfer/mods.tar.xz
# then (carry .xfer): BIN_TAR=.xfer/mods.tar.xz OUT=$OUT bash scripts/score-mod-gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/score-mod-check.log") 2>&1
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
status=0
BIN=/tmp/fsbin
mkdir -p "$BIN" && xz -dc "${BIN_TAR:?BIN_TAR names the packed binaries}" | tar -C "$BIN" -xf - ||
  { echo "unpack failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
py() { env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 PYTHONPATH=python \
  FLASHSERVE_LIBRARY="$BIN/src/libflashserve_c.so" "$@"; }

step "the modifiers' GPU tests (none skipped on the H200)"
LD_LIBRARY_PATH=$BIN/lib timeout 200 "$BIN/tests/test_gpu" --gtest_filter='*ScoreMod*' \
  --gtest_brief=1 2>&1 | tail -n 8
[ "${PIPESTATUS[0]}" = 0 ] || status=1
step "the PyTorch tests of the modifiers"
py timeout 200 python3 -m pytest -q python/tests/test_gpu_torch.py -k "score_modifier or softcap or alibi" 2>&1 | tail -n 4
[ "${PIPESTATUS[0]}" = 0 ] || status=1
step "score_mod_cost.py, default dispatch, then FLASHSERVE_KERNEL=sm80"
py timeout 150 python3 bench/score_mod_cost.py --csv "$OUT/score_mod_default.csv" || status=1
FLASHSERVE_KERNEL=sm80 py timeout 150 python3 bench/score_mod_cost.py \
  --csv "$OUT/score_mod_sm80.csv" || status=1
if [[ " ${SKIP:-} " != *" all "* ]]; then
  step "every other GPU test, 8 shards"
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i LD_LIBRARY_PATH=$BIN/lib timeout 300 \
      "$BIN/tests/test_gpu" --gtest_filter='-*ScoreMod*' --gtest_brief=1 > "$OUT/shard$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  grep -h -E "^\[  (PASSED|FAILED|SKIPPED)|tests? ran|Failure" "$OUT"/shard*.log | sort | uniq -c
  grep -q "FAILED" "$OUT"/shard*.log && status=1
  cat "$OUT"/shard*.log > "$OUT/gpu-tests.log" && rm -f "$OUT"/shard*.log
fi
echo "status $status"
exit $status
