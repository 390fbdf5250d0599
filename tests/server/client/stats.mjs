// What the load clients share (plain node, no dependencies): a seeded generator, percentiles, the
// SSE events of a streamed response, the server's gauges from /metrics, and request lengths
// sampled from a length trace (load.mjs, overload.mjs).

// A seeded generator in [0, 1): an LCG modulo 2^32 (Numerical Recipes' constants, full period)
// in exact 32-bit arithmetic, so a run can be replayed exactly. The product is Math.imul's: the
// float product s * a passes 2^53 and rounds, and the C library's constants computed that way
// fell into a cycle of ~10,000 draws, so the load clients' random prompts repeated every dozen
// requests and the prefix cache served 97% of their tokens (session 20's overload run).
export function lcg(seed) {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296;
}

// The q-th percentile (0..100) of xs, nearest rank from below; NaN for none.
export function pct(xs, q) {
  const s = Float64Array.from(xs).sort();
  return s.length ? s[Math.min(s.length - 1, Math.floor((q / 100) * s.length))] : NaN;
}

// The events of an SSE body (a fetch response's body), each its text without the blank line.
export async function* sseEvents(body) {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const bytes of body) {
    buf += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      yield buf.slice(0, end);
      buf = buf.slice(end + 2);
    }
  }
  if (buf.length) yield buf;  // an unterminated tail: the caller sees it is not an event
}

// The server's gauges (NaN where absent): memory, requests, KV blocks, connections, workers, and
// the connections closed at their header deadline.
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1] ?? NaN);
  return {
    blocks: get('flashserve_kv_blocks_used'), running: get('flashserve_requests_running'),
    waiting: get('flashserve_requests_waiting'), inFlight: get('flashserve_http_requests_in_flight'),
    workers: get('flashserve_http_workers'), open: get('flashserve_http_connections_open'),
    heap: get('flashserve_heap_in_use_bytes'), rss: get('process_resident_memory_bytes'),
    headerTimeouts: get('flashserve_http_timeouts_total\\{deadline="header"\\}'),
  };
}

// Request lengths from a length trace (data/workloads/*.csv: num_prefill_tokens,
// num_decode_tokens, ...): rows drawn uniformly with `rand`, cut as the engine's workloads cut
// them (serve/workload.cc): output <= maxModelLen - 1, prompt + output <= maxModelLen.
export function traceSampler(csvText, maxModelLen, rand) {
  const rows = csvText.trim().split('\n').slice(1).map((l) => l.split(',').map(Number));
  if (!rows.length || rows.some((r) => !(r[0] >= 1 && r[1] >= 1))) throw new Error('bad length trace');
  return () => {
    const [p, o] = rows[Math.min(rows.length - 1, Math.floor(rand() * rows.length))];
    const output = Math.min(o, maxModelLen - 1);
    return { prompt: Math.max(1, Math.min(p, maxModelLen - output)), output };
  };
}
