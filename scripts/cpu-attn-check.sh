#!/usr/bin/env bash
# Issue 14, CPU part: the CPU attention path beside PyTorch's CPU SDPA on this machine's CPU, in
# one short call (no GPU used). Builds only what it runs (CUDA off: libflashserve_c.so and
# bench_cpu_attn), then
#   1. bench_cpu_attn: the block-product kernel's one-thread peak, OpenBLAS's sgemm (which core it
#      picked), float32 and bf16 (AMX where available; bf16c: converted to float32, bf16p: bf16
#      pairs) at L = 2048, d = 128 (a few seconds);
#   2. bench/cpu_sdpa_compare.py: flash_attn_func on torch CPU tensors (and NumPy) beside
#      torch.nn.functional.scaled_dot_product_attention, float32 and bfloat16, d 64/128, causal and
#      not, L 1k-8k, with the ratio and an output check (about 30 s on 16 cores).
# Success: the compare prints no MISMATCH line and exits 0; its last lines give the worst ratio
# per dtype (issue 14's bar: float32 >= 1.0, bfloat16 >= 0.5). Logs and the CSV go to $OUT.
#   OUT=... bash scripts/cpu-attn-check.sh [--tests]   (--tests: also the CPU attention gtests)
# PY (default python3) runs the comparison; COMPARE_ARGS are passed to it (e.g. --quick).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build/cpu-check}
tests=OFF
[ "${1:-}" = --tests ] && tests=ON
extra=()
# Where the image lacks nlohmann-json or OpenBLAS, Debian packages in .deps/ (as for
# scripts/model-gpu-check.sh); the CPU attention path itself needs neither library.
P=/tmp/deps/usr
if [ -d .deps ]; then
  mkdir -p /tmp/deps && for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
  [ -f /usr/include/nlohmann/json.hpp ] || extra+=(-Dnlohmann_json_DIR=$P/share/cmake/nlohmann_json)
  if ! ls /usr/lib/x86_64-linux-gnu/libopenblas.so /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so >/dev/null 2>&1; then
    extra+=(-DOPENBLAS_LIBRARY=$P/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so
            -DOPENBLAS_INCLUDE_DIR=$P/include/x86_64-linux-gnu/openblas-pthread)
    export LD_LIBRARY_PATH=$P/lib/x86_64-linux-gnu/openblas-pthread:$P/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
lscpu | grep -E "Model name|^CPU\(s\)|L2 cache" | tee "$OUT/cpu.txt"
grep -o -w -E "avx512f|avx512_bf16|amx_bf16|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' ' | tee -a "$OUT/cpu.txt"
echo
t0=$(date +%s)
targets=(flashserve_c bench_cpu_attn)
[ $tests = ON ] && targets+=(test_attention)
if ! { cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA=OFF -DFLASHSERVE_TESTS=$tests \
         -DPython3_EXECUTABLE="$(command -v ${PY:-python3})" "${extra[@]}" >"$OUT/cpu-configure.log" 2>&1 &&
       cmake --build $BUILD -j "${JOBS:-$(nproc)}" --target "${targets[@]}" >"$OUT/cpu-build.log" 2>&1; }; then
  tail -40 "$OUT/cpu-configure.log" "$OUT/cpu-build.log"
  echo "BUILD FAILED"
  exit 1
fi
echo "== built in $(( $(date +%s) - t0 )) s"
rc=0
if [ $tests = ON ]; then
  $BUILD/tests/test_attention --gtest_brief=1 >"$OUT/cpu-tests.log" 2>&1 || rc=1
  tail -3 "$OUT/cpu-tests.log"
fi
$BUILD/bench/bench_cpu_attn --seqlens 2048 --dims 128 --dtypes f32,bf16,bf16c,bf16p 2>&1 | tee "$OUT/bench_cpu_attn.txt"
FLASHSERVE_LIBRARY=$PWD/$BUILD/src/libflashserve_c.so ${PY:-python3} bench/cpu_sdpa_compare.py \
  --csv "$OUT/cpu_sdpa_compare.csv" ${COMPARE_ARGS:-} 2>&1 | tee "$OUT/cpu_sdpa_compare.txt"
((PIPESTATUS[0])) && rc=1
echo "== cpu-attn-check done in $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
