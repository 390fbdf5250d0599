// The connection flood of scripts/flood.sh (plain node, no dependencies):
//   node flood.mjs BASE_URL MODEL CONNECTIONS HEADER_TIMEOUT_S P99_BOUND_MS SERVER_PID
// Opens CONNECTIONS sockets that each send half a request and stall; with all of them open, times
// 100 /health probes and 100 streamed completions (each on a fresh connection, one after another),
// and the server's CPU time over 2 s; then waits for every stalled socket to be closed by the
// server (a 408) at its header deadline. Fails if a p99 is at or past P99_BOUND_MS, if a stalled
// socket is closed without a 408 or before its deadline, or if one is still open a minute past it.
import net from 'node:net';
import http from 'node:http';
import fs from 'node:fs';

const [base, model, nArg, timeoutArg, boundArg, pidArg] = process.argv.slice(2);
const N = Number(nArg), T = Number(timeoutArg) * 1000, BOUND = Number(boundArg);
const url = new URL(base);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((q / 100) * s.length))];
};
const bad = [];

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  return Number(text.match(new RegExp(`^${name.replace(/[{}"]/g, (c) => '\\' + c)} (\\S+)$`, 'm'))?.[1]);
}
// utime + stime of the server, in seconds (/proc/PID/stat fields 14 and 15).
function cpuSeconds() {
  const f = fs.readFileSync(`/proc/${pidArg}/stat`, 'utf8');
  const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(rest[11]) + Number(rest[12])) / 100;  // USER_HZ
}

// The stalled sockets: when each was connected and closed, and what it got.
const stalled = [];
let closed = 0;
function stall() {
  return new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    const rec = { opened: 0, closedAt: 0, got: '' };
    stalled.push(rec);
    s.on('connect', () => {
      rec.opened = performance.now();
      s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le');
      resolve();
    });
    s.on('data', (d) => { rec.got += d.toString('latin1'); });
    s.on('error', (e) => { rec.error = String(e); resolve(); });
    s.on('close', () => { rec.closedAt = performance.now(); closed++; });
  });
}

function timed(options, body) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const req = http.request({ host: url.hostname, port: url.port, agent: false, ...options }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ ms: performance.now() - t0, status: res.statusCode, text }));
    });
    req.on('error', (e) => resolve({ ms: Infinity, status: 0, text: String(e) }));
    req.end(body);
  });
}

const t0 = performance.now();
for (let at = 0; at < N; at += 500)
  await Promise.all(Array.from({ length: Math.min(500, N - at) }, stall));
const opening = (performance.now() - t0) / 1000;
let open = await metric('flashserve_http_connections_open');
for (let i = 0; i < 200 && open < N; i++) {
  await sleep(50);
  open = await metric('flashserve_http_connections_open');
}
console.log(`${N} stalled connections opened in ${opening.toFixed(1)} s; the server holds ${open} open`);
if (!(open >= N)) bad.push(`the server holds ${open} connections, not ${N}`);

const c0 = cpuSeconds();
await sleep(2000);
const cpu = (cpuSeconds() - c0) / 2;
console.log(`server CPU with ${N} stalled connections: ${(100 * cpu).toFixed(1)} % of a core`);

const health = [], streams = [];
for (let i = 0; i < 100; i++) {
  const r = await timed({ path: '/health' });
  if (r.status !== 200) bad.push(`/health: ${r.status} ${r.text.slice(0, 100)}`);
  health.push(r.ms);
}
const body = JSON.stringify({ model, prompt: [1, 2, 3], max_tokens: 4, ignore_eos: true, stream: true });
for (let i = 0; i < 100; i++) {
  const r = await timed({ path: '/v1/completions', method: 'POST',
                          headers: { 'Content-Type': 'application/json' } }, body);
  if (r.status !== 200 || !r.text.endsWith('data: [DONE]\n\n')) bad.push(`stream: ${r.status} ${r.text.slice(0, 100)}`);
  streams.push(r.ms);
}
const fmt = (xs) => `p50 ${pct(xs, 50).toFixed(1)} ms, p99 ${pct(xs, 99).toFixed(1)} ms, max ${Math.max(...xs).toFixed(1)} ms`;
console.log(`/health, 100 probes: ${fmt(health)}`);
console.log(`streamed completion (4 tokens) to [DONE], 100 probes: ${fmt(streams)}`);
if (!(pct(health, 99) < BOUND)) bad.push(`/health p99 ${pct(health, 99).toFixed(1)} ms >= ${BOUND} ms`);
if (!(pct(streams, 99) < BOUND)) bad.push(`stream p99 ${pct(streams, 99).toFixed(1)} ms >= ${BOUND} ms`);
// Before the deadline: 2 s of slack, as the server's clock starts at its accept and ours at the
// connect event, which a busy event loop here can see late.
const earlyClosed = stalled.filter((r) => r.closedAt && r.closedAt - r.opened < T - 2000).length;
if (earlyClosed) bad.push(`${earlyClosed} stalled connections closed before their deadline`);

// Every stalled socket is closed at its deadline, with a 408.
const last = Math.max(...stalled.map((r) => r.opened)) + T + 60000;
while (closed < N && performance.now() < last) await sleep(100);
const late = stalled.filter((r) => r.closedAt).map((r) => (r.closedAt - r.opened - T) / 1000);
const no408 = stalled.filter((r) => r.closedAt && !r.got.startsWith('HTTP/1.1 408')).length;
console.log(`closed by the server: ${closed} of ${N}, ${N - no408 - (N - closed)} with a 408; ` +
            `after the ${T / 1000} s deadline by p50 ${pct(late, 50).toFixed(2)} s, max ${Math.max(...late).toFixed(2)} s`);
console.log(`server header timeouts counted: ${await metric('flashserve_http_timeouts_total{deadline="header"}')}`);
if (closed < N) bad.push(`${N - closed} stalled connections still open a minute past their deadline`);
if (no408) bad.push(`${no408} stalled connections closed without a 408`);
if (bad.length) {
  console.log(`FAIL:\n  ${bad.slice(0, 20).join('\n  ')}`);
  process.exit(1);
}
console.log('ok   flood');
