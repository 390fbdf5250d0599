#!/usr/bin/env bash
# One call on the H200 for the sm90 forward kernel (issue 19): the sm90 GPU tests, compute-sanitizer
# memcheck and racecheck on the small case, the SASS check (HGMMA count, registers and local memory
# of the sm90 kernels), bench_sm90 (sm80 beside sm90, forced, per head dim), and the public API
# (bench_attn, default dispatch) beside PyTorch SDPA's cuDNN and flash backends in the same run
# (sdpa_compare.py, compare_table.py), and flash_attn_func in CUDA graphs beside them
# (bench/fa3_grid.py, when libflashserve_c.so was packed). Logs under $OUT.
#
# The binaries are built on the build machine for 90a and carried (the GPU image lacks headers
# the full configure needs):
#   cmake -S . -B build/dev90 -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a
#   cmake --build build/dev90 --target test_gpu bench_sm90 bench_attn
#   BINARIES="tests/test_gpu bench/bench_sm90 bench/bench_attn src/libflashserve_c.so" \
#     bash scripts/gpu-quick.sh --pack build/dev90 .xfer/sm90.tar.xz
# then, on the GPU machine (carry .xfer):
#   BIN_TAR=.xfer/sm90.tar.xz OUT=$OUT bash scripts/sm90-check.sh
# The d64 exponentials on the FMA pipe alone (FLASHSERVE_SM90_EXP2_FMA, docs/kernel-notes.md
# "exp2 on the FMA pipe"): their tests and the exp2fma A/B in one call, on the build machine
#   cmake -S . -B build/h90 -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a
#   cmake --build build/h90 -j1 --target test_gpu bench_sm90
#   BINARIES="tests/test_gpu bench/bench_sm90" bash scripts/gpu-quick.sh --pack build/h90 \
#     .xfer/exp2.tar.xz
# then on the GPU machine (carry .xfer):
#   BIN_TAR=.xfer/exp2.tar.xz OUT=$OUT FILTER='Sm90Exp2Fma.*:*Sm90Nan*:*Sm90Forward*d64*' \
#     SKIP="all_gpu_tests sanitize sass sm90 epilogue sweep api fa3 ncu" bash scripts/sm90-check.sh
# Environment: HEAD_DIMS (64,128,256), SEQLENS (512,...,16384), SKIP="tests all_gpu_tests
# sanitize sass sm90 epilogue exp2fma sweep api fa3 ncu" leaves steps out, EPI_SEQLENS (the
# epilogue step's, default 512,1024,2048), FMA_SEQLENS (the exp2fma step's, default SEQLENS),
# FA3_ARGS (more fa3_grid.py arguments), FILTER (the gtest filter of the tests step, default '*Sm90*'; 8 shards, TEST_TIMEOUT seconds each, default 150),
# SM90_SEQLENS (bench_sm90's, default SEQLENS), NCU_SHAPES ("d:seqlen:causal ...", default
# "128:512:0 128:8192:0").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/sm90-check.log") 2>&1
HEAD_DIMS=${HEAD_DIMS:-64,128,256}
SEQLENS=${SEQLENS:-512,1024,2048,4096,8192,16384}
status=0
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }

BIN=/tmp/fsbin
mkdir -p "$BIN" && xz -dc "${BIN_TAR:?BIN_TAR names the packed binaries}" | tar -C "$BIN" -xf - ||
  { echo "unpack failed"; exit 1; }
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "commit ${COMMIT:-unknown}"

if want tests; then
  # 8 shards side by side (the float64 references are CPU-bound: one process takes minutes),
  # each under its own timeout; a shard that timed out or died is named with the test it was in.
  step "tests (every Sm90* test passes; none skipped on the H200), 8 shards"
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout -k 5 "${TEST_TIMEOUT:-150}" \
      "$BIN/tests/test_gpu" --gtest_filter="${FILTER:-*Sm90*}" > "$OUT/tests-shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3 4 5 6 7; do
    wait "${pids[$i]}"
    code=$?
    ((code == 0)) && continue
    status=1
    echo "shard $i: exit $code, in: $(grep '^\[ RUN      \]' "$OUT/tests-shard$i.log" | tail -1 | cut -c14-)"
  done
  cat "$OUT"/tests-shard*.log > "$OUT/tests.log" && rm -f "$OUT"/tests-shard*.log
  echo "tests: $(grep -c '^\[       OK \]' "$OUT/tests.log") passed, $(grep -c '^\[  FAILED  \] .*(' "$OUT/tests.log") failed, $(grep -c '^\[  SKIPPED \] .*(' "$OUT/tests.log") skipped"
  grep -E "^\[  FAILED  \] .*\(" "$OUT/tests.log" | head -40
