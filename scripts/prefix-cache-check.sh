#!/usr/bin/env bash
# Prefix caching through `flashserve serve`, end to end: the same greedy requests (prompts that
# share a long "system prompt", each sent twice) go to a server without prefix caching, then to one
# with it (the default), one after the other on one random checkpoint. Prints, per request, whether
# the two servers' tokens are equal, and the caching server's prefix-cache hits. In bf16 on the
# GPU a cached prefix is attended in another batch shape than a computed one, so a near-tie may
# flip a token (the CPU engine test compares against the run alone with a near-tie tolerance).
#   bash scripts/prefix-cache-check.sh FLASHSERVE [serve options: --device cuda ...]
set -euo pipefail
fs=("$1")
shift
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
"${fs[@]}" make-checkpoint --shape tiny --out "$work/tiny" --seed 3 >/dev/null
serve() {  # serve NAME ARGS...: a server on a free port, until the next one; its URL in $url
  [ -n "$pid" ] && { kill "$pid"; wait "$pid" 2>/dev/null || true; }
  local name=$1 port=""
  shift
  "${fs[@]}" serve --model "$work/tiny" --port 0 --served-model-name tiny "$@" >"$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -q ready "$work/$name.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q ready "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/$name.log")
  url="http://127.0.0.1:$port"
}
client() {  # client URL OUT.json [BASELINE.json]
  python3 - "$@" <<'PY'
import json, random, sys, urllib.request
base, out = sys.argv[1], sys.argv[2]
def post(prompt):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["token_ids"]
def metric(name):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    return float(next(l.split()[1] for l in text.splitlines() if l.startswith(name + " ")))
rng = random.Random(11)
system = [rng.randrange(3, 1000) for _ in range(160)]
prompts = [system + [rng.randrange(3, 1000) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
got = [post(p) for p in prompts * 2]  # each twice: the second time its own blocks are cached too
hits, queries = metric("flashserve_prefix_cache_hits_total"), metric("flashserve_prefix_cache_queries_total")
json.dump({"tokens": got, "hits": hits}, open(out, "w"))
if len(sys.argv) > 3:
    plain = json.load(open(sys.argv[3]))
    equal = sum(a == b for a, b in zip(got, plain["tokens"]))
    for i, (a, b) in enumerate(zip(got, plain["tokens"])):
        if a != b: print(f"request {i}: DIFFERENT\n  cached {a}\n  plain  {b}")
    print(f"prefix cache: {hits:.0f} of {queries:.0f} looked-up prompt tokens found (without "
          f"caching: {plain['hits']:.0f})")
    print(f"tokens equal with and without prefix caching: {equal} of {len(got)} requests")
    sys.exit(0 if hits >= 160 * 10 and plain["hits"] == 0 and equal >= len(got) - 1 else 1)
PY
}
serve plain --no-enable-prefix-caching "$@"
client "$url" "$work/plain.json"
serve cached "$@"
client "$url" "$work/cached.json" "$work/plain.json"
