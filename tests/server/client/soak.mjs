// The soak of a running `flashserve serve` (plain node, no dependencies), driven by scripts/soak.sh:
//   node soak.mjs BASE_URL MODEL SECONDS MAX_CONCURRENT HEALTH_P99_MS HEAP_GROWTH_KIB
// For SECONDS, all at once:
//   - Poisson streams (4/s; random prompts of 1-96 ids, 1-48 tokens out, ignore_eos), a fifth of
//     them aborted by the client at a random moment (those on a connection of their own);
//   - malformed and oversized requests (bad JSON, wrong types, unknown model, a 9 MiB body, bytes
//     that are no HTTP) at 1/s, each with the status it deserves and an OpenAI error body;
//   - stalled sockets (half a request, then nothing), 20 every 5 s, which the server must close at
//     its header deadline (with a 408);
//   - every 15 s a burst of 3 x MAX_CONCURRENT streams at once, past --max-concurrent-requests;
//   - /health every 100 ms on a fresh connection, timed (in a thread of its own).
// Every request must end one way: answered (a whole stream, the tokens asked for, [DONE]), refused
// (503 overloaded with Retry-After and the JSON body), or aborted by us. Then, with the traffic
// stopped, the server must be idle (KV blocks, running, waiting, in flight, workers all 0) with its
// heap within HEAP_GROWTH_KIB of what it held when idle after the warm-up, and /health p99 under
// HEALTH_P99_MS. Deterministic randomness (a fixed seed), so a failure can be replayed.
import http from 'node:http';
import net from 'node:net';
import { Worker } from 'node:worker_threads';

import { lcg, metrics as serverMetrics, pct } from './stats.mjs';

const [base, model, secondsArg, maxConcArg, healthArg, heapArg] = process.argv.slice(2);
const SECONDS = Number(secondsArg), MAX_CONC = Number(maxConcArg);
const HEALTH_P99_MS = Number(healthArg), HEAP_GROWTH_KIB = Number(heapArg);
const url = new URL(base);

const rand = lcg(2026);
const exp = (rate) => -Math.log(1 - rand()) / rate;  // Poisson gaps
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const counts = {};
const count = (k) => { counts[k] = (counts[k] ?? 0) + 1; };
const bad = [];
const fail = (what) => {
  if (bad.length < 50) bad.push(what);
  count('bad');
  console.log(`bad: ${what}`);  // as it happens, to be seen beside the server's log
};

const metrics = () => serverMetrics(base);

function isErrorBody(text) {
  try {
    const e = JSON.parse(text).error;
    return typeof e?.message === 'string' && typeof e.type === 'string' && 'param' in e && 'code' in e;
  } catch { return false; }
}

