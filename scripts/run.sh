#!/usr/bin/env bash
# The main job: builds flashserve and runs its default command (works without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build/release}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_TESTS=OFF ${CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)" --target flashserve
"$BUILD/src/flashserve" "${@:-demo}"
