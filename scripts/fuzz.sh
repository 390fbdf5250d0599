#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/) for SECONDS each (default 300; CI runs 20), ASan + UBSan,
# starting from the checked-in seeds and the regressions of past crashes:
#   bash scripts/fuzz.sh [SECONDS]
# A crash leaves its input in build/fuzz/artifacts/<target>-crash-*; reproduce it with
#   build/fuzz/fuzz/fuzz_<target> build/fuzz/artifacts/<target>-crash-...
# then fix it and keep the input as a regression: copy it into fuzz/regressions/<target>/ (every
# build replays that folder under ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-300}
JOBS=${JOBS:-$(nproc)}
bash scripts/deps.sh
cmake --preset fuzz -DFLASHSERVE_FUZZ_SECONDS="$SECONDS_EACH" >/dev/null
cmake --build --preset fuzz -j "$JOBS" --target fuzz_all
ctest --preset fuzz -j "$JOBS" -L fuzz
