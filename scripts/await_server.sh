# Sourced by the scripts that start `flashserve serve --port 0` in the background (scripts/soak.sh,
# scripts/flood.sh, tests/server/server_test.sh): await_server PID LOG waits until the server
# says in LOG where it listens and answers /health, and sets `port` and `base`. Uses the caller's
# fail() for a server that exits or never says where it listens.
await_server() {
  local pid=$1 log=$2
  port=""
  for _ in $(seq 200); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "the server exited"
    sleep 0.05
  done
  [ -n "$port" ] || fail "the server did not say where it listens"
  base=http://127.0.0.1:$port
  for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health")" = 200 ] && break
    sleep 0.05
  done
}