fi
if want all_gpu_tests; then
  # Every GPU test (attention sm80 and sm90, serving attention, KV append), in 8 shards side by
  # side (the float64 references are CPU-bound), and the PyTorch operator tests: the dispatch
  # sends more calls to sm90 than the Sm90* tests alone cover.
  step "every GPU test, 8 shards, and the PyTorch tests"
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 400 "$BIN/tests/test_gpu" --gtest_brief=1 \
      > "$OUT/shard$i.log" 2>&1 &
    pids+=($!)
  done
  # The shards by name: a bare `wait` also waits for the log's tee (exec > >(tee ...)), which
  # never ends (run 37 hung there until its 600 s limit).
  wait "${pids[@]}"
  grep -h -E "^\[  (PASSED|FAILED|SKIPPED)|tests? ran|Failure" "$OUT"/shard*.log | sort | uniq -c
  grep -q "FAILED" "$OUT"/shard*.log && status=1
  cat "$OUT"/shard*.log > "$OUT/gpu-tests.log" && rm -f "$OUT"/shard*.log
  [ -f "$BIN/src/libflashserve_c.so" ] && env -u LD_LIBRARY_PATH PYTHONPATH=python \
    FLASHSERVE_LIBRARY="$BIN/src/libflashserve_c.so" timeout 200 python3 -m pytest -q -x \
    python/tests/test_gpu_torch.py python/tests/test_gpu_torch_ops.py 2>&1 | tail -n 3
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if want sanitize; then
  # Sm90Sanitize plus two grids larger than one persistent wave (240 and 288 tiles, causal: the
  # tile counter, the tile ring and the turns carried from tile to tile), and one each of varlen
  # q over seqused_k (the V rows zeroed past the keys), paged K/V in 16-key boxes, and a window
  # masked on both sides; Sm90Sanitize.VarlenEpilogueBoxes has session 18's TMA stores of O (own
  # staging at d128, staged in Q at d256) with varlen boxes on both sides of a sequence's end.
  c='Shapes/Sm90Forward.MatchesFloat64Reference'
  multi="$c/b3_q130_k130_h40_8_d128_f16_causal:$c/b2_q300_k77_h48_8_d64_bf16_causal"
  multi+=":$c/b3_q77x200x5_k100x250x1_h4_1_d128_bf16_qvar_used90_causal"
  multi+=":$c/b3_q130x1x257_k300x77x1100_h8_2_d128_bf16_qvar_page16_causal"
  multi+=":$c/b1_q300_k300_h2_1_d64_f16_wl40_wr17:Sm90Multicast.SameBitsAsWithout"
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool on Sm90Sanitize and two multi-tile grids (expect 0 errors / 0 hazards)"
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 "$BIN/tests/test_gpu" \
      --gtest_filter="Sm90Sanitize.*:$multi" --gtest_brief=1 2>&1 | tail -n 4
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if want sass; then
  step "SASS of the sm90 kernels: HGMMA count, local memory (expect 0), resources"
  cuobjdump -sass "$BIN/tests/test_gpu" > "$OUT/sass.txt" 2>/dev/null
  awk '/Function : .*sm9010fwd_kernel/{k=1} /Function : /&&!/sm9010fwd_kernel/{k=0} k' "$OUT/sass.txt" > "$OUT/sass90.txt"
  echo "HGMMA: $(grep -c HGMMA "$OUT/sass90.txt"), LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass90.txt")"
  cuobjdump -res-usage "$BIN/tests/test_gpu" 2>/dev/null | grep -A1 'sm9010fwd_kernel' |
    grep -o 'REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*' | sort | uniq -c
  xz -T4 "$OUT/sass90.txt"; rm -f "$OUT/sass.txt"
