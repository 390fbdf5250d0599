#!/usr/bin/env bash
# One call on the H200 for the CUDA backward (issue 22): every backward GPU test through both
# kernel families (FLASHSERVE_BWD_KERNEL=sm80 and sm90) with the sm90 forward's tests (its helpers
# moved to shared headers) in 8 shards, compute-sanitizer memcheck and racecheck on the
# backward's small cases, bench/bwd_compare.py (our backward per forced family beside PyTorch
# SDPA's cuDNN and flash backends in the same run, with a gradient check against FA2's), and the
# PyTorch autograd tests on CUDA. Logs under $OUT.
#
# Steps run most valuable first (a call cut short still returns what ran): ~7-9 minutes on one
# H200 with everything; SKIP="torch" or a shorter SEQLENS for a second call.
#
# The binaries are built on the build machine for 90a and carried (the GPU image lacks headers
# the full configure needs):
#   cmake -S . -B build/bwd90 -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a
#   cmake --build build/bwd90 -j1 --target test_gpu flashserve_c
#   BINARIES="tests/test_gpu src/libflashserve_c.so" \
#     bash scripts/gpu-quick.sh --pack build/bwd90 .xfer/bwd90.tar.xz
# then, on the GPU machine (carry .xfer):
#   BIN_TAR=.xfer/bwd90.tar.xz OUT=$OUT bash scripts/bwd-gpu-check.sh
# Environment: SKIP="sass tests sanitize bench torch" leaves steps out; FILTER (the tests step's
# gtest filter, default '*Backward*:*Sm90*'); HEAD_DIMS (64,128), SEQLENS (512,2048,8192), FAMILIES
# (sm80,sm90: bwd_compare.py's --families; sm90-atomic,sm90-dq-bulk compares the sm90 kernel's two
# dQ paths, FLASHSERVE_SM90_BWD_DQ_BULK=0/1; sm90,sm90-overlap the step's two orders,
# FLASHSERVE_SM90_BWD_OVERLAP=0/1; sm90,sm90-heavy-first a masked grid's two launch orders,
# FLASHSERVE_SM90_BWD_HEAVY_FIRST=0/1), CAUSAL (0,1: bwd_compare.py's --causal), PROFILE=1
# (bwd_compare.py --profile: each row's kernels by device time, the main kernel beside the zeroing,
# preprocess and postprocess), BENCH_TIMEOUT (seconds, 200), COMMIT (printed).
#
# The overlapped step (FLASHSERVE_SM90_BWD_OVERLAP, session 19's helper, unrun; the coalesced
# preprocess/postprocess ran in session 20 and is merged), two calls so that neither meets the
# 10-minute limit. First the SASS, every backward test (the GpuBackwardOverlap on/off shapes, the
# overlap family's Sanitize cases, DkDvRepeatBitForBit, the Lse test, and all the others) and the
# sanitizers, about 5 minutes:
#   BIN_TAR=.xfer/bwd90.tar.xz OUT=$OUT SKIP="bench torch" FILTER='*Backward*' \
#     bash scripts/bwd-gpu-check.sh
# then the A/B beside the default with each row's kernels by device time (PROFILE=1: the main
# kernel beside the call's other passes, the per-call cost kernel-notes' session 19 section
# estimates at ~3 ms at 16k tokens), about 4 minutes:
#   BIN_TAR=.xfer/bwd90.tar.xz OUT=$OUT SKIP="sass tests sanitize torch" BENCH_TIMEOUT=400 \
#     FAMILIES=sm90,sm90-overlap HEAD_DIMS=64,128 SEQLENS=512,2048,8192 PROFILE=1 \
#     bash scripts/bwd-gpu-check.sh
#
# The heaviest-first launch order of masked grids (FLASHSERVE_SM90_BWD_HEAVY_FIRST, session 20's
# helper, branch bwd-causal, unrun; kernel-notes "Session 20"). Build and pack on the build machine:
#   cmake --build build/d90 -j1 --target test_gpu flashserve_c
#   BINARIES="tests/test_gpu src/libflashserve_c.so" \
#     bash scripts/gpu-quick.sh --pack build/d90 .xfer/bwd-causal.tar.xz
# One call, about 7-8 minutes: the SASS (the 4 + 4 heavy-first kernels: 168 registers, LOCAL 0),
# every backward test (GpuBackwardHeavyFirst on/off with dk/dv bit-identical, the heavy-first
# family's Sanitize cases, DkDvRepeatBitForBit, the Lse test and all the others), memcheck and
# racecheck, then the causal A/B beside the default with each row's kernels by device time:
#   BIN_TAR=.xfer/bwd-causal.tar.xz OUT=$OUT SKIP="torch" FILTER='*Backward*' BENCH_TIMEOUT=240 \
#     FAMILIES=sm90,sm90-heavy-first CAUSAL=1 HEAD_DIMS=64,128 SEQLENS=2048,8192 PROFILE=1 \
#     bash scripts/bwd-gpu-check.sh
# If the first steps run long, the bench alone as a second call (about 2-3 minutes):
#   BIN_TAR=.xfer/bwd-causal.tar.xz OUT=$OUT SKIP="sass tests sanitize torch" CAUSAL=1 \
#     FAMILIES=sm90,sm90-heavy-first HEAD_DIMS=64,128 SEQLENS=512,2048,8192 PROFILE=1 \
#     bash scripts/bwd-gpu-check.sh
#
# The persistent grid (FLASHSERVE_SM90_BWD_PERSISTENT, session 28, unrun; kernel-notes "Session
# 28"): the SASS (48 kernels: 168 registers, LOCAL 0), the backward tests (GpuBackwardPersistent
# with dk/dv bit-identical to the one-tile-per-CTA bulk path, the persistent families' Sanitize
# cases, the Lse test) and the sanitizers, then the bench twice, the switch set around each run
# (bwd_compare.py leaves variables it does not set alone; one OUT each, the log is overwritten):
#   BIN_TAR=.xfer/bwd90.tar.xz OUT=$OUT SKIP="bench torch" FILTER='*Backward*' \
#     bash scripts/bwd-gpu-check.sh
#   for v in 0 1; do FLASHSERVE_SM90_BWD_PERSISTENT=$v BIN_TAR=.xfer/bwd90.tar.xz OUT=$OUT/p$v \
#     SKIP="sass tests sanitize torch" FAMILIES=sm90 HEAD_DIMS=64,128 SEQLENS=2048,8192 PROFILE=1 \
#     bash scripts/bwd-gpu-check.sh; done
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/bwd-gpu-check.log") 2>&1
status=0
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }

