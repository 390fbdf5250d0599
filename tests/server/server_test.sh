#!/usr/bin/env bash
# `flashserve serve` end to end on the tiny random checkpoint, on 127.0.0.1 and a free port:
#   server_test.sh raw    FLASHSERVE CHECKPOINT   curl (SSE framing, hostile bodies) and 200
#                                                 clients hanging up at random (node, no deps)
#   server_test.sh openai FLASHSERVE CHECKPOINT   the official openai npm client (installed here
#                                                 from package-lock.json; exit 77 = skipped when
#                                                 npm or the registry is unavailable)
set -euo pipefail
mode=$1 bin=$2 ckpt=$3
here=$(cd "$(dirname "$0")" && pwd)
client_dir=$here/client
work=$(mktemp -d "${TMPDIR:-/tmp}/flashserve-server-test.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- server log"; tail -20 "$work/server.log" 2>/dev/null; exit 1; }
source "$here/../../scripts/await_server.sh"

if [ "$mode" = openai ]; then
  if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "SKIPPED: openai client tests need node and npm, which this machine lacks"; exit 77
  fi
  if [ ! -f "$client_dir/node_modules/openai/package.json" ] ||
     ! grep -q "\"version\": \"$(node -p "require('$client_dir/package-lock.json').packages['node_modules/openai'].version")\"" \
       "$client_dir/node_modules/openai/package.json"; then
    if ! (cd "$client_dir" && timeout 240 npm ci --no-audit --no-fund --loglevel=error); then
      echo "SKIPPED: npm ci could not install the openai client (registry unreachable?)"; exit 77
    fi
  fi
fi

: >"$work/server.log"  # exists before the server's shell opens it (the loop below reads it)
# One malloc arena and no per-thread caches: glibc then counts a freed block as free at once, so
# the heap in use (/metrics) is what the requests left behind, which hostile_clients.mjs checks.
# (With an arena and a cache per connection thread, both hundreds, that count and the resident
# memory wander by tens of MiB between identical rounds as the caches fill.)
# Started with a vLLM command line (issue 24): the model positional, vLLM's flags where they mean
# something here.
MALLOC_ARENA_MAX=1 GLIBC_TUNABLES=glibc.malloc.tcache_count=0 "$bin" serve "$ckpt" --port 0 \
  --served-model-name tiny tiny-alias --kv-memory-mb 32 --dtype auto --max-num-batched-tokens 512 \
  --enable-chunked-prefill --tensor-parallel-size 1 --disable-log-requests \
  --allowed-origins '["http://ui.example"]' >"$work/server.log" 2>&1 &
server_pid=$!
await_server "$server_pid" "$work/server.log"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health")" = 200 ] || fail "not healthy"
echo "server on $base: $(grep ready "$work/server.log")"

if [ "$mode" = openai ]; then
  node "$client_dir/openai_client.mjs" "$base" tiny || fail "openai client tests"
  exit 0
fi

# expect STATUS PARAM_OR_DASH CURL_ARGS...: the status and, for errors, an OpenAI error body.
checks=0
expect() {
  local want=$1 param=$2; shift 2
  local got
  got=$(curl -s -o "$work/body" -w '%{http_code}' "$@" "$base/v1/completions") || true
  [ "$got" = "$want" ] || fail "want $want, got $got for ${*: -1}: $(head -c 300 "$work/body")"
  if [ "$want" != 200 ]; then
    node -e '
      const e = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).error;
      if (typeof e.message !== "string" || typeof e.type !== "string" || !("code" in e)) process.exit(1);
      if (process.argv[2] !== "-" && !String(e.param).startsWith(process.argv[2])) { console.log(e); process.exit(1); }
    ' "$work/body" "$param" || fail "bad error body for ${*: -1}: $(head -c 300 "$work/body")"
  fi
  checks=$((checks + 1))
}
json=(-H 'Content-Type: application/json')

# Raw SSE framing: only "data: {json}" lines each followed by a blank line, the last "data: [DONE]".
curl -sN "${json[@]}" "$base/v1/completions" -o "$work/sse" \
  -d '{"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}'
