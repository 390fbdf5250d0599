// Overload of a running `flashserve serve` (plain node, no dependencies), for
// scripts/overload-gpu-check.sh: Poisson arrivals of streamed completions at --rate for --seconds,
// request lengths from a length trace (ShareGPT's: data/workloads/), each a prompt of random token
// ids with its trace output length (ignore_eos). Every request must end one of two ways:
//   accepted  200, every token asked for, then [DONE]: its TTFT and TBTs (the gaps between tokens
//             as the client receives them) are kept;
//   refused   503 `overloaded` (or `too_many_connections`) with Retry-After: how fast it came;
// anything else (another status, an error event, a stream cut short, no answer at all, or no
// answer --drain seconds after the last arrival) is counted as unanswered. The server's resident
// memory and heap are sampled every 10 s (oftener in a run under 200 s). Prints the counts,
// accepted TBT p50/p99 against the SLO, TTFT p50/p99, refusal latency p50/p99, memory
// first/last/max under the load after the warm-up and after the drain, and a verdict line per
// check; exits 1 when a check fails.
//   node overload.mjs --base URL --model NAME --rate 15 --seconds 300 --trace FILE.csv
//     [--max-model-len 8192] [--warmup 60] [--tbt-slo-ms 46.2] [--refusal-p99-ms 250]
//     [--rss-growth-mib 64] [--drain 120] [--seed 1]
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { lcg, metrics, pct, sseEvents, traceSampler } from './stats.mjs';

const { values: a } = parseArgs({
  options: Object.fromEntries(
    ['base', 'model', 'rate', 'seconds', 'trace', 'max-model-len', 'warmup', 'tbt-slo-ms',
      'refusal-p99-ms', 'rss-growth-mib', 'drain', 'seed'].map((k) => [k, { type: 'string' }])),
});
for (const k of ['base', 'model', 'rate', 'seconds', 'trace'])
  if (a[k] === undefined) throw new Error(`--${k} is required`);
const num = (k, d) => (a[k] === undefined ? d : Number(a[k]));
const base = a.base, model = a.model;
const RATE = num('rate'), SECONDS = num('seconds'), MAX_LEN = num('max-model-len', 8192);
const WARMUP = num('warmup', Math.min(60, SECONDS / 4)), SLO_MS = num('tbt-slo-ms', 46.2);
const REFUSAL_MS = num('refusal-p99-ms', 250), RSS_GROWTH = num('rss-growth-mib', 64);
const DRAIN = num('drain', 120);

const rand = lcg(num('seed', 1));
const lengths = traceSampler(readFileSync(a.trace, 'utf8'), MAX_LEN, rand);
const ms = (s) => (s * 1e3).toFixed(1);
const mib = (b) => (b / 2 ** 20).toFixed(0);

const counts = { accepted: 0, refused: 0, unanswered: 0 };
const ttft = [], refusal = [], unanswered = [];
let tbt = new Float64Array(1 << 20), tbtN = 0, tokens = 0;
const pushTbt = (x) => {
  if (tbtN === tbt.length) { const t = new Float64Array(tbt.length * 2); t.set(tbt); tbt = t; }
  tbt[tbtN++] = x;
};
const noAnswer = (what) => {
  counts.unanswered++;
  if (unanswered.length < 20) unanswered.push(what);
};

async function one(i, { prompt: P, output: O }, signal) {
  const prompt = Array.from({ length: P }, () => 3 + Math.floor(rand() * 997));
  const t0 = performance.now();
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal,
      body: JSON.stringify({ model, prompt, max_tokens: O, temperature: 0, ignore_eos: true, stream: true }),
    });
    if (res.status === 503) {
      const after = (performance.now() - t0) / 1e3;
      const code = JSON.parse(await res.text()).error?.code;
      if (!['overloaded', 'too_many_connections'].includes(code) || !res.headers.get('retry-after'))
        return noAnswer(`#${i}: 503 ${code} retry-after ${res.headers.get('retry-after')}`);
      counts.refused++;
      refusal.push(after);
      return;
    }
    if (res.status !== 200) return noAnswer(`#${i}: status ${res.status}: ${(await res.text()).slice(0, 200)}`);
    let last = null, got = 0, done = false;
    for await (const ev of sseEvents(res.body)) {
      if (ev === 'data: [DONE]') { done = true; continue; }
      const chunk = JSON.parse(ev.slice(6));
      if (chunk.error) return noAnswer(`#${i}: error event ${JSON.stringify(chunk.error).slice(0, 200)}`);
      const n = chunk.choices[0]?.token_ids.length ?? 0;
      const now = performance.now();
      for (let k = 0; k < n; k++) {
        if (last === null) ttft.push((now - t0) / 1e3);
        else pushTbt(k === 0 ? (now - last) / 1e3 : 0);
        last = now;
      }
      got += n;
    }
    if (!done || got !== O) return noAnswer(`#${i}: ${got} of ${O} tokens, [DONE] ${done}`);
    counts.accepted++;
    tokens += got;
  } catch (e) {
    noAnswer(`#${i}: ${signal.aborted ? `no answer ${DRAIN} s after the last arrival` : String(e)}`);
  }
}

