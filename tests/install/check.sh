#!/usr/bin/env bash
# The two installs on a built tree (scripts/test.sh runs it after the tests):
#   1. cmake --install of BUILD into a temporary prefix, which is then moved (the installed tree
#      must not depend on where it was installed): the executable finds its data beside itself and
#      reports the project's version; this folder's downstream project builds against the moved
#      prefix with find_package(flashserve) and, separately, main.cc with pkg-config; both run.
#   2. pip install of the checkout into a fresh venv (reusing BUILD's library, no network), and a
#      flash_attn_func call from a folder outside the checkout (tests/install/check.py).
# The programs run with CUDA_VISIBLE_DEVICES= as well: a CUDA build's targets must work on a
# machine without a GPU.
# Usage: tests/install/check.sh BUILD_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d /tmp/flashserve-install.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "install check: FAIL: $*" >&2; exit 1; }
# The one version (CMakeLists.txt's project(VERSION)) everything installed must report.
VERSION=$(sed -n 's/^project(flashserve VERSION \([0-9][0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
[ -n "$VERSION" ] || fail "no project(flashserve VERSION ...) in $ROOT/CMakeLists.txt"
# Nothing from the environment may point the installed things back at the build.
unset FLASHSERVE_DATA_DIR FLASHSERVE_LIBRARY PYTHONPATH

echo "== cmake --install $BUILD (flashserve $VERSION)"
cmake --install "$BUILD" --prefix "$WORK/staged" >/dev/null
mv "$WORK/staged" "$WORK/prefix"
PREFIX=$WORK/prefix
got=$("$PREFIX/bin/flashserve" --version)
[ "$got" = "flashserve $VERSION" ] || fail "flashserve --version says '$got', expected 'flashserve $VERSION'"
got=$("$PREFIX/bin/flashserve" --data-dir)
[ "$got" = "$PREFIX/share/flashserve" ] || fail "the moved flashserve reads its data from '$got', not $PREFIX/share/flashserve"
"$PREFIX/bin/flashserve" simulate --workload sharegpt --policy vllm --requests 50 >/dev/null ||
  fail "the installed flashserve cannot run --workload sharegpt"

echo "== downstream project: find_package(flashserve) from $PREFIX"
cmake -S "$ROOT/tests/install" -B "$WORK/downstream" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" >"$WORK/downstream.log" 2>&1 || { cat "$WORK/downstream.log"; fail "configure"; }
grep "flashserve $VERSION from $PREFIX/" "$WORK/downstream.log" ||
  fail "find_package did not take flashserve $VERSION from $PREFIX (see above)"
cmake --build "$WORK/downstream" -j "$JOBS" >"$WORK/downstream-build.log" 2>&1 ||
  { cat "$WORK/downstream-build.log"; fail "the downstream project does not build"; }

echo "== downstream program: pkg-config flashserve from $PREFIX"
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
got=$(pkg-config --modversion flashserve)
[ "$got" = "$VERSION" ] || fail "pkg-config --modversion flashserve says '$got'"
# shellcheck disable=SC2046  # pkg-config's flags are words
c++ -std=c++20 -O2 "$ROOT/tests/install/main.cc" -o "$WORK/attention_check_pc" \
  $(pkg-config --cflags --libs flashserve)

for gpus in unchanged none; do
  if [ $gpus = none ]; then export CUDA_VISIBLE_DEVICES=; else unset CUDA_VISIBLE_DEVICES; fi
  for exe in downstream/attention_check downstream/c_api_check attention_check_pc; do
    out=$("$WORK/$exe") || fail "$exe (GPUs: $gpus): $out"
    echo "$exe (GPUs: $gpus): $out"
    case $out in *"flashserve $VERSION"*) ;; *) fail "$exe does not report version $VERSION" ;; esac
  done
done
unset CUDA_VISIBLE_DEVICES

echo "== pip install into a fresh venv"
# --system-site-packages: Debian's setuptools, wheel and numpy (no network: --no-index);
# FLASHSERVE_BUILD_DIR: setup.py builds flashserve_c in BUILD, which is up to date.
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
FLASHSERVE_BUILD_DIR=$BUILD FLASHSERVE_JOBS=$JOBS "$WORK/venv/bin/python" -m pip install -q \
  --no-build-isolation --no-index --no-cache-dir "$ROOT" || fail "pip install"
got=$("$WORK/venv/bin/python" -m pip show flashserve | sed -n 's/^Version: //p')
[ "$got" = "$VERSION" ] || fail "the installed wheel's metadata says version '$got'"
# Run from outside the checkout, the script too (a script's folder is first on sys.path).
cp "$ROOT/tests/install/check.py" "$WORK/check.py"
SITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
for gpus in unchanged none; do
  if [ $gpus = none ]; then export CUDA_VISIBLE_DEVICES=; else unset CUDA_VISIBLE_DEVICES; fi
  (cd /tmp && "$WORK/venv/bin/python" "$WORK/check.py" "$VERSION" "$SITE") ||
    fail "the pip-installed package (GPUs: $gpus)"
done
echo "install check: ok (cmake --install, find_package, pkg-config, pip, all at $VERSION)"