BIN=/tmp/fsbin
mkdir -p "$BIN" && xz -dc "${BIN_TAR:?BIN_TAR names the packed binaries}" | tar -C "$BIN" -xf - ||
  { echo "unpack failed"; exit 1; }
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "commit ${COMMIT:-unknown}"

if want sass; then
  # Per sm90 backward kernel (mangled: ...Lb<bf16>ELb<masked>ELb<dq bulk>E, "overlap" where the
  # tile is BwdOverlapTile, "heavy-first" where it is BwdHeavyFirstTile, "persistent" where it is
  # BwdPersistentTile): registers, local memory, and the SASS that says which dQ path it runs:
  # UTMAREDG (the bulk reduce-add) or RED/ATOM (per-element atomics), beside HGMMA (wgmma).
  step "sm90 backward kernels: registers, LOCAL, HGMMA / UTMAREDG / RED counts"
  cuobjdump -res-usage "$BIN/tests/test_gpu" 2>/dev/null | grep -A1 'sm9010bwd_kernel' |
    grep -oE '(BwdPersistentTileINS1_[0-9]+)?(BwdOverlapTileINS1_[0-9]+)?(BwdHeavyFirstTileINS1_[0-9]+)?BwdTileConfigILi[0-9]+ELi[0-9]+[^ ]*|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' |
    paste - - - - | sed -E 's/EEEvNS1_9BwdParamsE//'
  cuobjdump -sass "$BIN/tests/test_gpu" 2>/dev/null | awk '
    /Function :/ { name = ($3 ~ /sm9010bwd_kernel/) ? $3 : ""; next }
    name != "" && /HGMMA/ { hg[name]++ }
    name != "" && /UTMAREDG|UBLKRED/ { tr[name]++ }
    # Not the lines of the bulk reduce: /REDG/ matched UTMAREDG, and the table of session 19 counted
    # the reduce-adds of each bulk kernel as RED too.
    name != "" && !/UTMAREDG|UBLKRED/ && /RED\.E\.ADD|ATOM\.E\.ADD|REDG|ATOMG/ { at[name]++ }
    name != "" { seen[name] = 1 }
    END { for (n in seen) { k = n; sub(/.*BwdTileConfigILi/, "d", k); sub(/EEEvNS1_9BwdParamsE/, "", k)
          if (n ~ /BwdOverlapTile/) k = k " overlap"
          if (n ~ /BwdHeavyFirstTile/) k = k " heavy-first"
          if (n ~ /BwdPersistentTile/) k = k " persistent"
          printf "%s HGMMA %d UTMAREDG/UBLKRED %d RED/ATOM %d\n", k, hg[n], tr[n], at[n] } }' |
    sort