node -e '
  const t = require("fs").readFileSync(process.argv[1], "utf8");
  if (!t.endsWith("\n\ndata: [DONE]\n\n")) throw new Error("no [DONE] at the end");
  const events = t.slice(0, -2).split("\n\n");
  let ids = 0, usage = null;
  for (const e of events.slice(0, -1)) {
    if (!e.startsWith("data: ") || e.includes("\n")) throw new Error("bad event: " + JSON.stringify(e));
    const c = JSON.parse(e.slice(6));
    if (c.object !== "text_completion") throw new Error("bad object " + c.object);
    if (c.choices.length) ids += c.choices[0].token_ids.length; else usage = c.usage;
  }
  if (ids !== 5 || !usage || usage.completion_tokens !== 5 || usage.prompt_tokens !== 3)
    throw new Error(`ids ${ids}, usage ${JSON.stringify(usage)}`);
  console.log(`ok   SSE framing: ${events.length} events, 5 tokens, usage, [DONE]`);
' "$work/sse" || fail "SSE framing: $(head -c 500 "$work/sse")"

expect 200 - "${json[@]}" -d '{"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}'
# Malformed, huge, deeply nested and non-UTF-8 bodies.
expect 400 - "${json[@]}" -d '{"model": "tiny", "prompt": [1, 2'
expect 400 - "${json[@]}" -d '[1, 2, 3]'
expect 400 - "${json[@]}" -d ''
printf '{"model": "tiny", "prompt": "\xff\xfe\xc3"}' >"$work/utf8"
expect 400 - "${json[@]}" --data-binary @"$work/utf8"
head -c 9000000 /dev/zero | tr '\0' '[' >"$work/deep"
expect 413 - "${json[@]}" --data-binary @"$work/deep"
expect 413 - "${json[@]}" -H 'Transfer-Encoding: chunked' --data-binary @"$work/deep"
head -c 4000000 /dev/zero | tr '\0' '[' >"$work/deep"
expect 400 - "${json[@]}" --data-binary @"$work/deep"
node -e 'process.stdout.write(JSON.stringify({model: "tiny", prompt: [1], user: "x".repeat(7 << 20)}))' >"$work/big"
expect 200 - "${json[@]}" --data-binary @"$work/big"
# Wrong types and values, unknown fields, prompts past the limit.
expect 400 max_tokens "${json[@]}" -d '{"model": "tiny", "prompt": [1], "max_tokens": "5"}'
expect 400 max_tokens "${json[@]}" -d '{"model": "tiny", "prompt": [1], "max_tokens": -1}'
expect 400 max_tokens "${json[@]}" -d '{"model": "tiny", "prompt": [1], "max_tokens": 99999999999999999999}'
expect 400 max_tokens "${json[@]}" -d '{"model": "tiny", "prompt": [1], "max_tokens": 1000000000}'
expect 400 temperature "${json[@]}" -d '{"model": "tiny", "prompt": [1], "temperature": [0.5]}'
expect 400 stream "${json[@]}" -d '{"model": "tiny", "prompt": [1], "stream": "yes"}'
expect 400 prompt "${json[@]}" -d '{"model": "tiny", "prompt": [1, -4]}'
expect 400 prompt "${json[@]}" -d '{"model": "tiny", "prompt": [1, 99999]}'
# make-checkpoint writes a tokenizer: a text prompt is encoded and the completion decoded.
expect 200 - "${json[@]}" -d '{"model": "tiny", "prompt": "a text prompt", "max_tokens": 3}'
grep -q '"text":' "$work/body" || fail "no text in the completion: $(cat "$work/body")"
expect 400 bogus "${json[@]}" -d '{"model": "tiny", "prompt": [1], "bogus": 1}'
# Prefix caching (on by default): the same 200-token prompt again finds its 12 full blocks in the
# cache, and gives the same greedy tokens as when they were computed.
long=$(node -e 'console.log(JSON.stringify({model: "tiny", prompt: Array.from({length: 200}, (_, i) => 3 + (i * 37) % 1000), max_tokens: 12, temperature: 0, ignore_eos: true}))')
hits_before=$(curl -s "$base/metrics" | sed -n 's/^flashserve_prefix_cache_hits_total //p')
expect 200 - "${json[@]}" -d "$long"
cp "$work/body" "$work/first"
expect 200 - "${json[@]}" -d "$long"
hits_after=$(curl -s "$base/metrics" | sed -n 's/^flashserve_prefix_cache_hits_total //p')
node -e '
  const fs = require("fs");
  const [a, b] = [process.argv[1], process.argv[2]].map((f) => JSON.parse(fs.readFileSync(f, "utf8")));
  if (a.choices[0].token_ids.join() !== b.choices[0].token_ids.join()) throw new Error("cached prefix changed the tokens");
  const hits = Number(process.argv[4]) - Number(process.argv[3]);
  if (!(hits >= 192)) throw new Error(`prefix cache hits ${hits}, want >= 192`);
