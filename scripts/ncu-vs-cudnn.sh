#!/usr/bin/env bash
# Nsight Compute on our sm90 forward kernel (bench_attn, default dispatch) and on cuDNN's
# (PyTorch SDPA, cuDNN backend) at the same shape, side by side: launch configuration (grid,
# block, registers, shared memory, waves: is it persistent, how many CTAs per SM), occupancy,
# speed of light, tensor pipe, warp stall reasons. For the short-sequence gap of issue 19.
# Usage (GPU machine, binaries unpacked by sm90-check.sh into /tmp/fsbin):
#   OUT=$OUT SHAPES="128:512:0 64:512:1" bash scripts/ncu-vs-cudnn.sh
# SOURCE=1 also writes our kernel's warp-state samples per SASS instruction
# ($OUT/ncu-ours-...-source.csv, ncu's source page) and prints the 25 hottest instructions.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
BIN=${BIN:-/tmp/fsbin}
mkdir -p "$OUT"
sections="--section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
digest='Grid Size|Block Size|Registers Per|Shared Memory Config|Dynamic Shared|Waves Per SM|Achieved Occupancy|Theoretical Occupancy|Block Limit|Duration|SM Frequency|Compute \(SM\) Throughput|Tensor|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Cache Throughput|DRAM Throughput|Mem Pipes'
for shape in ${SHAPES:-128:512:0}; do
  IFS=: read -r d sl c <<<"$shape"
  echo "== ours, d$d seqlen $sl causal $c"
  timeout 120 ncu --clock-control none --kernel-name regex:fwd_kernel --launch-skip 2 --launch-count 1 \
    $sections --print-details all "$BIN/bench/bench_attn" --prefill-only --head-dims "$d" --seqlens "$sl" \
    --causal "$c" --iters 1 --warmup 2 --pause-ms 0 > "$OUT/ncu-ours-d$d-s$sl-c$c.txt" 2>&1
  grep -E "$digest" "$OUT/ncu-ours-d$d-s$sl-c$c.txt" | sed 's/  */ /g' | head -60
  if [ "${SOURCE:-0}" = 1 ]; then
    src="$OUT/ncu-ours-d$d-s$sl-c$c-source"
    timeout 150 ncu --clock-control none --kernel-name regex:fwd_kernel --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats -o "$src" "$BIN/bench/bench_attn" --prefill-only \
      --head-dims "$d" --seqlens "$sl" --causal "$c" --iters 1 --warmup 2 --pause-ms 0 > /dev/null 2>&1
    ncu --import "$src.ncu-rep" --page source --csv --print-source sass > "$src.csv" 2>&1
    echo "-- hottest SASS instructions (warp-state samples), d$d seqlen $sl causal $c"
    python3 - "$src.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
if head is None:
    print("no sampling columns in", sys.argv[1]); print("\n".join(",".join(r) for r in rows[:5])); sys.exit()
h = rows[head]
col = next(i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All"))
src = next((i for i, c in enumerate(h) if c == "Source"), 1)
data = [r for r in rows[head + 1:] if len(r) > col]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
total = sum(num(r[col]) for r in data) or 1
for r in sorted(data, key=lambda r: -num(r[col]))[:25]:
    print(f"{100 * num(r[col]) / total:5.1f}%  {r[src][:110]}")
PY
  fi
  echo "== cuDNN (SDPA), d$d seqlen $sl causal $c"
  timeout 120 ncu --clock-control none --kernel-name regex:'cudnn|sm90|fmha|flash' --launch-skip 2 \
    --launch-count 1 $sections --print-details all env -u LD_LIBRARY_PATH python3 -c "
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
d, L, c = $d, $sl, bool($c)
h = 2048 // d; b = 16384 // L
q, k, v = (torch.randn(b, h, L, d, device='cuda', dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(4):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c)
torch.cuda.synchronize()
" > "$OUT/ncu-cudnn-d$d-s$sl-c$c.txt" 2>&1
  grep -E "Function Name|  [a-z_0-9]*cudnn|^  [a-zA-Z_]" "$OUT/ncu-cudnn-d$d-s$sl-c$c.txt" | head -3
  grep -E "$digest" "$OUT/ncu-cudnn-d$d-s$sl-c$c.txt" | sed 's/  */ /g' | head -60
done
