#!/usr/bin/env bash
# The connection-flood check: `flashserve serve` on a tiny random checkpoint holds CONNECTIONS
# stalled sockets (half a request each) while /health and a streamed completion are timed (p99
# over 100 probes each, under BOUND_MS), and closes every one of them at its header deadline
# (tests/server/client/flood.mjs).
#
#   bash scripts/flood.sh [CONNECTIONS] [BOUND_MS] [FLASHSERVE]   # default 10000 100
#   bash scripts/flood.sh 1000 1000                               # CI (scripts/test.sh)
#
# CI's bound is ten times the issue's 100 ms: its 2 cores are shared with other tests, and a pass
# must not depend on the machine's speed. The descriptor soft limit is raised to the hard one (the
# client needs one per socket, and so does the server, which raises its own); past it, the count
# is cut to what fits.
set -euo pipefail
cd "$(dirname "$0")/.."
connections=${1:-10000}
bound_ms=${2:-100}
bin=${3:-build/release/src/flashserve}
header_timeout=${FLOOD_HEADER_TIMEOUT:-30}
command -v node >/dev/null || { echo "flood: needs node (apt-get install nodejs)"; exit 1; }
[ -x "$bin" ] || { echo "flood: no flashserve at $bin (build it, or give its path)"; exit 1; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
room=$(( $(ulimit -n) - 256 ))
if [ "$connections" -gt "$room" ]; then
  echo "flood: ulimit -n is $(ulimit -n): $room connections instead of $connections"
  connections=$room
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/flashserve-flood.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "flood: FAIL: $*"; echo "--- server log"; tail -20 "$work/server.log" 2>/dev/null; exit 1; }
source scripts/await_server.sh  # the working directory is the repository root (above)

"$bin" make-checkpoint --shape tiny --out "$work/tiny" >/dev/null
: >"$work/server.log"
"$bin" serve --model "$work/tiny" --port 0 --served-model-name tiny --kv-memory-mb 32 \
  --max-connections $((connections + 1000)) --http-header-timeout "$header_timeout" \
  >"$work/server.log" 2>&1 &
server_pid=$!
await_server "$server_pid" "$work/server.log"
echo "flood: $connections stalled connections on $base (p99 bound $bound_ms ms, header deadline ${header_timeout} s)"
node tests/server/client/flood.mjs "$base" tiny "$connections" "$header_timeout" "$bound_ms" \
  "$server_pid" || fail "the flood's checks"
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
[ "$status" = 0 ] || fail "SIGTERM: exit status $status"
echo "flood: ok"