const start = performance.now();
const now = () => (performance.now() - start) / 1e3;
const memory = [];
const sample = async () => {
  try {
    memory.push({ t: now(), ...(await metrics(base)) });
  } catch (e) {
    console.log(`metrics at ${now().toFixed(0)} s: ${e}`);
  }
};
await sample();
// Every 10 s, or oftener in a short run, so that the load has several samples to judge.
const sampler = setInterval(sample, 1000 * Math.min(10, Math.max(1, SECONDS / 20)));
const abort = new AbortController();
const running = [];
let t = 0, n = 0;
while ((t += -Math.log(1 - rand()) / RATE) < SECONDS) {
  const wait = start + t * 1000 - performance.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  running.push(one(n++, lengths(), abort.signal));
}
const arrivalsEnd = now();
const drained = setTimeout(() => abort.abort(), DRAIN * 1000);
await Promise.all(running);
clearTimeout(drained);
clearInterval(sampler);
await sample();
const wall = now();

const tbts = tbt.subarray(0, tbtN);
// Growth is judged under the load: from the warm-up's end to the last sample before the arrivals
// end. The drain after it runs batches the load never ran (the batch shrinks to 0), and the CUDA
// runner captures a graph for each new (batch, width) once, host memory it keeps up to its bound
// (model/step_graphs.h kMaxDecodeGraphs): the sample after the drain is printed, not judged.
const after = memory.filter((m) => m.t >= WARMUP && m.t <= arrivalsEnd);
const rss = after.map((m) => m.rss), heap = after.map((m) => m.heap);
const growth = rss.length ? (rss[rss.length - 1] - rss[0]) / 2 ** 20 : NaN;
const drainedMem = memory[memory.length - 1];
console.log(`requests: ${n} sent at ${RATE} req/s over ${arrivalsEnd.toFixed(1)} s (${(n / arrivalsEnd).toFixed(2)} req/s), drained in ${(wall - arrivalsEnd).toFixed(1)} s`);
console.log(`accepted ${counts.accepted}, refused ${counts.refused} (503), unanswered ${counts.unanswered}`);
console.log(`accepted: ${(counts.accepted / wall).toFixed(2)} req/s completed, ${(tokens / wall).toFixed(0)} output tok/s`);
console.log(`accepted TBT  p50 ${ms(pct(tbts, 50))} ms, p99 ${ms(pct(tbts, 99))} ms, max ${ms(pct(tbts, 100))} ms (${tbtN} gaps; SLO p99 <= ${SLO_MS} ms)`);
console.log(`accepted TTFT p50 ${ms(pct(ttft, 50))} ms, p99 ${ms(pct(ttft, 99))} ms`);
console.log(`refusal latency p50 ${ms(pct(refusal, 50))} ms, p99 ${ms(pct(refusal, 99))} ms, max ${ms(pct(refusal, 100))} ms`);
console.log('memory (t s: RSS MiB / heap MiB / running / waiting / in flight):');
console.log('  ' + memory.map((m) => `${m.t.toFixed(0)}: ${mib(m.rss)}/${mib(m.heap)}/${m.running}/${m.waiting}/${m.inFlight}`).join(', '));
console.log(`under the load, after the ${WARMUP} s warm-up: RSS first ${mib(rss[0])} MiB, last ${mib(rss[rss.length - 1])} MiB, max ${mib(Math.max(...rss))} MiB; heap first ${mib(heap[0])} MiB, last ${mib(heap[heap.length - 1])} MiB, max ${mib(Math.max(...heap))} MiB`);
console.log(`after the drain (idle): RSS ${mib(drainedMem.rss)} MiB, heap ${mib(drainedMem.heap)} MiB (not judged: the drain's batch sizes' CUDA graphs)`);
for (const u of unanswered) console.log(`unanswered: ${u}`);

const checks = [
  ['every request answered or refused', counts.unanswered === 0, `${counts.unanswered} unanswered`],
  ['accepted TBT p99 within the SLO', pct(tbts, 99) * 1e3 <= SLO_MS, `${ms(pct(tbts, 99))} <= ${SLO_MS} ms`],
  ['refusals prompt', !refusal.length || pct(refusal, 99) * 1e3 <= REFUSAL_MS, `p99 ${ms(pct(refusal, 99))} <= ${REFUSAL_MS} ms`],
  ['no memory growth under the load', rss.length >= 2 && growth <= RSS_GROWTH, `RSS ${growth.toFixed(1)} MiB <= ${RSS_GROWTH} MiB over ${after.length} samples`],
];
for (const [what, ok, detail] of checks) console.log(`${ok ? 'PASS' : 'FAIL'}: ${what} (${detail})`);
if (!counts.refused) console.log('NOTE: nothing was refused: the rate did not reach the concurrency bound');
process.exit(checks.every(([, ok]) => ok) ? 0 : 1);
