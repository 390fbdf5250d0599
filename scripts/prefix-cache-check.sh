#!/usr/bin/env bash
# Prefix caching through `flashserve serve`, end to end: two servers on one random checkpoint, one
# with prefix caching (the default) and one without, get the same greedy requests: prompts that
# share a long prefix (a "system prompt"), each sent twice. Prints, per request, whether the two
# servers' tokens are equal, and the caching server's prefix-cache hits. bf16 on the GPU: a cached
# prefix is attended in another batch shape than a computed one, so a near-tie may flip a token
# (the CPU engine test compares against the run alone with a near-tie tolerance).
#   bash scripts/prefix-cache-check.sh FLASHSERVE [--device cuda] [--kv-memory-mb N]
set -euo pipefail
fs=("$1")
shift
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
"${fs[@]}" make-checkpoint --shape tiny --out "$work/tiny" --seed 3 >/dev/null
start() {  # start NAME ARGS...: a server on a free port; its URL goes to $work/NAME.url
  local name=$1 port=""
  shift
  "${fs[@]}" serve --model "$work/tiny" --port 0 --served-model-name tiny "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/$name.log")
    [ -n "$port" ] && grep -q ready "$work/$name.log" && break
    sleep 0.1
  done
  grep -q ready "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
  echo "http://127.0.0.1:$port" >"$work/$name.url"
}
start cached "$@"
start plain --no-enable-prefix-caching "$@"
cached=$(cat "$work/cached.url") plain=$(cat "$work/plain.url")
python3 - "$cached" "$plain" <<'PY'
import json, random, sys, urllib.request
cached, plain = sys.argv[1], sys.argv[2]
def post(base, prompt):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["token_ids"]
def metric(base, name):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    return float(next(l.split()[1] for l in text.splitlines() if l.startswith(name + " ")))
rng = random.Random(11)
system = [rng.randrange(3, 1000) for _ in range(160)]
prompts = [system + [rng.randrange(3, 1000) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
equal = 0
for i, p in enumerate(prompts * 2):  # each twice: the second time its own blocks are cached too
    a, b = post(cached, p), post(plain, p)
    equal += a == b
    print(f"request {i:2d} ({len(p)} prompt tokens): {'equal' if a == b else 'DIFFERENT'}"
          + ("" if a == b else f"\n  cached {a}\n  plain  {b}"))
hits, queries = metric(cached, "flashserve_prefix_cache_hits_total"), metric(cached, "flashserve_prefix_cache_queries_total")
print(f"prefix cache: {hits:.0f} of {queries:.0f} looked-up prompt tokens found; the plain server: "
      f"{metric(plain, 'flashserve_prefix_cache_hits_total'):.0f}")
print(f"tokens equal with and without prefix caching: {equal} of {len(prompts) * 2} requests")
sys.exit(0 if hits >= 160 * 10 and equal >= len(prompts) * 2 - 1 else 1)
PY
