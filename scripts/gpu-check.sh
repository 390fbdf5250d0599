#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, sanitizers, SASS check, benchmark beside PyTorch SDPA.
#   bash scripts/gpu-check.sh [--no-tests] [--no-sanitize] [--no-bench] [--quick-bench]
#                             [--bench-args "..."] [--sweep ["seqlens"]] [--decode-splits 0,8,...]
#                             [--sweep-only] [--serve] [--model]
#   --serve  bench_serve_attn: the serving rows (paged and mixed batches beside their parts)
#   --model  bench_model --quick: the CUDA model runner at the mistral-7b shape (decode, prefill)
# Environment: OUT (logs and CSVs; default ./out), ARCHS (default 90a: the device is an H200; use
# "80;90a" to build what CI builds), JOBS (default nproc).
# Prints a short summary last. $OUT gets summary.txt, table.md and the CSVs; every other log is packed
# into $OUT/logs.tgz (the device tool returns at most eight files). --sweep also builds and runs
# bench/tuning/tile_sweep (alternative tile configurations side by side; sweep.log).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
LOGS=$OUT/logs
mkdir -p "$OUT" "$LOGS"
ARCHS=${ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
BUILD=build/gpu
serve=0 model=0 tests=1 sanitize=1 bench=1 quick=0 bench_args="" sweep=0 sweep_args="" decode_splits=0 targets=""
while (($#)); do
  case "$1" in
    --no-tests) tests=0 ;;
    --no-sanitize) sanitize=0 ;;
    --no-bench) bench=0 ;;
    --serve) serve=1 ;;
    --model) model=1 ;;
    --quick-bench) quick=1 ;;
    --bench-args) bench_args=$2; shift ;;
    --decode-splits) decode_splits=$2; shift ;;
    --sweep-only) sweep=1 tests=0 sanitize=0 bench=0 targets="--target tile_sweep" ;;  # bench_attn only: forced split counts beside auto (0)
    --sweep)
      sweep=1
      if [[ $# -gt 1 && $2 != --* ]]; then sweep_args=$2; shift; fi ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
summary=()
failed=0  # the exit status: non-zero when a build, test, sanitizer or benchmark step failed
note() { summary+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOGS/gpu.txt"
# The device gets a copy of the tree without .git: pass COMMIT=<hash> there.
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
dirty=$(git status --porcelain 2>/dev/null | grep -v '^??' | wc -l)
note "commit $commit (+$dirty modified files), $(date -u +%F), ARCHS=$ARCHS"

t0=$(date +%s)
PY=$(command -v python3)
if ! { cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS="$ARCHS" -DFLASHSERVE_TUNING=$([ $sweep = 1 ] && echo ON || echo OFF) \
        -DPython3_EXECUTABLE="$PY" >"$LOGS/configure.log" 2>&1 &&
      cmake --build $BUILD -j "$JOBS" $targets >"$LOGS/build.log" 2>&1; }; then
  tail -n 60 "$LOGS/build.log" "$LOGS/configure.log"
  note "BUILD FAILED (see build.log)"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
note "build ok in $(( $(date +%s) - t0 )) s"

if ((tests)); then
  t0=$(date +%s)
  ctest --test-dir $BUILD -j 8 --output-on-failure --timeout 300 >"$LOGS/ctest.log" 2>&1
  rc=$?
  ((rc)) && failed=1
  note "ctest (cpu+gpu+python): $(grep -E 'tests passed|tests failed' "$LOGS/ctest.log" | tail -1) [rc=$rc, $(( $(date +%s) - t0 )) s]"
  grep -E "Failed|\*\*\*" "$LOGS/ctest.log" | head -20
  gpu_lines=$(grep -E 'Test +#[0-9]+: ([A-Za-z]+/)?Gpu' "$LOGS/ctest.log")
  note "gpu tests: $(grep -c . <<<"$gpu_lines") run, $(grep -c ' Passed' <<<"$gpu_lines") passed, $(grep -c 'Skipped' <<<"$gpu_lines") skipped"
  grep -E "python_package" "$LOGS/ctest.log" | tail -1
fi

if ((sanitize)) && [ -x $BUILD/tests/test_gpu ]; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 \
      $BUILD/tests/test_gpu --gtest_filter='*Sanitize*' >"$LOGS/sanitize-$tool.log" 2>&1
    rc=$?
    ((rc)) && failed=1
    note "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitize-$tool.log" | tail -1) ($(grep -c '^\[       OK' "$LOGS/sanitize-$tool.log") tests, $(( $(date +%s) - t0 )) s)"
  done
fi

# The serving rows and the model first: they are short, and the prefill grid below is long.
if ((serve)) && [ -x $BUILD/bench/bench_serve_attn ]; then
  timeout 120 $BUILD/bench/bench_serve_attn --md "$OUT/serve.md" >"$LOGS/bench_serve_attn.log" 2>&1
  rc=$?
  ((rc)) && failed=1
  note "bench_serve_attn rc=$rc (serve.md)"
fi

if ((model)) && [ -x $BUILD/bench/bench_model ]; then
  COMMIT=$commit timeout 150 $BUILD/bench/bench_model --quick >"$OUT/model.txt" 2>&1
  rc=$?
  ((rc)) && failed=1
  note "bench_model --quick rc=$rc (model.txt)"
fi

if [ -x $BUILD/bench/bench_attn ]; then
  cuobjdump -sass $BUILD/bench/bench_attn > "$LOGS/sass.txt" 2>/dev/null
  note "SASS: $(grep -c HMMA "$LOGS/sass.txt") HMMA, $(grep -c HGMMA "$LOGS/sass.txt") HGMMA, $(grep -cE 'LDL|STL' "$LOGS/sass.txt") LDL/STL lines"
  # Registers and stack frame (where spills go) of every kernel, from the binary itself.
  cuobjdump -res-usage $BUILD/bench/bench_attn 2>/dev/null |
    awk '/Function/ {name = $2} /REG:/ {print $0 "  " name}' | sed 's/^[[:space:]]*//' > "$LOGS/spills.txt"
  note "kernels: $(grep -c . "$LOGS/spills.txt"), with a stack frame (spills): $(grep -vc 'STACK:0 ' "$LOGS/spills.txt")"
fi

if ((sweep)) && [ -x $BUILD/bench/tile_sweep ]; then
  timeout 300 $BUILD/bench/tile_sweep $sweep_args >"$OUT/sweep.log" 2>&1
  rc=$?
  ((rc)) && failed=1
  note "tile_sweep rc=$rc (sweep.log)"
fi

if ((bench)) && [ -x $BUILD/bench/bench_attn ]; then
  args=$bench_args
  ((quick)) && args="--seqlens 1024,8192 --iters 10 $args"
  # SM clock, power and temperature every 200 ms while the benchmarks run (throttling shows here).
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 200 >"$LOGS/clocks.csv" 2>&1 &
  smi=$!
  timeout 400 $BUILD/bench/bench_attn --csv "$OUT/ours.csv" --decode-splits "$decode_splits" $args \
    >"$LOGS/bench_attn.log" 2>&1
  rc=$?
  [ "$decode_splits" != 0 ] && sed -n '/^batch/,$p' "$LOGS/bench_attn.log" >"$OUT/decode.txt"
  ((rc)) && failed=1
  note "bench_attn rc=$rc"
  timeout 400 "$PY" bench/sdpa_compare.py --csv "$OUT/sdpa.csv" $args >"$LOGS/sdpa.log" 2>&1
  rc=$?
  ((rc)) && failed=1
  note "sdpa_compare rc=$rc"
  kill $smi 2>/dev/null
  note "SM clock during the benchmarks (MHz): $(awk -F', ' 'NR > 1 {print $2+0}' "$LOGS/clocks.csv" | sort -n | awk '{v[NR] = $1} END {if (NR) printf "min %d, median %d, max %d", v[1], v[int((NR + 1) / 2)], v[NR]}')"
  gpu=$(head -2 "$LOGS/gpu.txt" | tail -1 | cut -d, -f1)
  "$PY" bench/compare_table.py "$OUT/ours.csv" "$OUT/sdpa.csv" \
    --header "bench_attn vs PyTorch SDPA — $gpu, $(date -u +%F), commit $commit, bf16, batch x seqlen = 16384, heads x head_dim = 2048" \
    > "$OUT/table.md" 2>"$LOGS/table.err"
fi

rm -f "$LOGS/sass.txt"  # large; its counts are in the summary
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
{
  echo
  echo "================ summary ================"
  printf '%s\n' "${summary[@]}"
  [ -s "$OUT/sweep.log" ] && cat "$OUT/sweep.log"
  [ -s "$OUT/decode.txt" ] && cat "$OUT/decode.txt"
  [ -s "$OUT/table.md" ] && cat "$OUT/table.md"
  [ -s "$OUT/serve.md" ] && cat "$OUT/serve.md"
  [ -s "$OUT/model.txt" ] && grep -iE 'floor|decode|prefill|copy' "$OUT/model.txt" | head -30
} | tee "$OUT/summary.txt"
exit $failed
