#!/usr/bin/env bash
# The load test of issue 12's "Done when", one call on the GPU machine: the random Mistral-7B
# checkpoint, first the engine alone (bench-serve, no HTTP) at RATE requests/s of fixed-length
# requests, then `flashserve serve` with the same requests as streaming HTTP clients for SECONDS
# (tests/server/client/load.mjs, Poisson arrivals), printing both P99 TBTs side by side and the
# server's resident memory every 10 s. RATE should be 80% of the engine's measured capacity
# (issue 11's bench-serve/simulate --capacity result for this workload). Needs node (any >= 18).
#   OUT=... bash scripts/server-load-check.sh RATE [SECONDS=300] [PROMPT_LEN=512] [OUTPUT_LEN=128]
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 RATE [SECONDS] [PROMPT_LEN] [OUTPUT_LEN]"; exit 2; }
rate=$1 seconds=${2:-300} plen=${3:-512} olen=${4:-128}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=build/gpu
FS=$BUILD/src/flashserve
{ cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA_ARCHS=90a -DFLASHSERVE_TESTS=OFF &&
  cmake --build $BUILD -j "${JOBS:-16}" --target flashserve; } >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
M7B=/tmp/mistral-7b-random
[ -f $M7B/config.json ] || $FS make-checkpoint --shape mistral-7b --out $M7B | tee "$OUT/checkpoint.txt"
requests=$(awk -v r="$rate" -v s="$seconds" 'BEGIN { printf "%d", r * s }')

echo "== the engine alone: $requests requests at $rate req/s, prompt $plen, output $olen"
$FS bench-serve --model $M7B --device cuda --workload fixed --prompt-len "$plen" \
  --output-len "$olen" --rate "$rate" --requests "$requests" --policy sarathi --budget 512 \
  --max-model-len 8192 2>&1 | tee "$OUT/engine-alone.txt"

echo "== over HTTP: flashserve serve, streaming clients for $seconds s"
$FS serve --model $M7B --device cuda --served-model-name m7b --port 0 --budget 512 \
  --max-model-len 8192 >"$OUT/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
port=""
for _ in $(seq 600); do
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$OUT/serve.log")
  [ -n "$port" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break
  sleep 1
done
node tests/server/client/load.mjs "http://127.0.0.1:$port" m7b "$rate" "$seconds" "$plen" "$olen" 2>&1 |
  tee "$OUT/http-load.txt"
curl -s "http://127.0.0.1:$port/metrics" >"$OUT/metrics-after.txt"
echo "== compare: the engine's TBT p99 (engine-alone.txt) against the HTTP clients' (http-load.txt);"
echo "   the issue asks for HTTP within 10% of the engine, and flat RSS after warm-up"
