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
# Without a GPU the GPU tests are reported as skipped above; say why, in the tests' own words.
if [ -x "$BUILD/tests/test_gpu" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "GPU tests: $("$BUILD/tests/test_gpu" --gtest_filter='GpuErrors.*' | grep -m1 -o 'skipped: no CUDA device')"
fi
# The installs: INSTALL_CHECK=0 skips them (a build configured without the flashserve executable
# or libflashserve_c.so, e.g. through CMAKE_ARGS).
if [ "${INSTALL_CHECK:-1}" != 0 ]; then
  JOBS=$JOBS bash tests/install/check.sh "$BUILD"
fi
