// A load of streaming clients over HTTP, for the server's load test (no dependencies):
//   node load.mjs BASE_URL MODEL RATE SECONDS PROMPT_LEN OUTPUT_LEN
// Poisson arrivals at RATE requests/s for SECONDS; each request streams PROMPT_LEN random token ids
// in and OUTPUT_LEN tokens out (ignore_eos). Prints TTFT and TBT (the gaps between tokens as the
// client receives them; tokens of one chunk after the first have gap 0) p50 / p99, throughput, and
// the server's resident memory sampled every 10 s (flat memory = no growth after warm-up).
import { lcg, metrics, pct, sseEvents } from './stats.mjs';

const [base, model, rate, seconds, promptLen, outputLen] = process.argv.slice(2);
const R = Number(rate), T = Number(seconds), P = Number(promptLen), O = Number(outputLen);

const rand = lcg(1);
const rss = async () => (await metrics(base)).rss / 2 ** 20;

const ttft = [], tbt = [], memory = [];
let done = 0, failed = 0, tokens = 0;
async function one() {
  const prompt = Array.from({ length: P }, () => 1 + Math.floor(rand() * 1000));
  const t0 = performance.now();
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model, prompt, max_tokens: O, temperature: 0, ignore_eos: true, stream: true }),
    });
    if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
    let last = null;
    for await (const ev of sseEvents(res.body)) {
      if (!ev.startsWith('data: {')) continue;
      const n = JSON.parse(ev.slice(6)).choices[0]?.token_ids.length ?? 0;
      const now = performance.now();
      for (let i = 0; i < n; i++) {
        if (last === null) ttft.push((now - t0) / 1e3);
        else tbt.push(i === 0 ? (now - last) / 1e3 : 0);
        last = now;
      }
      tokens += n;
    }
    done++;
  } catch (e) {
    failed++;
    if (failed < 5) console.error(String(e));
  }
}

const start = performance.now();
const running = [];
const sampler = setInterval(async () => memory.push(await rss()), 10000);
memory.push(await rss());
let t = 0;
while ((t += -Math.log(1 - rand()) / R) < T) {
  const wait = start + t * 1000 - performance.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  running.push(one());
}
await Promise.all(running);
clearInterval(sampler);
memory.push(await rss());
const wall = (performance.now() - start) / 1e3;
console.log(`requests ${done} ok, ${failed} failed in ${wall.toFixed(1)} s (${(done / wall).toFixed(2)} req/s, ${(tokens / wall).toFixed(0)} tok/s)`);
console.log(`TTFT p50 ${(pct(ttft, 50) * 1e3).toFixed(1)} ms, p99 ${(pct(ttft, 99) * 1e3).toFixed(1)} ms`);
console.log(`TBT  p50 ${(pct(tbt, 50) * 1e3).toFixed(1)} ms, p99 ${(pct(tbt, 99) * 1e3).toFixed(1)} ms`);
console.log(`server RSS every 10 s (MiB): ${memory.map((m) => m.toFixed(0)).join(' ')}`);
process.exit(failed ? 1 : 0);
