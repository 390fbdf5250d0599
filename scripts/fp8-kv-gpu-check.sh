#!/usr/bin/env bash
# One call on the H200 for issue 23's fp8 (e4m3) KV cache on the CUDA runner (docs/fp8.md, "FP8
# KV cache on CUDA"), most valuable first so that a call cut short still returns what ran:
#   1. the paged fp8 attention against float64 on the dequantised cache (test_gpu *KvFp8*: mixed
#      steps, pages 16/64/256 at d64/128/256, GQA 1/4/8, split-KV, bit-identity with the bf16
#      kernels on the widened codes, determinism, refusals), in shards under timeouts, twice:
#      FLASHSERVE_KV_FP8_REGISTER=0 (decodes widen the codes in shared memory) and =1 (decodes
#      convert them at operand load, sm80/kv_fp8_reg.h; with KvFp8Register.*: against float64
#      and the widening within the rounding of P, and q x 2^k bit invariance);
#   2. the fp8 KV kernels' registers and local memory beside the paged bf16 ones (cuobjdump
#      -res-usage), and their SASS: LDGSTS (the codes' cp.async), LDL/STL (spills);
#   3. bench_serve_attn --kv-fp8 (decode and chunk attention on bf16 and e4m3 pools), if packed,
#      with FLASHSERVE_KV_FP8_REGISTER=0 and =1 (the plan column says "register" where it is on);
#   4. compute-sanitizer memcheck and racecheck on the KvFp8Sanitize cases (d128, d64 split, d256),
#      the decodes converting at operand load (FLASHSERVE_KV_FP8_REGISTER=1; REGISTER_SANITIZE=0
#      sanitizes the widening instead);
#   5. the model (test_model_gpu KvFp8*: the e4m3 write bit for bit against the host, the pool
#      against the bf16 pool, logits against the bf16 cache, greedy agreement reported);
#   6. `flashserve run --device cuda --kv-cache-dtype fp8` end to end, and the same with bf16;
#   7. nothing regressed beside them: the bf16 serving-step tests, the CUDA runner's tests, the
#      sm90 fp8 refusals (GpuServing*, GpuModelRunner*, *Sm90Fp8Refusals*).
# Steps 5-7 need test_model_gpu and flashserve in the pack; without them, SKIP="model run
# regression". FLASHSERVE_CUDA_FP8_KV=1 is set by the tests themselves and exported here for
# step 6. Within one 600 s device call (BUDGET=540 s: a step that would pass it is cut short or
# skipped; steps 1-4 take ~5-6 minutes). Every log goes into one file,
# $OUT/fp8-kv-gpu-check.tar.xz (the device tool returns a few files only); the summary is on
# stdout.
#
# Binaries built here for 90a and carried (from the repository root):
#   cmake -S . -B build/h90 -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a
#   cmake --build build/h90 -j1 --target test_gpu bench_serve_attn [test_model_gpu flashserve]
#   BINARIES="tests/test_gpu bench/bench_serve_attn [tests/test_model_gpu src/flashserve]" \
#     bash scripts/gpu-quick.sh --pack build/h90 .xfer/kv8.tar.xz
# then one device call, carrying .xfer:
#   BIN_TAR=.xfer/kv8.tar.xz OUT=$OUT [SKIP="model run regression"] bash scripts/fp8-kv-gpu-check.sh
# The device tool carries at most 64 MiB of tree; gpu-quick.sh's pack of all four binaries is
# ~47 MB (test_gpu and bench_serve_attn alone are less). One xz stream with a large dictionary
# compresses the binaries' copies of the kernels once: the same staging (tests/, src/, bench/,
# lib/) as
#   (cd STAGE && tar -cf - tests src bench lib | xz -9 -T1 --lzma2=dict=256MiB) > .xfer/kv8.tar.xz
# is ~24 MB (~10 MB without lib/, which then has to come from another pack into BIN).
# SKIP="attention resources bench sanitize model run regression" leaves steps out. Issue 23's
# register A/B: SKIP="model run regression" (~6 minutes, estimated: tests ~2.5, resources ~1,
# bench ~2.5 with the register run's split table, sanitizers ~1.5 within BUDGET; adding
# "sanitize" to SKIP keeps it under 5).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/fp8kv-logs.XXXXXX)
exec > >(tee "$LOGS/fp8-kv-gpu-check.log") 2>&1
BUDGET=${BUDGET:-540}
status=0
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }
left() {  # left LIMIT: the seconds this step may take
  local rest=$((BUDGET - SECONDS))
  ((rest < $1)) && echo "$rest" || echo "$1"
}
have_time() {
  (($(left 10) >= 10)) || { echo "SKIPPED: $1 (${SECONDS}s of ${BUDGET}s spent)"; status=1; return 1; }
}

