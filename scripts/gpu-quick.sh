#!/usr/bin/env bash
# One short call on the GPU machine that runs every GPU-side feature once, most valuable first, so
# that a call cut short by its time limit still returns what ran: the engine on the CUDA runner
# (`flashserve run --device cuda`), every GPU test (attention, model, the server through a device
# fault), bench_sm90, the Python host cost and decode defaults (bench/python_host_cost.py), the CPU
# path beside PyTorch's CPU SDPA, the PyTorch operator tests, compute-sanitizer (memcheck,
# racecheck) on every kernel's small cases, and the mistral-7b shape profiled and served (sarathi,
# vllm) beside the calibrated simulator. About 5 minutes on one H200.
#
#   OUT=... bash scripts/gpu-quick.sh              # builds the five targets for 90a (~2-3 min)
#   BIN=.xfer/bin OUT=... bash scripts/gpu-quick.sh  # binaries built elsewhere (see --pack)
# The binaries travel compressed: on the build machine
#   bash scripts/gpu-quick.sh --pack build/dev90 .xfer/bin.tar.xz   (EXTRA_BINARIES="bench/..." adds more)
# and the call unpacks them with BIN_TAR=.xfer/bin.tar.xz.
# PACK_XZ sets xz's options (default -T2 -6). One stream with a dictionary larger than the
# binaries (PACK_XZ="-T1 --lzma2=preset=6,dict=400MiB") stores the kernels that every binary
# embeds once: ten binaries in 27.5 MB against ~12 MB each apart (session 20); slower (~5 min).
set -uo pipefail
cd "$(dirname "$0")/.."

BINARIES=${BINARIES:-"src/flashserve src/libflashserve_c.so tests/test_gpu tests/test_model_gpu tests/test_server_gpu bench/bench_sm90 ${EXTRA_BINARIES:-}"}
if [ "${1:-}" = --pack ]; then  # --pack BUILD_DIR TARBALL
  # The GPU machine's image is not this one: the shared libraries our binaries link that are not
  # glibc's, the C++ runtime's or CUDA's (ICU, cpp-httplib, PCRE2, OpenBLAS, ...) travel in lib/.
  b=$2 stage=$(mktemp -d)
  # A binary the build left out (test_server_gpu needs cpp-httplib) is said and skipped.
  built=""
  for f in $BINARIES; do [ -e "$b/$f" ] && built+=" $f" || echo "--pack: not built, left out: $f"; done
  for f in $built; do mkdir -p "$stage/$(dirname $f)" && cp "$b/$f" "$stage/$f"; done
  mkdir -p "$stage/lib"
  for f in $built; do ldd "$b/$f"; done | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
    xargs -r -I{} cp -L {} "$stage/lib/"
  mkdir -p "$(dirname "$3")"
  tar -C "$stage" -cf - . | xz ${PACK_XZ:--T2 -6} > "$3"
  rm -rf "$stage"
  ls -la "$3"
  exit 0
fi

OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-quick.log") 2>&1
step() { echo; echo "== $* ($(date -u +%T), ${SECONDS}s)"; }
declare -A result
run_step() {  # run_step NAME TIMEOUT CMD...: records ok/FAILED(rc); SKIP="name ..." leaves steps out
  local name=$1 t=$2
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    result[$name]=skipped
    return
  fi
  timeout "$t" "$@"
  local rc=$?
  result[$name]=$([ $rc = 0 ] && echo ok || echo "FAILED (rc $rc)")
}

if [ -n "${BIN_TAR:-}" ]; then
  BIN=${BIN:-/tmp/fsbin}
  mkdir -p "$BIN" && xz -dc "$BIN_TAR" | tar -C "$BIN" -xf - || { echo "unpack failed"; exit 1; }
  # Only our binaries see the carried libraries (python3 keeps the image's own).
  LIBS="$BIN/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib"
  # NCCL (218 MB) does not travel: the image has PyTorch's copy (same soname, libnccl.so.2).
  nccl=$(find /usr/local/cuda/lib* /usr/lib /usr/local/lib -name 'libnccl.so.2*' 2>/dev/null | head -n 1)
  [ -n "$nccl" ] ||
    nccl=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)/lib/libnccl.so.2
  [ -e "$nccl" ] && LIBS+=":$(dirname "$nccl")" || echo "no libnccl.so.2 on this machine"
