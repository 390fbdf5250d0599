// Many clients at once that hang up at random, against a running flashserve serve (plain fetch,
// no dependencies):  node hostile_clients.mjs BASE_URL MODEL [CLIENTS]
// Each client sends a valid streamed or whole request, or a hostile one (wrong types, huge
// max_tokens, a prompt past the limit), and aborts after a random delay or reads to the end.
// Every answer that arrives must have the status its request deserves; afterwards the server
// must be idle (no KV blocks used, nothing running or waiting, nothing in flight), hold no more
// heap than after the first round (a request that leaks shows there), and still serve.
import assert from 'node:assert/strict';

const [base, model, clientsArg] = process.argv.slice(2);
const clients = Number(clientsArg ?? 200);

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
  return {
    blocks: get('flashserve_kv_blocks_used'), running: get('flashserve_requests_running'),
    waiting: get('flashserve_requests_waiting'), inFlight: get('flashserve_http_requests_in_flight'),
    rss: get('process_resident_memory_bytes'), heap: get('flashserve_heap_in_use_bytes'),
  };
}

// Deterministic randomness, so a failure can be replayed.
let state = 12345;
const rand = () => ((state = (state * 1103515245 + 12345) % 2147483648) / 2147483648);

const kinds = [
  { body: () => ({ model, prompt: [1, 2, 3, 4], max_tokens: 64, ignore_eos: true, stream: true }), status: 200 },
  { body: () => ({ model, prompt: [9, 8, 7], max_tokens: 16, ignore_eos: true }), status: 200 },
  { body: () => ({ model, prompt: [1, 2], max_tokens: 'many' }), status: 400 },
  { body: () => ({ model, prompt: [1, 2], max_tokens: 1e15 }), status: 400 },
  { body: () => ({ model, prompt: [1, 2], max_tokens: -3 }), status: 400 },
  { body: () => ({ model, prompt: Array(200000).fill(3) }), status: 400 },
  { body: () => ({ model, prompt: [1, 2], temperature: 'hot' }), status: 400 },
  { body: () => ({ model: 'nope', prompt: [1] }), status: 404 },
  { raw: '{"model": "' + 'x'.repeat(1000), status: 400 },
];

async function storm(round) {
const counts = {};
const bad = [];
await Promise.all(Array.from({ length: clients }, async (_, i) => {
  const kind = kinds[Math.floor(rand() * kinds.length)];
  const hangUpAfter = rand() < 0.6 ? Math.floor(rand() * 300) : null;
  const controller = new AbortController();
  if (hangUpAfter !== null) setTimeout(() => controller.abort(), hangUpAfter);
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: kind.raw ?? JSON.stringify(kind.body()), signal: controller.signal,
    });
    const text = await res.text();
    counts[res.status] = (counts[res.status] ?? 0) + 1;
    if (res.status !== kind.status) bad.push(`client ${i}: ${res.status} (want ${kind.status}): ${text.slice(0, 200)}`);
    if (res.status >= 400) {
      const e = JSON.parse(text).error;
      if (typeof e?.message !== 'string' || !('param' in e) || !('code' in e) || typeof e.type !== 'string')
        bad.push(`client ${i}: not an OpenAI error body: ${text.slice(0, 200)}`);
    } else if (kind.body?.().stream && !text.endsWith('data: [DONE]\n\n')) {
      bad.push(`client ${i}: stream did not end with [DONE]`);
    }
  } catch (e) {
    if (e.name !== 'AbortError') bad.push(`client ${i}: ${e}${e.cause ? ` (${e.cause})` : ''}`);
    counts.aborted = (counts.aborted ?? 0) + 1;
  }
}));
console.log(`round ${round}: ${clients} clients: ${JSON.stringify(counts)}`);
assert.deepEqual(bad, []);

// Idle again: every aborted request's blocks freed, nothing left in the engine or the server.
const t0 = Date.now();
let m = await metrics();
while ((m.blocks || m.running || m.waiting || m.inFlight) && Date.now() - t0 < 20000) {
  await new Promise((r) => setTimeout(r, 20));
  m = await metrics();
}
console.log(`round ${round}: idle after ${Date.now() - t0} ms: ${JSON.stringify(m)}`);
assert.deepEqual([m.blocks, m.running, m.waiting, m.inFlight], [0, 0, 0, 0]);
return m;
}

// Memory that leaked per request shows as heap still allocated after later rounds. The server
// runs with one malloc arena and no per-thread caches (server_test.sh), so glibc's count of bytes
// allocated and not freed is exactly what the process holds. With the event-driven transport it
// moves by up to ~0.5 MiB from round to round either way (2026-12-02: six local runs and a CI
// run, +-0.3 MiB typical, one CI failure at +262 KiB against the old 32 KiB bound; the cause of
// the jitter is not yet found), so the bound is 1 MiB over rounds 2-4: a leak of about 2 KiB per
// request (400 requests in rounds 3-4) exceeds it.
// Resident memory also moves with the allocator's free lists and the threads' stacks as more of
// the 256 connection threads are used, so it gets only a loose bound.
// First, 256 whole requests at once (the server's --max-num-seqs), read to the end: the batch
// buffers reach their largest size here rather than in whichever round happens to be busiest.
await Promise.all(Array.from({ length: 256 }, async () => {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt: [5, 6, 7], max_tokens: 8, ignore_eos: true }),
  });
  assert.equal(res.status, 200);
  await res.text();
}));
const rounds = [];
for (let round = 1; round <= 4; round++) rounds.push(await storm(round));
const mib = (b) => (b / 2 ** 20).toFixed(1);
console.log(`heap in use after each round: ${rounds.map((m) => mib(m.heap)).join(', ')} MiB`);
console.log(`resident memory after each round: ${rounds.map((m) => mib(m.rss)).join(', ')} MiB`);
const [first, last] = [rounds[1], rounds[rounds.length - 1]];  // rounds 2 and 4
if (process.env.FLASHSERVE_SKIP_MEMORY_CHECK) {
  console.log('memory: not checked (sanitizer build: its allocator keeps freed memory aside)');
} else {
  assert.ok(first.heap > 0, 'the server reports no heap in use (flashserve_heap_in_use_bytes)');
  assert.ok(last.heap - first.heap < 2 ** 20,
            `heap in use grew by ${((last.heap - first.heap) / 1024).toFixed(0)} KiB over rounds 2-4`);
  assert.ok(last.rss - first.rss < 64 * 2 ** 20,
            `resident memory grew by ${mib(last.rss - first.rss)} MiB over rounds 2-4`);
}

// And it still serves.
const res = await fetch(`${base}/v1/completions`, {
  method: 'POST', body: JSON.stringify({ model, prompt: [1, 2, 3], max_tokens: 4, ignore_eos: true }),
});
assert.equal(res.status, 200);
assert.equal((await res.json()).choices[0].token_ids.length, 4);
console.log('ok   still serving');
