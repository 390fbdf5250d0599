#!/usr/bin/env bash
# Nsight Compute on prefill shapes, ours (bench_attn) and PyTorch's flash backend (sdpa_compare.py)
# one after the other, on the GPU machine: where a kernel's time goes (pipe utilisation, shared
# memory and L2 throughput, warp stall reasons) to compare with FA2 before changing a tile.
#   bash scripts/ncu-attn.sh [--head-dims 256] [--seqlens 512,8192] [--causal 0]
# Environment: OUT (default ./out), ARCHS (default 90a). Writes $OUT/ncu-<who>-d<D>-s<S>-c<C>.txt
# and prints a digest of each. --clock-control none: the device's clocks are left alone.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=build/gpu
dims=256 seqlens=512,8192 causal=0
while (($#)); do
  case "$1" in
    --head-dims) dims=$2; shift ;;
    --seqlens) seqlens=$2; shift ;;
    --causal) causal=$2; shift ;;
    *) echo "ncu-attn: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if ! { cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS="${ARCHS:-90a}" \
         >"$OUT/ncu-configure.log" 2>&1 &&
       cmake --build $BUILD -j "$(nproc)" --target bench_attn >"$OUT/ncu-build.log" 2>&1; }; then
  tail -30 "$OUT/ncu-build.log"
  exit 1
fi
ncu_args=(--clock-control none --launch-skip 2 --launch-count 1 --print-details all
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section WarpStateStats --section SchedulerStats --section Occupancy)
digest='Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc Active|Issue Slots Busy|SM Busy|Shared Memory|Tensor|L2 Hit Rate|Bank|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers Per|No Eligible|error|ERR'
for d in ${dims//,/ }; do
  for s in ${seqlens//,/ }; do
    for c in ${causal//,/ }; do
      shape=(--prefill-only --head-dims "$d" --seqlens "$s" --causal "$c" --iters 1 --warmup 2
             --pause-ms 0)
      tag="d$d-s$s-c$c"
      ncu "${ncu_args[@]}" --kernel-name regex:fwd_kernel $BUILD/bench/bench_attn "${shape[@]}" \
        >"$OUT/ncu-ours-$tag.txt" 2>&1
      ncu "${ncu_args[@]}" --kernel-name regex:flash_fwd python3 bench/sdpa_compare.py "${shape[@]}" \
        --csv /dev/null >"$OUT/ncu-flash-$tag.txt" 2>&1
      for who in ours flash; do
        echo "==== $who $tag"
        grep -E "$digest" "$OUT/ncu-$who-$tag.txt" | sed 's/  */ /g' | head -60
      done
    done
  done
done
