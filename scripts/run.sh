#!/usr/bin/env bash
# The main job: builds flashserve and runs `flashserve run` (the engine on a tiny random model,
# sarathi against vllm-v1 and vllm-v0, measured; on the GPU when there is one, else the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build/release}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_TESTS=OFF ${CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)" --target flashserve
"$BUILD/src/flashserve" "${@:-run}"
