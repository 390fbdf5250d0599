#!/usr/bin/env bash
# Issue 21's measured capacity, one policy per device call (a probe of >= 1000 requests runs for
# minutes: 1000 requests at 7 req/s is 143 s of arrivals before the drain). On the mistral-7b shape
# (random weights made on the device), the ShareGPT trace:
#   1. `flashserve profile` (skipped when $PROFILE names a table from an earlier call, carried);
#   2. `bench-serve --capacity`: the calibrated simulator's bisection on the same requests, pool
#      and max_model_len, then the engine measured just below and just above the predicted
#      capacity (--confirm-margin), each probe >= MIN_REQUESTS requests, the P50 scheduling-delay
#      bound beside each SLO.
# Logs and the profile under $OUT.
#
#   POLICY=sarathi SLO=strict BIN_TAR=.xfer/cap.tar.xz OUT=... bash scripts/capacity-gpu-check.sh
# The binary travels compressed, built here for 90a:
#   cmake --build build/dev90 -j2 --target flashserve
#   BINARIES="src/flashserve" bash scripts/gpu-quick.sh --pack build/dev90 .xfer/cap.tar.xz
# Environment: POLICY (sarathi | vllm-v1 | vllm-v0), SLO (strict, relaxed, seconds or a list),
# BUDGET (the policy's default when unset), WORKLOAD (sharegpt), MIN_REQUESTS (1000), SEED (0),
# MAX_MODEL_LEN (8192), PROFILE (a profile CSV to reuse), MARGIN (0.1).
# Expected time on one H200: profile 25-40 s; each probe (requests / rate) + the drain: sarathi
# at ~7 req/s ~2.5 min a probe, vllm-v0 at ~3 req/s ~5.5 min (run it alone, SLO one value).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/capacity-${POLICY:-sarathi}.log") 2>&1
BIN=${BIN:-/tmp/fsbin-cap}
mkdir -p "$BIN" && xz -dc "${BIN_TAR:?BIN_TAR names the packed flashserve binary}" |
  tar -C "$BIN" -xf - || { echo "unpack failed"; exit 1; }
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
FS=$BIN/src/flashserve
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

PROFILE=${PROFILE:-}
if [ -z "$PROFILE" ]; then
  echo "== profile: mistral-7b shape on the CUDA runner ($(date -u +%T))"
  PROFILE=$OUT/profile-m7b.csv
  timeout 120 "$FS" profile --shape mistral-7b --device cuda --out "$PROFILE" \
    --max-len "${MAX_MODEL_LEN:-8192}" >"$OUT/profile.txt" 2>&1 ||
    { tail -20 "$OUT/profile.txt"; echo "PROFILE FAILED"; exit 1; }
fi

POLICY=${POLICY:-sarathi}
echo "== capacity: $POLICY, ${WORKLOAD:-sharegpt}, SLO ${SLO:-strict} ($(date -u +%T))"
args=(--shape mistral-7b --device cuda --workload "${WORKLOAD:-sharegpt}" --policy "$POLICY"
  --capacity --slo-tbt "${SLO:-strict}" --min-requests "${MIN_REQUESTS:-1000}"
  --requests "${MIN_REQUESTS:-1000}" --seed "${SEED:-0}" --max-model-len "${MAX_MODEL_LEN:-8192}"
  --confirm-margin "${MARGIN:-0.1}" --profile "$PROFILE")
[ -n "${BUDGET:-}" ] && args+=(--budget "$BUDGET")
"$FS" bench-serve "${args[@]}" 2>&1
rc=$?
echo "== done rc=$rc ($(date -u +%T), ${SECONDS}s)"
exit $rc