// A POST on a connection of its own (node:http, no agent), for a request we may abort. Not fetch:
// undici's pool keeps the socket of a request aborted before it was written, unused, and later
// sends another request on it; if that is as the server closes the socket for saying nothing
// (its header deadline), the request fails, a client-side race and no fault of the server's.
function postOwnConnection(path, body, signal) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname, port: url.port, path, method: 'POST', agent: false, signal,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('close', () => {
        if (res.complete) resolve({ status: res.statusCode, retryAfter: res.headers['retry-after'] ?? null, text });
        else reject(signal.aborted ? signal.reason : new Error('the connection closed mid-response'));
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

// One stream: answered whole, refused with 503, or aborted by us after `abortAfterMs`.
async function stream(abortAfterMs, tag) {
  const promptLen = 1 + Math.floor(rand() * 96), maxTokens = 1 + Math.floor(rand() * 48);
  const prompt = Array.from({ length: promptLen }, () => 3 + Math.floor(rand() * 900));
  const body = JSON.stringify({ model, prompt, max_tokens: maxTokens, ignore_eos: true, stream: true });
  const controller = new AbortController();
  let timer = null;
  try {
    let res;
    if (abortAfterMs === null) {
      const r = await fetch(`${base}/v1/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
      });
      res = { status: r.status, retryAfter: r.headers.get('retry-after'), text: await r.text() };
    } else {
      timer = setTimeout(() => controller.abort(), abortAfterMs);
      res = await postOwnConnection('/v1/completions', body, controller.signal);
    }
    const text = res.text;
    if (res.status === 503) {
      if (!isErrorBody(text) || JSON.parse(text).error.code !== 'overloaded' || res.retryAfter !== '1')
        return fail(`${tag}: a 503 without the overloaded body or Retry-After: ${text.slice(0, 200)}`);
      return count(`${tag}_refused`);
    }
    if (res.status !== 200) return fail(`${tag}: status ${res.status}: ${text.slice(0, 200)}`);
    if (!text.endsWith('data: [DONE]\n\n')) return fail(`${tag}: no [DONE] at the end`);
    let tokens = 0;
    for (const ev of text.slice(0, -2).split('\n\n').slice(0, -1)) {
      const c = JSON.parse(ev.slice(6));
      if (c.error) return fail(`${tag}: an error event: ${ev.slice(0, 200)}`);
      tokens += c.choices[0]?.token_ids?.length ?? 0;
    }
    if (tokens !== maxTokens) return fail(`${tag}: ${tokens} tokens, asked ${maxTokens}`);
    count(`${tag}_answered`);
  } catch (e) {
    if (controller.signal.aborted) return count(`${tag}_aborted`);
    fail(`${tag}: ${e}${e.cause ? ` (${e.cause})` : ''}`);
  } finally {
    if (timer) clearTimeout(timer);
  }
}

// Raw bytes on a connection of their own: the status line of the answer, or '' if it closed first.
function raw(bytes, { endAfter = true } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    let got = '';
    s.on('connect', () => { s.write(bytes); if (endAfter) s.end(); });
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', () => {});
    s.on('close', () => resolve(got));
  });
}

const hostile = [
  { name: 'bad_json', status: 400, body: () => '{"model": "' + model + '", "prompt": [1, 2' },
  { name: 'wrong_type', status: 400, body: () => JSON.stringify({ model, prompt: [1], max_tokens: 'many' }) },
  { name: 'unknown_field', status: 400, body: () => JSON.stringify({ model, prompt: [1], bogus: 1 }) },
  { name: 'unknown_model', status: 404, body: () => JSON.stringify({ model: 'nope', prompt: [1] }) },
  { name: 'too_long', status: 400, body: () => JSON.stringify({ model, prompt: Array(5000).fill(7) }) },
  { name: 'oversized', status: 413, body: () => '{"model": "x", "user": "' + 'x'.repeat(9 << 20) + '"}' },
];
async function hostileOne() {
  if (rand() < 0.2) {  // no HTTP at all: 400 and closed
    const got = await raw('GARBAGE \x01\x02 NOT HTTP\r\n\r\n');
    if (!got.startsWith('HTTP/1.1 400')) return fail(`garbage: got ${JSON.stringify(got.slice(0, 80))}`);
    return count('garbage_400');
  }
  const h = hostile[Math.floor(rand() * hostile.length)];
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: h.body(),
    });
    const text = await res.text();
    // Any generation request may be refused at the bound (it takes its slot on arrival).
    if (res.status === 503 && isErrorBody(text) && JSON.parse(text).error.code === 'overloaded' &&
        res.headers.get('retry-after') === '1')
      return count(`${h.name}_refused`);
    if (res.status !== h.status) return fail(`${h.name}: status ${res.status}, want ${h.status}: ${text.slice(0, 200)}`);
    if (!isErrorBody(text)) return fail(`${h.name}: not an OpenAI error body: ${text.slice(0, 200)}`);
    count(`${h.name}_${h.status}`);
  } catch (e) {
    fail(`${h.name}: ${e}${e.cause ? ` (${e.cause})` : ''}`);
  }
}

// Stalled sockets: half a request, then silence; the server must close each one (a 408).
let stalledOpen = 0;
function stall() {
  return new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    let got = '';
    stalledOpen++;
    s.on('connect', () => s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le'));
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', () => {});
    s.on('close', () => {
      stalledOpen--;
      if (!got.startsWith('HTTP/1.1 408')) fail(`stalled: closed without a 408: ${JSON.stringify(got.slice(0, 80))}`);
      else count('stalled_closed_408');
      resolve();
    });
  });
}

// /health every 100 ms on a fresh connection, timed in a thread of its own: this thread's event
// loop is busy with the load (building a 9 MiB body, say), and its stalls are not the server's.
const prober = new Worker(`
  const { parentPort, workerData } = require('node:worker_threads');
  const http = require('node:http');
  const times = [], errors = [];
  let stop = false;
  parentPort.on('message', () => { stop = true; });
  (async () => {
    while (!stop) {
      await new Promise((resolve) => {
        const t0 = performance.now();
        const req = http.get({ host: workerData.host, port: workerData.port, path: '/health', agent: false }, (res) => {
          res.resume();
          res.on('end', () => {
            if (res.statusCode !== 200) errors.push('/health: ' + res.statusCode);
            times.push(performance.now() - t0);
            resolve();
          });
        });
        req.on('error', (e) => { errors.push('/health: ' + e); resolve(); });
      });
      await new Promise((r) => setTimeout(r, 100));
    }
    parentPort.postMessage({ times, errors });
  })();
`, { eval: true, workerData: { host: url.hostname, port: url.port } });
const proberDone = new Promise((resolve) => prober.on('message', resolve));

async function waitIdle(what) {
  const t0 = Date.now();
  let m = await metrics();
  while ((m.blocks || m.running || m.waiting || m.inFlight || m.workers) && Date.now() - t0 < 30000) {
    await sleep(50);
    m = await metrics();
  }
  if (m.blocks || m.running || m.waiting || m.inFlight || m.workers)
    fail(`${what}: not idle after 30 s: ${JSON.stringify(m)}`);
  return m;
}

// Warm-up: a burst at the bound and a few of each kind, so that buffers reach their size first.
await Promise.all(Array.from({ length: MAX_CONC }, () => stream(null, 'warmup')));
for (let i = 0; i < 12; i++) await hostileOne();
await sleep(500);
const idle0 = await waitIdle('after the warm-up');
console.log(`warm-up: ${JSON.stringify(counts)}; idle: ${JSON.stringify(idle0)}`);

const tasks = [];
const end = Date.now() + SECONDS * 1000;
const loop = async (gapMs, body) => {
  while (Date.now() < end) {
    tasks.push(body());
    await sleep(gapMs());
  }
};
const samples = [];
await Promise.all([
  loop(() => exp(4) * 1000, () => stream(rand() < 0.2 ? Math.floor(rand() * 400) : null, 'poisson')),
  loop(() => exp(1) * 1000, hostileOne),
  loop(() => 5000, () => Promise.all(Array.from({ length: 20 }, stall))),
  loop(() => 15000, () => Promise.all(Array.from({ length: 3 * MAX_CONC }, () => stream(null, 'burst')))),
  loop(() => 30000, async () => {
    const m = await metrics();
    samples.push(m);
    console.log(`t+${Math.round((Date.now() - end) / 1000 + SECONDS)} s: ${JSON.stringify(counts)} metrics ${JSON.stringify(m)}`);
  }),
]);
await Promise.all(tasks);
prober.postMessage('stop');
const { times: health, errors: healthErrors } = await proberDone;
await prober.terminate();
for (const e of healthErrors.slice(0, 10)) fail(e);
const idle1 = await waitIdle('at the end');
const m = await metrics();

const p = (q) => pct(health, q).toFixed(1);
console.log(`requests: ${JSON.stringify(counts)}`);
console.log(`/health over ${health.length} probes: p50 ${p(50)} ms, p99 ${p(99)} ms, max ${Math.max(...health).toFixed(1)} ms (bound: p99 < ${HEALTH_P99_MS} ms)`);
console.log(`idle after the warm-up: heap ${(idle0.heap / 1024).toFixed(0)} KiB, rss ${(idle0.rss / 2 ** 20).toFixed(1)} MiB; at the end: heap ${(idle1.heap / 1024).toFixed(0)} KiB, rss ${(idle1.rss / 2 ** 20).toFixed(1)} MiB`);
console.log(`at the end: ${JSON.stringify(m)}`);
const answered = Object.entries(counts).filter(([k]) => k.endsWith('_answered')).reduce((a, [, v]) => a + v, 0);
if (answered === 0) fail('no stream was answered');
if (!(counts.burst_refused > 0)) fail('no burst went past the concurrency bound (no 503 overloaded)');
if (!(counts.stalled_closed_408 > 0)) fail('no stalled socket was closed');
if (stalledOpen !== 0) fail(`${stalledOpen} stalled sockets still open`);
if (!(pct(health, 99) < HEALTH_P99_MS)) fail(`/health p99 ${p(99)} ms >= ${HEALTH_P99_MS} ms`);
if (!(m.blocks === 0 && m.running === 0 && m.waiting === 0 && m.inFlight === 0 && m.workers === 0))
  fail(`not idle at the end: ${JSON.stringify(m)}`);
if (process.env.FLASHSERVE_SKIP_MEMORY_CHECK) {
  console.log('memory: not checked (FLASHSERVE_SKIP_MEMORY_CHECK)');
} else if (!(idle1.heap - idle0.heap < HEAP_GROWTH_KIB * 1024)) {
  fail(`heap in use grew by ${((idle1.heap - idle0.heap) / 1024).toFixed(0)} KiB (bound ${HEAP_GROWTH_KIB} KiB)`);
}
if (bad.length) {
  console.log(`FAIL:\n  ${bad.join('\n  ')}`);
  process.exit(1);
}
console.log('ok   soak: every request answered, refused or aborted; idle, heap back, /health in bound');
