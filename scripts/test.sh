#!/usr/bin/env bash
# Builds everything and runs the whole test suite (CPU tests; GPU tests run where there is a device
# and otherwise print "skipped: no CUDA device"; the Python package's tests on the CPU path), then
# both installs of that build (tests/install/check.sh: cmake --install + a downstream project with
# find_package and pkg-config, pip install into a fresh venv; under a minute once built).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build/release}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=/usr/bin/python3 \
  ${FLASHSERVE_CUDA_ARCHS:+-DFLASHSERVE_CUDA_ARCHS="$FLASHSERVE_CUDA_ARCHS"} ${CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" ${CTEST_ARGS:-}
# The server under a 3-minute soak and a flood of 1000 stalled connections, with CI's generous
# latency bounds (each script says why); the 30-minute soak and the 10,000-connection flood are
# `bash scripts/soak.sh` and `bash scripts/flood.sh`. They need node, as the server's tests do.
if [ -x "$BUILD/src/flashserve" ] && command -v node >/dev/null; then
  SOAK_HEALTH_P99_MS=500 bash scripts/soak.sh 180 "$BUILD/src/flashserve"
  FLOOD_HEADER_TIMEOUT=10 bash scripts/flood.sh 1000 1000 "$BUILD/src/flashserve"
else
  echo "soak and flood: skipped (no $BUILD/src/flashserve or no node)"
fi
# Without a GPU the GPU tests are reported as skipped above; say why, in the tests' own words.
if [ -x "$BUILD/tests/test_gpu" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "GPU tests: $("$BUILD/tests/test_gpu" --gtest_filter='GpuErrors.*' | grep -m1 -o 'skipped: no CUDA device')"
fi
# The installs: INSTALL_CHECK=0 skips them (a build configured without the flashserve executable
# or libflashserve_c.so, e.g. through CMAKE_ARGS).
if [ "${INSTALL_CHECK:-1}" != 0 ]; then
  JOBS=$JOBS bash tests/install/check.sh "$BUILD"
fi
