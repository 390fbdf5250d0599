#!/usr/bin/env bash
# One call on the GPU machine for the model layer: build (ARCHS=90a, only the model's targets),
# the model's GPU tests, bench_model beside transformers' prefill, and the comparison against
# transformers (tests/model_gpu/compare_transformers.py). Logs under $OUT.
#   OUT=... COMMIT=... bash scripts/model-gpu-check.sh [--no-compare] [--no-bench] [--quick]
# Where the image lacks OpenBLAS or nlohmann-json (the model library's CPU half needs them),
# Debian packages in .deps/ are unpacked under /tmp/deps and the build pointed at them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
compare=1 bench=1 quick=0
for a in "$@"; do
  case $a in --no-compare) compare=0 ;; --no-bench) bench=0 ;; --quick) quick=1 ;; esac
done
# --quick (a short call): bench_model --quick first, then the tests, then one configuration of
# the comparison; no transformers prefill.

BUILD=build/gpu
extra=()
P=/tmp/deps/usr
if [ -d .deps ]; then
  mkdir -p /tmp/deps && for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
  if ! [ -f /usr/include/nlohmann/json.hpp ]; then
    extra+=(-Dnlohmann_json_DIR=$P/share/cmake/nlohmann_json)
    echo "deps: nlohmann-json from .deps"
  fi
  if ! ls /usr/lib/x86_64-linux-gnu/libopenblas.so /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so >/dev/null 2>&1; then
    extra+=(-DOPENBLAS_LIBRARY=$P/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so
            -DOPENBLAS_INCLUDE_DIR=$P/include/x86_64-linux-gnu/openblas-pthread)
    export LD_LIBRARY_PATH=$P/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    ldconfig -p | grep -q libgfortran.so.5 || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$P/lib/x86_64-linux-gnu
    echo "deps: OpenBLAS from .deps"
  fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
# Binaries built elsewhere for sm_90a (.prebuilt.tar.xz, carried beside the tree) skip the ~2 min
# build when they run here; otherwise build.
if [ -f .prebuilt.tar.xz ]; then
  mkdir -p $BUILD/tests $BUILD/bench $BUILD/src /tmp/prebuilt
  tar -xJf .prebuilt.tar.xz -C /tmp/prebuilt
  cp /tmp/prebuilt/test_model_gpu /tmp/prebuilt/model_logits $BUILD/tests/
  cp /tmp/prebuilt/bench_model $BUILD/bench/
  cp /tmp/prebuilt/flashserve $BUILD/src/
  if $BUILD/tests/test_model_gpu --gtest_list_tests >/dev/null 2>&1 &&
     $BUILD/src/flashserve --help >/dev/null 2>&1; then
    echo "== prebuilt binaries run here (commit ${COMMIT:-unknown})"
  else
    echo "== prebuilt binaries do not run here: building"; rm -f .prebuilt.tar.xz
  fi
fi
if ! [ -f .prebuilt.tar.xz ]; then
  { cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a \
      -DPython3_EXECUTABLE="$(command -v python3)" "${extra[@]}" &&
    cmake --build $BUILD -j "${JOBS:-16}" --target test_model_gpu model_logits bench_model flashserve
  } >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
fi
echo "== binaries ready in $(( $(date +%s) - t0 )) s, commit ${COMMIT:-unknown}"
run_tests() {
  timeout 120 $BUILD/tests/test_model_gpu 2>&1 | tee "$OUT/test_model_gpu.log" |
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|error" | head -60
}
if ((quick)); then
  COMMIT=${COMMIT:-unknown} timeout 60 $BUILD/bench/bench_model --quick 2>&1 | tee "$OUT/bench_model.log"
  run_tests
  PYTHONUNBUFFERED=1 timeout 60 python3 tests/model_gpu/compare_transformers.py --build $BUILD \
    --work /tmp/cmp --only llama-gqa 2>&1 | grep -v -i -E "warn|Loading weights" | tee "$OUT/compare.log"
  exit 0
fi
run_tests
# flashserve generate on the GPU and on the CPU, same tiny checkpoint, greedy.
$BUILD/src/flashserve make-checkpoint --shape tiny --out /tmp/tiny >/dev/null &&
  for dev in cuda cpu; do
    echo "generate --device $dev: $($BUILD/src/flashserve generate --model /tmp/tiny --prompt-ids 5,17,300,42,9 --max-tokens 16 --ignore-eos --device $dev 2>&1)"
  done | tee "$OUT/generate.log"
# Ours first, then the comparison, then transformers' prefill (the anchor has its figure).
if ((bench)); then
  COMMIT=${COMMIT:-unknown} timeout 150 $BUILD/bench/bench_model 2>&1 | tee "$OUT/bench_model.log"
fi
if ((compare)); then
  PYTHONUNBUFFERED=1 timeout 330 python3 tests/model_gpu/compare_transformers.py --build $BUILD \
    --work /tmp/cmp 2>&1 | grep -v -i -E "warn|Loading weights" | tee "$OUT/compare.log"
fi
if ((bench)); then
  PYTHONUNBUFFERED=1 timeout 120 python3 bench/hf_model_bench.py 2>&1 | grep -v Warning | tee "$OUT/hf_bench.log"
fi