elif [ -z "${BIN:-}" ]; then
  step build
  BIN=build/gpu-quick
  cmake -S . -B $BIN -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/configure.log" 2>&1 &&
    cmake --build $BIN -j "${JOBS:-$(nproc)}" --target flashserve flashserve_c test_gpu \
      test_model_gpu bench_sm90 >"$OUT/build.log" 2>&1 ||
    { tail -n 60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
fi
# flashserve and test_model_gpu link more than CUDA: run them with the carried libraries.
WITH_LIBS=(env "LD_LIBRARY_PATH=${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
FS=("${WITH_LIBS[@]}" "$BIN/src/flashserve")
export PYTHONPATH=$PWD/python FLASHSERVE_LIBRARY=$PWD/$BIN/src/libflashserve_c.so
[ -f "$FLASHSERVE_LIBRARY" ] || export FLASHSERVE_LIBRARY=$BIN/src/libflashserve_c.so
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -m1 'Model name'
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"

step "engine on the CUDA runner: the main job (sarathi beside vllm, tiny model)"
run_step engine_run 90 "${FS[@]}" run --device cuda

step "flashserve serve on the CUDA runner with and without prefix caching (tiny model)"
printf '#!/bin/sh\nexec env LD_LIBRARY_PATH="%s" "%s" "$@"\n' "${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$(realpath "$BIN/src/flashserve")" >"$OUT/flashserve.sh" && chmod +x "$OUT/flashserve.sh"
run_step prefix_cache 120 bash scripts/prefix-cache-check.sh "$OUT/flashserve.sh" --device cuda \
  --gpu-memory-utilization 0.3

step "GPU tests: every attention test (8 shards at once: the float64 reference is the cost), the model's"
gpu_tests() {
  local rc=0 i pids=()
  for i in 0 1 2 3 4 5 6 7; do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i "$BIN/tests/test_gpu" --gtest_brief=1 >"$OUT/test_gpu.$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  cat "$OUT"/test_gpu.*.log | grep -E "FAILED|Failure|PASSED|tests ran" | sort | uniq -c
  return $rc
}
export BIN OUT
export -f gpu_tests
run_step gpu_tests 240 bash -c gpu_tests  # timeout runs programs, not shell functions
run_step model_gpu 90 "${WITH_LIBS[@]}" "$BIN/tests/test_model_gpu" --gtest_brief=1
# The server through a real device fault in a step: its own process (the fault is sticky).
[ -x "$BIN/tests/test_server_gpu" ] &&
  run_step server_fault 120 "${WITH_LIBS[@]}" "$BIN/tests/test_server_gpu" --gtest_brief=1

step "SASS: HGMMA instructions in the binary (0: no wgmma)"
cuobjdump -sass "$BIN/tests/test_gpu" 2>/dev/null | grep -c HGMMA

step "bench_sm90 (d128 bf16, 16k tokens: sm80 beside sm90)"
run_step bench_sm90 60 "$BIN/bench/bench_sm90" --seqlens 4096,8192 --iters 20

step "Python: host cost per call, eager vs graph, decode defaults"
run_step host_cost 75 python3 bench/python_host_cost.py

if [ -f bench/cpu_sdpa_compare.py ]; then
  step "CPU path beside PyTorch's CPU SDPA"
  run_step cpu_sdpa 60 python3 bench/cpu_sdpa_compare.py
fi

step "profile the mistral-7b shape on the CUDA runner, then bench-serve beside the calibrated simulator"
run_step profile 60 "${FS[@]}" profile --shape mistral-7b --device cuda --out "$OUT/profile-m7b.csv"
calibrated=()
[ -s "$OUT/profile-m7b.csv" ] && calibrated=(--profile "$OUT/profile-m7b.csv")
for policy in sarathi vllm; do
  run_step "serve_$policy" 60 "${FS[@]}" bench-serve --shape mistral-7b --device cuda \
    --workload sharegpt --rate 2 --requests 32 --policy $policy --budget 512 \
    --max-model-len 8192 "${calibrated[@]}" --predict-gpu h200
done

step "PyTorch tests on the GPU (operators, torch.compile, CUDA graphs, kvcache)"
run_step torch_tests 90 python3 -m pytest -q -x python/tests/test_gpu_torch.py \
  python/tests/test_gpu_torch_ops.py

step "compute-sanitizer memcheck and racecheck: the small *Sanitize* cases of every kernel"
for tool in memcheck racecheck; do
  run_step $tool 90 compute-sanitizer --tool $tool --error-exitcode 99 \
    "$BIN/tests/test_gpu" --gtest_filter='*Sanitize*' --gtest_brief=1
done

echo
echo "== summary (${SECONDS}s)"
for k in engine_run prefix_cache gpu_tests model_gpu server_fault bench_sm90 host_cost cpu_sdpa \
  profile serve_sarathi serve_vllm torch_tests memcheck racecheck; do
  printf '%-14s %s\n' "$k" "${result[$k]:-not run}"
done
