// The load clients' statistics and parsing (stats.mjs), with node's own test runner:
//   node --test tests/server/client/stats.test.mjs      (ctest: server_client_stats)
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { lcg, pct, sseEvents, traceSampler } from './stats.mjs';

test('pct is the nearest rank from below, numeric order, NaN for none', () => {
  const xs = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 100];  // 100 sorts last numerically, not as text
  assert.equal(pct(xs, 0), 1);
  assert.equal(pct(xs, 50), 6);
  assert.equal(pct(xs, 99), 100);
  assert.equal(pct(xs, 100), 100);
  assert.equal(pct(Array.from({ length: 1000 }, (_, i) => i), 99), 990);
  assert.ok(Number.isNaN(pct([], 50)));
  assert.equal(pct(new Float64Array([0.5, 0.25]), 0), 0.25);
});

test('lcg replays with its seed and stays in [0, 1)', () => {
  const a = lcg(7), b = lcg(7), c = lcg(8);
  const xs = Array.from({ length: 1000 }, a);
  assert.deepEqual(xs, Array.from({ length: 1000 }, b));
  assert.notDeepEqual(xs.slice(0, 5), Array.from({ length: 5 }, c));
  assert.ok(xs.every((x) => x >= 0 && x < 1));
  const mean = xs.reduce((s, x) => s + x, 0) / xs.length;
  assert.ok(Math.abs(mean - 0.5) < 0.05, `mean ${mean}`);
});

test('lcg does not cycle within a run: prompts of random ids share no 16-token block', () => {
  // The load clients' prompts: ids 3 + floor(997 r). A repeated block of the prefix cache's size
  // would let the cache serve prompts that are meant to be fresh.
  const r = lcg(1), seen = new Set();
  for (let i = 0; i < 200000; ++i) {
    const block = Array.from({ length: 16 }, () => 3 + Math.floor(r() * 997)).join(',');
    assert.ok(!seen.has(block), `block ${i} repeats`);
    seen.add(block);
  }
  const draws = new Set(Array.from({ length: 1000000 }, r));
  assert.ok(draws.size > 999000, `${draws.size} distinct of 1000000 draws`);
});

test('sseEvents splits events wherever the chunks break, and hands back a tail', async () => {
  const text = 'data: {"a":1}\n\ndata: {"b":"\u00e9"}\n\ndata: [DONE]\n\npartial';
  const bytes = new TextEncoder().encode(text);
  for (const size of [1, 2, 3, 7, bytes.length]) {
    async function* body() {
      for (let i = 0; i < bytes.length; i += size) yield bytes.subarray(i, i + size);
    }
    const got = [];
    for await (const ev of sseEvents(body())) got.push(ev);
    assert.deepEqual(got, ['data: {"a":1}', 'data: {"b":"\u00e9"}', 'data: [DONE]', 'partial'],
      `chunks of ${size}`);
  }
});

test('traceSampler draws rows and cuts them to max_model_len as the engine does', () => {
  const csv = 'num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n' +
    '100,50,150,2\n9000,20,9020,450\n10,9000,9010,0.001\n';
  const draws = [0.1, 0.5, 0.9];
  let k = 0;
  const next = traceSampler(csv, 8192, () => draws[k++ % 3]);
  assert.deepEqual(next(), { prompt: 100, output: 50 });
  assert.deepEqual(next(), { prompt: 8172, output: 20 });  // prompt cut: prompt + output <= 8192
  assert.deepEqual(next(), { prompt: 1, output: 8191 });   // output cut to max_model_len - 1
  assert.throws(() => traceSampler('header\n0,5\n', 8192, Math.random), /bad length trace/);
});