' "$work/first" "$work/body" "$hits_before" "$hits_after" || fail "prefix caching: $(head -c 300 "$work/body")"
# n choices of a new 200-token prompt: the first is prefilled, the other three take its 12 blocks.
choices=$(node -e 'console.log(JSON.stringify({model: "tiny", prompt: Array.from({length: 200}, (_, i) => 5 + (i * 53) % 1000), max_tokens: 4, n: 4, temperature: 1, seed: 9}))')
expect 200 - "${json[@]}" -d "$choices"
hits_n=$(curl -s "$base/metrics" | sed -n 's/^flashserve_prefix_cache_hits_total //p')
node -e '
  const hits = Number(process.argv[2]) - Number(process.argv[1]);
  if (!(hits >= 3 * 192)) throw new Error(`n choices: prefix cache hits ${hits}, want >= 576`);
' "$hits_after" "$hits_n" || fail "n choices did not share the prompt: $(head -c 300 "$work/body")"
expect 400 n "${json[@]}" -d '{"model": "tiny", "prompt": [1], "n": 129}'
# n sampled choices on the real model: each its own seed (the request's + its index), so they
# differ, and the same seeded request gives the same choices again.
for k in 1 2; do
  expect 200 - "${json[@]}" -d '{"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "n": 3, "temperature": 1, "seed": 11, "ignore_eos": true}'
  cp "$work/body" "$work/choices$k"
done
node -e '
  const fs = require("fs");
  const [a, b] = [process.argv[1], process.argv[2]].map((f) => JSON.parse(fs.readFileSync(f, "utf8")));
  const ids = (r) => r.choices.map((c) => c.token_ids.join(","));
  if (a.choices.length !== 3 || a.choices.some((c, i) => c.index !== i || c.token_ids.length !== 8))
    throw new Error("not 3 choices of 8 tokens: " + JSON.stringify(a));
  if (new Set(ids(a)).size !== 3) throw new Error("sampled choices are equal: " + ids(a));
  if (ids(a).join("|") !== ids(b).join("|")) throw new Error("the same seed gave other choices");
  if (a.usage.completion_tokens !== 24 || a.usage.prompt_tokens !== 3) throw new Error("usage");
' "$work/choices1" "$work/choices2" || fail "n choices: $(head -c 600 "$work/choices1")"
node -e 'process.stdout.write(JSON.stringify({model: "tiny", prompt: Array(5000).fill(7)}))' >"$work/long"
expect 400 prompt "${json[@]}" --data-binary @"$work/long"
grep -q "maximum context length is" "$work/body" || fail "the limit is not named: $(cat "$work/body")"
expect 404 model "${json[@]}" -d '{"model": "gpt-5", "prompt": [1]}'
# Issue 24, what vLLM clients send. cached_tokens: the long prompt above, a third time.
expect 200 - "${json[@]}" -d "$long"
node -e '
  const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  if (!(b.usage.prompt_tokens_details.cached_tokens >= 192)) throw new Error(JSON.stringify(b.usage));
' "$work/body" || fail "cached_tokens: $(head -c 300 "$work/body")"
# No model: the first served name; the second name is served too, and echoed back.
expect 200 - "${json[@]}" -d '{"prompt": [1, 2], "max_tokens": 1}'
grep -q '"model":"tiny"' "$work/body" || fail "no model: $(head -c 300 "$work/body")"
expect 200 - "${json[@]}" -d '{"model": "tiny-alias", "prompt": [1, 2], "max_tokens": 1}'
grep -q '"model":"tiny-alias"' "$work/body" || fail "alias: $(head -c 300 "$work/body")"
# Batched prompts: n choices each, numbered prompt * n + choice; usage counts each prompt once.
expect 200 - "${json[@]}" -d '{"model": "tiny", "prompt": [[1, 2, 3], [4, 5]], "n": 2, "max_tokens": 3, "ignore_eos": true}'
node -e '
  const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  if (b.choices.length !== 4 || b.choices.some((c, i) => c.index !== i || c.token_ids.length !== 3))
    throw new Error("choices");
  if (b.usage.prompt_tokens !== 5 || b.usage.completion_tokens !== 12) throw new Error("usage");
' "$work/body" || fail "batched prompts: $(head -c 600 "$work/body")"
# logit_bias +100 on one token makes greedy choose it every time; echo starts with the prompt.
expect 200 - "${json[@]}" -d '{"model": "tiny", "prompt": "a text prompt", "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logit_bias": {"77": 100}, "echo": true}'
node -e '
  const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).choices[0];
  if (c.token_ids.join() !== "77,77,77,77") throw new Error("logit_bias: " + c.token_ids);
  if (!c.text.startsWith("a text prompt")) throw new Error("echo: " + JSON.stringify(c.text));
