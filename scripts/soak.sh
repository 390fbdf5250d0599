#!/usr/bin/env bash
# The server's soak test on the CPU: `flashserve serve` on a tiny random checkpoint under Poisson
# streams with random aborts, malformed and oversized requests, stalled sockets and bursts past the
# concurrency bound (tests/server/client/soak.mjs says what is checked), then SIGTERM: exit 0.
#
#   bash scripts/soak.sh [SECONDS] [FLASHSERVE]     # default 1800 s, build/release/src/flashserve
#   SOAK_HEALTH_P99_MS=500 bash scripts/soak.sh 180 # CI (scripts/test.sh runs this)
#
# The /health bound: 50 ms p99 by default (the issue's figure, for a run on a quiet machine).
# CI runs the 3-minute version with 500 ms: on a loaded 2-core CI box the probes share the two
# cores with the build's other tests, the engine's steps and the load itself, and a pass must not
# depend on the machine's speed (the event loop answers /health in well under a millisecond when
# it is not starved of CPU). Everything else checked does not depend on time.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-1800}
bin=${2:-build/release/src/flashserve}
health_p99_ms=${SOAK_HEALTH_P99_MS:-50}
heap_growth_kib=${SOAK_HEAP_GROWTH_KIB:-256}
max_concurrent=16
command -v node >/dev/null || { echo "soak: needs node (apt-get install nodejs)"; exit 1; }
[ -x "$bin" ] || { echo "soak: no flashserve at $bin (build it, or give its path)"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/flashserve-soak.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "soak: FAIL: $*"; echo "--- server log"; tail -20 "$work/server.log" 2>/dev/null; exit 1; }
source scripts/await_server.sh  # the working directory is the repository root (above)

"$bin" make-checkpoint --shape tiny --out "$work/tiny" >/dev/null
: >"$work/server.log"
# One malloc arena and no per-thread caches: the heap in use (/metrics) is then what the requests
# left behind, to the byte (as in tests/server/server_test.sh). Short header and keep-alive
# deadlines, so that the stalled sockets are closed within the run.
MALLOC_ARENA_MAX=1 GLIBC_TUNABLES=glibc.malloc.tcache_count=0 "$bin" serve --model "$work/tiny" \
  --port 0 --served-model-name tiny --kv-memory-mb 32 --max-concurrent-requests "$max_concurrent" \
  --http-header-timeout 2 --http-keep-alive-timeout 2 >"$work/server.log" 2>&1 &
server_pid=$!
await_server "$server_pid" "$work/server.log"
echo "soak: ${seconds} s on $base (/health p99 bound ${health_p99_ms} ms, heap growth bound ${heap_growth_kib} KiB)"
node tests/server/client/soak.mjs "$base" tiny "$seconds" "$max_concurrent" "$health_p99_ms" \
  "$heap_growth_kib" || fail "the soak's checks"
kill -0 "$server_pid" || fail "the server died"
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
[ "$status" = 0 ] || fail "SIGTERM: exit status $status"
echo "soak: ok (SIGTERM: exit 0)"