# BIN_TAR: the packed binaries, unpacked into BIN (/tmp/fsbin-kv8); without it, BIN names a build
# directory made on this machine.
if [ -n "${BIN_TAR:-}" ]; then
  BIN=${BIN:-/tmp/fsbin-kv8}
  mkdir -p "$BIN" && xz -dc "$BIN_TAR" | tar -C "$BIN" -xf - || { echo "unpack failed"; exit 1; }
else
  BIN=$(realpath "${BIN:?BIN_TAR names the packed binaries, or BIN a build directory}")
fi
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"

# sharded EXE SHARDS FILTER NAME LIMIT: gtest filter in SHARDS shards side by side (the float64
# references are CPU-bound), each under `timeout` (a hang costs one filter, not the run); logs
# $LOGS/NAME.log; a shard that timed out or died is named with the test it was running.
sharded() {
  local exe=$1 shards=$2 filter=$3 name=$4 limit pids=() i rc=0 code
  have_time "$name" || return 1
  limit=$(left "$5")
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout -k 5 "$limit" "$BIN/tests/$exe" \
      --gtest_filter="$filter" > "$LOGS/$name-shard$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < shards; ++i)); do
    wait "${pids[$i]}"
    code=$?
    if ((code != 0)); then
      rc=1
      ((code == 124 || code > 128)) &&
        echo "$name shard $i: exit $code in: $(grep '^\[ RUN      \]' "$LOGS/$name-shard$i.log" | tail -1 | cut -c14-)"
    fi
  done
  cat "$LOGS/$name"-shard*.log > "$LOGS/$name.log" && rm -f "$LOGS/$name"-shard*.log
  echo "$name: $(grep -c '^\[       OK \]' "$LOGS/$name.log") passed, $(grep -c '^\[  FAILED  \] .*(' "$LOGS/$name.log") failed, $(grep -c '^\[  SKIPPED \] .*(' "$LOGS/$name.log") skipped"
  grep -E "^\[  FAILED  \] .*\(" "$LOGS/$name.log" | head -40
  grep -q "^\[  FAILED" "$LOGS/$name.log" && rc=1
  return $rc
}

if want attention; then
  step "paged fp8 attention against float64 on the dequantised cache (test_gpu *KvFp8*)"
  # The widening (its kernels' code is unchanged since session 21's full run: the bit identity
  # with bf16 and the planned cases), then the conversion at operand load on the decodes, every
  # case (KvFp8Register.* runs both ways itself; KvFp8Widened.* pins the widening: run first).
  FLASHSERVE_KV_FP8_REGISTER=0 sharded test_gpu 8 '*KvFp8Widened*:Mixed/KvFp8.Planned*' \
    kvfp8-attention-widen 80 || status=1
  FLASHSERVE_KV_FP8_REGISTER=1 sharded test_gpu 8 '*KvFp8*:-*KvFp8Sanitize/KvFp8.*:*KvFp8Widened*' \
    kvfp8-attention-register 150 || status=1
  grep -h "register vs widening" "$LOGS/kvfp8-attention-register.log" | sort -t: -k2 | tail -5
fi
if want resources && have_time resources; then
  # Registers and local memory (spills) of the fp8 KV kernels, beside the bf16 kernels of the
  # same tiles (the e4m3 widening holds up to 8 chunks of codes in registers).
  step "resources of the fp8 KV kernels (REG, LOCAL) beside the paged bf16 ones"
  cuobjdump -res-usage "$BIN/tests/test_gpu" 2>/dev/null |
    grep -A1 -E 'fwd_kernel_kv_fp8|fwd_kernelINS1_9FwdConfig.*13__nv_bfloat16Lb[01]ELb1E' |
    grep -oE 'Function [^ ]*|REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*' | paste - - |
    awk -F'\t' '{n=$1; sub(/Function _ZN10flashserve9attention4sm80[0-9]*/, "", n); print $2 "  " substr(n, 1, 110)}' |
    tee "$LOGS/resources.txt"
  # The e4m3 codes arrive by cp.async (LDGSTS; the loader before it had none, only LDG), and
  # spills show as LDL/STL.
  timeout -k 5 "$(left 90)" cuobjdump -sass "$BIN/tests/test_gpu" 2>/dev/null | awk '
    /Function :/ { name = ($3 ~ /fwd_kernel_kv_fp8/) ? $3 : ""; next }
    name != "" && /LDGSTS/ { cp[name]++ }
    name != "" && /LDG\.E/ { ld[name]++ }
    name != "" && /LDL/ { ldl[name]++ }
    name != "" && /STL/ { stl[name]++ }
    name != "" && /F2FP.*E4M3|F2FP.*UNPACK/ { cvt[name]++ }
    name != "" && /STS/ { sts[name]++ }
    name != "" { seen[name] = 1 }
    END { for (n in seen) { k = n; sub(/.*FwdConfigILi/, "d", k); sub(/EEEvNS1_14FwdKvFp8ParamsE/, "", k)
          path = (n ~ /kv_fp8_reg/) ? "register" : "widen   "
          printf "%s LDGSTS %3d LDG %3d LDL %3d STL %3d STS %3d F2FP(e4m3) %4d  %s\n", path, cp[n], ld[n], ldl[n], stl[n], sts[n], cvt[n], k } }' |
    sort -k15 | tee -a "$LOGS/resources.txt"