fi
if want tests; then
  step "backward tests (both families) and the sm90 forward's (its helpers moved to shared headers), 8 shards: every test passes, no sm90 test skipped here"
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 240 "$BIN/tests/test_gpu" \
      --gtest_filter="${FILTER:-*Backward*:*Sm90*}" --gtest_brief=1 > "$OUT/bwd-shard$i.log" 2>&1 &
    pids+=($!)
  done
  # By pid: a bare `wait` also waits for the log's tee, which never ends (kernel-notes, run 37).
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  cat "$OUT"/bwd-shard*.log > "$OUT/bwd-tests.log" && rm -f "$OUT"/bwd-shard*.log
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests? ran" "$OUT/bwd-tests.log" | sort | uniq -c
  grep -E "^\[  FAILED  \]|Failure|Skipped" -A3 "$OUT/bwd-tests.log" | head -n 80
fi
if want sanitize; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool on the backward's Sanitize cases, both families (0 errors / hazards)"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 "$BIN/tests/test_gpu" \
      --gtest_filter='Sanitize/GpuBackward.*:GpuBackwardSanitize.*' --gtest_brief=1 2>&1 |
      tail -n 6
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if want bench && [ -f "$BIN/src/libflashserve_c.so" ]; then
  step "bwd_compare.py: TFLOP/s per forced family beside cuDNN and FA2 (bf16, 16k tokens)"
  env -u LD_LIBRARY_PATH PYTHONPATH=python FLASHSERVE_LIBRARY="$BIN/src/libflashserve_c.so" \
    timeout "${BENCH_TIMEOUT:-200}" python3 bench/bwd_compare.py --families "${FAMILIES:-sm80,sm90}" \
    --head-dims "${HEAD_DIMS:-64,128}" --seqlens "${SEQLENS:-512,2048,8192}" \
    --causal "${CAUSAL:-0,1}" --reps 10 \
    ${PROFILE:+--profile} 2>&1 |
    tee "$OUT/bwd-compare.md"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if want torch && [ -f "$BIN/src/libflashserve_c.so" ]; then
  step "PyTorch autograd on CUDA (default family), then with FLASHSERVE_BWD_KERNEL=sm80"
  for fam in auto sm80; do
    env -u LD_LIBRARY_PATH FLASHSERVE_BWD_KERNEL=$fam PYTHONPATH=python \
      FLASHSERVE_LIBRARY="$BIN/src/libflashserve_c.so" timeout 90 python3 -m pytest -q -x \
      -k "autograd or backward or grad" python/tests/test_gpu_torch.py \
      python/tests/test_backward_capi.py 2>&1 | tail -n 3
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
echo
echo "== done (${SECONDS}s), status $status"
exit $status