' "$work/body" || fail "logit_bias / echo: $(head -c 600 "$work/body")"
expect 400 logit_bias "${json[@]}" -d '{"model": "tiny", "prompt": [1], "logit_bias": {"99999": 1}}'
expect 400 repetition_penalty "${json[@]}" -d '{"model": "tiny", "prompt": [1], "repetition_penalty": 0}'
# /tokenize, /detokenize (vLLM's shapes), /version, vLLM's metric names.
curl -s "${json[@]}" "$base/tokenize" -d '{"prompt": "a text prompt", "return_token_strs": true}' >"$work/tok"
node -e '
  const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  if (t.count !== t.tokens.length || t.token_strs.length !== t.count || !(t.max_model_len > 0))
    throw new Error(JSON.stringify(t));
  console.log(JSON.stringify({tokens: t.tokens}));
' "$work/tok" >"$work/detok_body" || fail "tokenize: $(head -c 300 "$work/tok")"
curl -s "${json[@]}" "$base/detokenize" --data-binary @"$work/detok_body" | grep -q '"prompt":"a text prompt"' ||
  fail "detokenize: $(curl -s "${json[@]}" "$base/detokenize" --data-binary @"$work/detok_body")"
curl -s "$base/version" | grep -q '"version":"' || fail "version"
curl -s "$base/metrics" >"$work/metrics"
for m in 'vllm:num_requests_running{model_name="tiny"} ' 'vllm:num_requests_waiting{model_name="tiny"} ' \
         'vllm:gpu_cache_usage_perc{model_name="tiny"} ' 'vllm:prompt_tokens_total{model_name="tiny"} ' \
         'vllm:generation_tokens_total{model_name="tiny"} ' 'vllm:time_to_first_token_seconds_count{model_name="tiny"} ' \
         'vllm:time_per_output_token_seconds_bucket{model_name="tiny",le="+Inf"} ' \
         'vllm:e2e_request_latency_seconds_sum{model_name="tiny"} '; do
  grep -qF "$m" "$work/metrics" || fail "no metric $m"
done
# CORS for the allowed origin only: preflight, and the header on an answer (an error too).
pre=$(curl -s -o /dev/null -D - -X OPTIONS -H 'Origin: http://ui.example' \
  -H 'Access-Control-Request-Method: POST' "$base/v1/completions")
grep -qi '^access-control-allow-origin: http://ui.example' <<<"$pre" && grep -q ' 204' <<<"$pre" ||
  fail "preflight: $pre"
curl -s -o /dev/null -D "$work/h" -H 'Origin: http://ui.example' "${json[@]}" "$base/v1/completions" -d '{"prompt": 5}'
grep -qi '^access-control-allow-origin: http://ui.example' "$work/h" || fail "CORS on an error: $(cat "$work/h")"
curl -s -o /dev/null -D "$work/h" -H 'Origin: http://evil.example' "$base/v1/models"
! grep -qi '^access-control-allow-origin' "$work/h" || fail "CORS for another origin: $(cat "$work/h")"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/nothing")" = 404 ] || fail "unknown route"
echo "ok   $checks refusals and answers with their status and an OpenAI error body"

node "$client_dir/hostile_clients.mjs" "$base" tiny 200 || fail "hostile clients"
kill -0 "$server_pid" || fail "the server died"

# SIGTERM with a stream in flight: the stream ends with an error event and [DONE], the server
# stops cleanly and exits 0. (It was killed by the signal: threads OpenBLAS starts before main
# did not block it, and the kernel delivered it there.)
curl -sN "${json[@]}" "$base/v1/completions" -o "$work/term" \
  -d '{"model": "tiny", "prompt": [1], "max_tokens": 3000, "ignore_eos": true, "stream": true}' &
curl_pid=$!
for _ in $(seq 200); do [ -s "$work/term" ] && break; sleep 0.05; done
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
[ "$status" = 0 ] || fail "SIGTERM: the server exited with status $status"
grep -q "flashserve serve: stopped" "$work/server.log" || fail "SIGTERM: no clean stop"
wait "$curl_pid" || true
tail -c 16 "$work/term" | grep -q 'data: \[DONE\]' || fail "SIGTERM: the stream did not end: $(tail -c 300 "$work/term")"
grep -q '"code":"engine_stopped"' "$work/term" || fail "SIGTERM: the stream has no error event"
echo "ok   SIGTERM with a stream in flight: the stream ended with an error event, exit 0"