fi
if want bench; then
  step "bench_serve_attn --kv-fp8: decode and chunk attention on bf16 and e4m3 pools"
  if [ -x "$BIN/bench/bench_serve_attn" ] && have_time bench; then
    for reg in 0 1; do
      have_time "bench register=$reg" || continue
      echo "-- FLASHSERVE_KV_FP8_REGISTER=$reg"
      # The register run also times the decode rows at 1-4 forced splits (its blocks fit six an
      # SM where the widening's fit three; the plan gives both bf16's splits).
      splits=()
      ((reg == 1)) && splits=(--decode-splits 1,2,3,4)
      FLASHSERVE_KV_FP8_REGISTER=$reg timeout -k 5 "$(left $((60 + 60 * reg)))" \
        "$BIN/bench/bench_serve_attn" --kv-fp8 ${splits[@]+"${splits[@]}"} --calls 10 --reps 7 --md "$LOGS/bench_kv_fp8_reg$reg.md" > "$LOGS/bench-reg$reg.log" 2>&1 ||
        { echo "bench register=$reg: failed"; status=1; }
      sed -n '/fp8 KV cache: batch/,$p' "$LOGS/bench-reg$reg.log"
    done
  else
    echo "bench_serve_attn was not packed (add bench/bench_serve_attn to BINARIES)"
  fi
fi
if want sanitize; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool on KvFp8Sanitize (expect 0 errors / 0 hazards)"
    have_time "$tool" || continue
    FLASHSERVE_KV_FP8_REGISTER=${REGISTER_SANITIZE:-1} \
      timeout -k 5 "$(left 90)" compute-sanitizer --tool $tool --error-exitcode 99 \
      "$BIN/tests/test_gpu" --gtest_filter='*KvFp8Sanitize*PlannedMatches*' --gtest_brief=1 \
      > "$LOGS/sanitize-$tool.log" 2>&1
    code=$?
    tail -n 4 "$LOGS/sanitize-$tool.log"
    [ "$code" = 0 ] || { echo "$tool: exit $code"; status=1; }
  done
fi
if want model; then
  step "the model: e4m3 write vs host, pool vs bf16 pool, logits vs bf16 cache, greedy (KvFp8*)"
  sharded test_model_gpu 1 'KvFp8*' kvfp8-model 90 || status=1
  grep -hE "fp8 vs bf16 cache|greedy tokens agree" "$LOGS/kvfp8-model.log"
fi
if want run; then
  export FLASHSERVE_CUDA_FP8_KV=1
  for cache in fp8 bf16; do
    step "flashserve run --device cuda --kv-cache-dtype $cache (end to end)"
    have_time "run $cache" || continue
    timeout -k 5 "$(left 40)" "$BIN/src/flashserve" run --device cuda --kv-cache-dtype "$cache" \
      > "$LOGS/run-$cache.log" 2>&1
    code=$?
    [ "$code" = 0 ] || { echo "run $cache: exit $code"; status=1; }
    grep -E "^flashserve run|^\| (sarathi|vllm)" "$LOGS/run-$cache.log" | head -8
  done
fi
if want regression; then
  step "beside them, nothing regressed: bf16 serving steps, the CUDA runner, sm90 fp8 refusals"
  sharded test_gpu 8 '*GpuServing*:*Sm90Fp8Refusals*' regression-attention 80 || status=1
  sharded test_model_gpu 1 'GpuModelRunner.*' regression-model 60 || status=1
fi
echo; echo "fp8-kv-gpu-check: $([ $status = 0 ] && echo OK || echo FAILED) (${SECONDS}s)"
sleep 1  # the tee's last lines
tar -C "$LOGS" -cf - . | xz -T4 > "$OUT/fp8-kv-gpu-check.tar.xz"
exit $status