fi
if want sm90; then
  for d in ${HEAD_DIMS//,/ }; do
    step "bench_sm90, d$d (TFLOP/s, bf16, 16k tokens, sm80 beside sm90)"
    timeout 150 "$BIN/bench/bench_sm90" --head-dim "$d" --seqlens "${SM90_SEQLENS:-$SEQLENS}" --iters 20 |
      tee -a "$OUT/bench_sm90.txt" || status=1
  done
fi
if want epilogue; then
  # Session 18's tile boundary (FLASHSERVE_SM90_EPILOGUE, docs/kernel-notes.md): the sm90 kernel
  # with the register stores (0) and with O by TMA store and the announced work (1), alternated in
  # one process, and whether the outputs are bit-identical (they must be: "same bits" yes).
  for d in ${HEAD_DIMS//,/ }; do
    step "bench_sm90 --epilogue-ab, d$d (TFLOP/s, FLASHSERVE_SM90_EPILOGUE 0 against 1)"
    timeout 150 "$BIN/bench/bench_sm90" --head-dim "$d" --seqlens "${EPI_SEQLENS:-512,1024,2048}" \
      --iters 20 --epilogue-ab | tee -a "$OUT/bench_epilogue.txt" || status=1
  done
  step "bench_sm90 --epilogue-ab --varlen, d128 (the TMA boxes kept inside their sequences)"
  timeout 100 "$BIN/bench/bench_sm90" --head-dim 128 --seqlens "${EPI_SEQLENS:-512,1024,2048}" \
    --iters 20 --epilogue-ab --varlen | tee -a "$OUT/bench_epilogue.txt" || status=1
  grep -q " NO" "$OUT/bench_epilogue.txt" && { echo "epilogue: outputs differ"; status=1; }
fi
if want exp2fma; then
  # Part of the d64 softmax's exponentials on the FMA pipe (FLASHSERVE_SM90_EXP2_FMA, tile_config.h
  # Exp2Fma): the sm90 kernel with every exponential on the MUFU (0) and one 8-column chunk in 8
  # by the polynomial (1), alternated in one process; the outputs differ by rounding only
  # ("max|diff|": a bf16 ulp or two of the output, Sm90Exp2Fma.* bounds it against the float64
  # reference). The prediction (kernel-notes): fma=1/fma=0 1.03-1.07 at 2k-16k keys, 1.01-1.04 at 512-1k.
  for dt in "" --fp16; do
    step "bench_sm90 --exp2-fma-ab, d64 ${dt:-bf16} (TFLOP/s, FLASHSERVE_SM90_EXP2_FMA 0 against 1)"
    timeout 150 "$BIN/bench/bench_sm90" --head-dim 64 --seqlens "${FMA_SEQLENS:-$SEQLENS}" \
      --iters 20 --exp2-fma-ab $dt | tee -a "$OUT/bench_exp2_fma.txt" || status=1
  done
fi
if want sweep && [ -x "$BIN/bench/sm90_sweep" ]; then
  # Alternative tiles and epilogues side by side (bench/tuning/sm90_sweep.cu; a -DFLASHSERVE_TUNING=ON
  # build packed with bench/sm90_sweep).
  step "sm90_sweep: tiles and epilogue store widths side by side (CUDA graphs)"
  timeout 300 "$BIN/bench/sm90_sweep" "$SEQLENS" "$HEAD_DIMS" | tee "$OUT/sm90_sweep.md" || status=1
fi
if want api; then
  step "public API (bench_attn, default dispatch) beside SDPA cuDNN and flash, same run"
  timeout 200 "$BIN/bench/bench_attn" --prefill-only --head-dims "$HEAD_DIMS" --seqlens "$SEQLENS" \
    --csv "$OUT/ours.csv" > "$OUT/bench_attn.txt" || status=1
  timeout 200 python3 bench/sdpa_compare.py --head-dims "$HEAD_DIMS" --seqlens "$SEQLENS" \
    --csv "$OUT/sdpa.csv" > "$OUT/sdpa.txt" || status=1
  python3 bench/compare_table.py "$OUT/ours.csv" "$OUT/sdpa.csv" | tee "$OUT/table.md"
fi
if want fa3 && [ -f "$BIN/src/libflashserve_c.so" ]; then
  # What a user gets: flash_attn_func with default arguments, calls captured in CUDA graphs,
  # beside SDPA's cuDNN and FA2 (the issue's measurement), plus the long-context GQA rows.
  step "flash_attn_func (CUDA graphs) beside SDPA cuDNN and FA2: FA3 grid and long context"
  env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 PYTHONPATH=python \
    FLASHSERVE_LIBRARY="$BIN/src/libflashserve_c.so" timeout 400 python3 bench/fa3_grid.py \
    --head-dims "$HEAD_DIMS" --seqlens "$SEQLENS" ${FA3_ARGS:-} --csv "$OUT/fa3_grid.csv" |
    tee "$OUT/fa3_grid.md" || status=1
fi
if want ncu; then
  # Nsight Compute on the sm90 kernel through bench_attn (its default dispatch), a short and a
  # long shape: tensor pipe, issue slots, L2 and DRAM, stall reasons (clocks left alone).
  digest='Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|Tensor|L2 Hit Rate|Warp Cycles Per Issued|Stall|No Eligible|Executed Ipc'
  for shape in ${NCU_SHAPES:-128:512:0 128:8192:0}; do
    IFS=: read -r d sl c <<<"$shape"
    step "ncu, sm90 kernel, d$d seqlen $sl causal $c"
    timeout 120 ncu --clock-control none --kernel-name fwd_kernel --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --print-details all "$BIN/bench/bench_attn" --prefill-only --head-dims "$d" --seqlens "$sl" \
      --causal "$c" --iters 1 --warmup 2 --pause-ms 0 > "$OUT/ncu-d$d-s$sl-c$c.txt" 2>&1
    grep -E "$digest" "$OUT/ncu-d$d-s$sl-c$c.txt" | sed 's/  */ /g' | head -40
  done
fi
echo; echo "sm90-check: $([ $status = 0 ] && echo OK || echo FAILED)"
exit $status
