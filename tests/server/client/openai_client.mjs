// The official openai client against a running flashserve serve:
//   node openai_client.mjs BASE_URL MODEL
// Completions and chat, streamed and not, concurrent requests, an aborted stream (its KV blocks
// back to 0 in /metrics), and refusals as the client's typed errors. Exits non-zero on a failure.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const prompt = [5, 17, 42, 99, 3, 250];

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  assert.ok(m, `no ${name} in /metrics`);
  return Number(m[1]);
}

async function untilIdle(ms = 3000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if ((await metric('flashserve_kv_blocks_used')) === 0 &&
        (await metric('flashserve_http_requests_in_flight')) === 0) return Date.now() - t0;
    await new Promise((r) => setTimeout(r, 5));
  }
  assert.fail(`not idle after ${ms} ms: ${await metric('flashserve_kv_blocks_used')} blocks used`);
}

async function streamIds(p, maxTokens) {
  const s = await client.completions.create({
    model, prompt: p, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  const ids = [];
  let finish = null, usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      ids.push(...ch.token_ids);
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { ids, finish, usage };
}

const tests = {
  // vLLM's sampling fields as its clients send them (extra_body in Python; plain fields here).
  async vllmSamplingFields() {
    const r = await client.completions.create({
      model, prompt, max_tokens: 4, temperature: 0, ignore_eos: true,
      logit_bias: { 77: 100 }, repetition_penalty: 1.2, presence_penalty: 0.5,
      frequency_penalty: 0.5, min_p: 0.1, min_tokens: 2, skip_special_tokens: true,
      include_stop_str_in_output: false,
    });
    assert.deepEqual(r.choices[0].token_ids, [77, 77, 77, 77]);
    const b = await client.completions.create({ prompt: [prompt, [1, 2]], max_tokens: 2, n: 2 });
    assert.equal(b.model, model);  // no model: the first served name
    assert.deepEqual(b.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.equal(b.usage.prompt_tokens, 8);
  },
  async completion() {
    const r = await client.completions.create({ model, prompt, max_tokens: 7, temperature: 0, ignore_eos: true });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.choices[0].token_ids.length, 7);
    assert.deepEqual(r.usage, {
      prompt_tokens: 6, completion_tokens: 7, total_tokens: 13,
      prompt_tokens_details: { cached_tokens: 0 },  // less than one full block: nothing cached
    });
    // The stream gives the same greedy tokens, then the usage, then [DONE] (the client's loop ends).
    const s = await streamIds(prompt, 7);
    assert.deepEqual(s.ids, r.choices[0].token_ids);
    assert.equal(s.finish, 'length');
    assert.deepEqual(s.usage, r.usage);
  },
  async seededSamplingRepeats() {
    const ask = (seed) => client.completions.create({ model, prompt, max_tokens: 12, temperature: 1.0, top_p: 0.95, seed, ignore_eos: true });
    const [a, b] = await Promise.all([ask(7), ask(7)]);
    assert.deepEqual(a.choices[0].token_ids, b.choices[0].token_ids);
  },
  async jsonObject() {
    // response_format json_object: the content is a JSON object, whole when it stopped, a prefix
    // of one when max_completion_tokens cut it (a random tiny model rarely closes it by itself).
    const messages = [{ role: 'user', content: 'Answer in JSON.' }];
    let r;
    try {
      r = await client.chat.completions.create({
        model, messages, max_completion_tokens: 40, temperature: 1.0, seed: 3,
        response_format: { type: 'json_object' },
      });
    } catch (e) {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, 'messages');  // no tokenizer or template: chat itself is refused
      console.log('jsonObject: chat refused by this checkpoint, as it must be');
      return;
    }
    const { content } = r.choices[0].message;
    if (r.choices[0].finish_reason === 'stop') {
      const v = JSON.parse(content);
      assert.equal(typeof v === 'object' && v !== null && !Array.isArray(v), true, content);
    } else {
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.equal(content.startsWith('{'), true, content);
    }
  },
  async jsonSchema() {
    // response_format json_schema: a completion that stopped is JSON that validates, its
    // properties in the schema's order; strict: all of them. Enums and booleans only, so that a
    // random model closes the object within the token budget (whitespace runs are bounded).
    const schema = {
      type: 'object',
      properties: { mode: { enum: ['fast', 'slow'] }, on: { type: 'boolean' }, n: { type: ['boolean', 'null'] } },
      required: ['mode', 'on'], additionalProperties: false,
    };
    const messages = [{ role: 'user', content: 'Pick a mode.' }];
    const ask = (extra) => client.chat.completions.create({
      model, messages, max_completion_tokens: 300, temperature: 1.0, seed: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'mode', schema, strict: true } }, ...extra,
    });
    let r;
    try {
      r = await ask({});
    } catch (e) {
      assert.ok(e instanceof OpenAI.BadRequestError && e.param === 'messages', String(e));
      console.log('jsonSchema: chat refused by this checkpoint, as it must be');
      return;
    }
    const { content } = r.choices[0].message;
    if (r.choices[0].finish_reason === 'stop') {
      const v = JSON.parse(content);
      assert.deepEqual(Object.keys(v), ['mode', 'on', 'n'], content);  // strict: all, in order
      assert.ok(['fast', 'slow'].includes(v.mode) && typeof v.on === 'boolean', content);
      assert.ok(v.n === null || typeof v.n === 'boolean', content);
    } else {
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.ok(content.startsWith('{'), content);
    }
    // The same seed, streamed: the same content.
    let streamed = '';
    for await (const c of await ask({ stream: true })) streamed += c.choices[0]?.delta?.content ?? '';
    assert.equal(streamed, content);
    // Outside the subset: the keyword and its path, as the client's typed error.
    await assert.rejects(
      client.chat.completions.create({
        model, messages, max_completion_tokens: 4,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
          type: 'object', properties: { s: { type: 'string', pattern: '^a' } } } } },
      }),
      (e) => e instanceof OpenAI.BadRequestError &&
        e.param === 'response_format.json_schema.schema.properties.s.pattern' &&
        /'pattern' is not supported/.test(e.message));
  },
  async toolCalls() {
    // tools with tool_choice required and named: message.tool_calls as the SDK types them,
    // streamed as delta.tool_calls and accumulated the way SDK users do, the same with a seed.
    const tools = [
      { type: 'function', function: { name: 'set_mode', description: 'Set the mode',
        parameters: { type: 'object', properties: { mode: { enum: ['fast', 'slow'] }, on: { type: 'boolean' } },
          required: ['mode', 'on'], additionalProperties: false } } },
      { type: 'function', function: { name: 'reset' } },
    ];
    const messages = [{ role: 'user', content: 'Make it fast.' }];
    const ask = (tool_choice, extra = {}) => client.chat.completions.create({
      model, messages, tools, tool_choice, max_completion_tokens: 300, temperature: 1.0, seed: 9, ...extra,
    });
    let r;
    try {
      r = await ask('required');
    } catch (e) {
      assert.ok(e instanceof OpenAI.BadRequestError && e.param === 'messages', String(e));
      console.log('toolCalls: chat refused by this checkpoint, as it must be');
      return;
    }
    const check = (resp, names) => {
      const ch = resp.choices[0];
      if (ch.finish_reason === 'length') return null;  // cut: content, no calls
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
      assert.equal(ch.message.content, null);
      assert.equal(ch.message.tool_calls.length, 1);
      const call = ch.message.tool_calls[0];
      assert.match(call.id, /^call_[0-9a-f]{24}$/);
      assert.equal(call.type, 'function');
      assert.ok(names.includes(call.function.name), call.function.name);
      const args = JSON.parse(call.function.arguments);
      if (call.function.name === 'set_mode') {
        assert.deepEqual(Object.keys(args), ['mode', 'on']);
        assert.ok(['fast', 'slow'].includes(args.mode) && typeof args.on === 'boolean');
      } else {
        assert.deepEqual(args, {});
      }
      return call;
    };
    const required = check(r, ['set_mode', 'reset']);
    const named = check(await ask({ type: 'function', function: { name: 'set_mode' } }), ['set_mode']);
    // Streamed: the same call (the same seed), in delta.tool_calls.
    const calls = [];
    let finish = null, text = '';
    for await (const c of await ask('required', { stream: true })) {
      const d = c.choices[0]?.delta ?? {};
      text += d.content ?? '';
      for (const t of d.tool_calls ?? []) {
        calls[t.index] ??= { id: '', name: '', arguments: '' };
        calls[t.index].id += t.id ?? '';
        calls[t.index].name += t.function?.name ?? '';
        calls[t.index].arguments += t.function?.arguments ?? '';
      }
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    if (required) {
      assert.equal(finish, 'tool_calls');
      assert.equal(text, '');
      assert.equal(calls.length, 1);
      assert.equal(calls[0].name, required.function.name);
      assert.equal(calls[0].arguments, required.function.arguments);
    }
    console.log(`toolCalls: required ${required ? required.function.name : 'cut by length'}, ` +
      `named ${named ? JSON.stringify(named.function.arguments) : 'cut by length'}`);
    // auto and none answer (a random model's text is content, unless it happens to be a call);
    // a history with the assistant's call and the tool's answer is taken.
    for (const choice of ['auto', 'none']) {
      const a = await ask(choice, { max_completion_tokens: 8 });
      assert.ok(['stop', 'length', 'tool_calls'].includes(a.choices[0].finish_reason));
      if (choice === 'none') assert.equal(a.choices[0].message.tool_calls, undefined);
    }
    const history = [...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'set_mode', arguments: '{"mode": "fast", "on": true}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'done' }];
    // (The tiny checkpoint's Llama 2 template has no tool role and says so through
    // raise_exception: a 400 naming messages; test_server renders such a history.)
    try {
      const h = await client.chat.completions.create({ model, messages: history, tools, max_completion_tokens: 4 });
      assert.equal(h.object, 'chat.completion');
    } catch (e) {
      assert.ok(e instanceof OpenAI.BadRequestError && e.param === 'messages', String(e));
      console.log(`toolCalls: the template refuses the tool history: ${e.message}`);
    }
    await assert.rejects(ask({ type: 'function', function: { name: 'nope' } }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice' && /nope/.test(e.message));
    await assert.rejects(
      client.chat.completions.create({ model, messages, tools: [{ type: 'function', function: { name: 'a b' } }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].function.name');
  },
  async chat() {
    const messages = [{ role: 'user', content: 'Say something.' }];
    let r;
    try {
      r = await client.chat.completions.create({ model, messages, max_completion_tokens: 5, temperature: 0 });
    } catch (e) {
      // A checkpoint without tokenizer.json cannot render chat: a clear 400 naming messages.
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, 'messages');
      assert.match(e.message, /no tokenizer/);
      console.log('chat: refused (this checkpoint has no tokenizer.json), as it must be');
      return;
    }
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.equal(r.usage.completion_tokens <= 5, true);
    const s = await client.chat.completions.create({ model, messages, max_completion_tokens: 5, temperature: 0, stream: true });
    let text = '', role = null;
    for await (const c of s) {
      if (c.choices[0]?.delta?.role) role = c.choices[0].delta.role;
      text += c.choices[0]?.delta?.content ?? '';
    }
    assert.equal(role, 'assistant');
    assert.equal(text, r.choices[0].message.content);
  },
  async concurrentRequestsGetWhatTheyGetAlone() {
    const prompts = Array.from({ length: 8 }, (_, i) => Array.from({ length: 5 + 3 * i }, (_, t) => (7 + 31 * t + 101 * i) % 1000));
    const alone = [];
    for (const p of prompts) alone.push((await streamIds(p, 10)).ids);
    const together = await Promise.all(prompts.map((p) => streamIds(p, 10)));
    together.forEach((t, i) => assert.deepEqual(t.ids, alone[i], `request ${i}`));
  },
  async abortedStreamFreesItsBlocks() {
    const controller = new AbortController();
    const s = await client.completions.create(
      { model, prompt, max_tokens: 3000, ignore_eos: true, stream: true }, { signal: controller.signal });
    let chunks = 0;
    try {
      for await (const c of s) {
        if (++chunks === 3) {
          assert.ok((await metric('flashserve_kv_blocks_used')) > 0);
          controller.abort();
        }
      }
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
    }
    // The client's loop ends quietly on an abort; the 3000 tokens did not all come.
    assert.ok(chunks < 100, `${chunks} chunks after the abort`);
    const ms = await untilIdle();
    console.log(`aborted stream: blocks back to 0 ${ms} ms after the abort`);
  },
  async refusalsAreTypedErrors() {
    await assert.rejects(client.completions.create({ model: 'gpt-5', prompt, max_tokens: 2 }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
    await assert.rejects(client.completions.create({ model, prompt, max_tokens: -1 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_tokens');
    await assert.rejects(client.completions.create({ model, prompt, n: 129 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
    await assert.rejects(client.completions.create({ model, prompt: Array(100000).fill(1) }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' && /maximum context length is \d+/.test(e.message));
  },
  async severalChoices() {
    // n sampled choices, whole and streamed, as the SDK reads them: one per index, each complete.
    const r = await client.completions.create({ model, prompt, max_tokens: 5, n: 3, temperature: 1, seed: 3, ignore_eos: true });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.ok(r.choices.every((c) => c.finish_reason === 'length' && c.token_ids.length === 5));
    assert.equal(r.usage.completion_tokens, 15);
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, n: 2, stream: true,
      stream_options: { include_usage: true }, ignore_eos: true,
    });
    const text = ['', ''], finish = [null, null];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text[c.index] += c.delta.content ?? '';
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    }
    assert.deepEqual(finish, ['length', 'length']);
    assert.equal(usage.completion_tokens, 8);
    assert.ok(text.every((t) => typeof t === 'string'));
  },
  async logprobs() {
    // Completions: logprobs 3 at temperature 0; the sampled token is the most likely one.
    const r = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 6);
    assert.equal(lp.token_logprobs.length, 6);
    assert.equal(lp.top_logprobs.length, 6);
    assert.deepEqual(lp.text_offset.slice(0, 1), [0]);
    for (let i = 0; i < 6; ++i) {
      const top = lp.top_logprobs[i];
      const values = Object.values(top);
      assert.ok(values.length >= 1 && values.length <= 4, JSON.stringify(top));
      assert.ok(lp.token_logprobs[i] <= 0);
      assert.equal(lp.token_logprobs[i], Math.max(...values));
      if (i > 0) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
    }
    // The stream carries the same logprobs, chunk by chunk.
    const s = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 3, stream: true });
    const streamed = [];
    for await (const c of s) for (const ch of c.choices) streamed.push(...(ch.logprobs?.token_logprobs ?? []));
    assert.deepEqual(streamed, lp.token_logprobs);
    // Not asked: null.
    const plain = await client.completions.create({ model, prompt, max_tokens: 2 });
    assert.equal(plain.choices[0].logprobs, null);
    await assert.rejects(client.completions.create({ model, prompt, max_tokens: 2, logprobs: 6 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'logprobs');

    // Chat: logprobs true with top_logprobs 2, streamed and not.
    const messages = [{ role: 'user', content: 'Say something.' }];
    let c;
    try {
      c = await client.chat.completions.create({ model, messages, max_completion_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
    } catch (e) {
      assert.ok(e instanceof OpenAI.BadRequestError && e.param === 'messages', String(e));
      console.log('logprobs: chat refused (this checkpoint has no tokenizer.json)');
      return;
    }
    const content = c.choices[0].logprobs.content;
    // One entry per token of the text: the eos token (finish 'stop' here, no stop strings) has none.
    assert.equal(content.length, c.usage.completion_tokens - (c.choices[0].finish_reason === 'stop' ? 1 : 0));
    for (const t of content) {
      assert.equal(typeof t.token, 'string');
      assert.ok(Array.isArray(t.bytes) && t.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 2);
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
      assert.equal(t.top_logprobs[0].logprob, t.logprob);  // greedy
    }
    const cs = await client.chat.completions.create({ model, messages, max_completion_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2, stream: true });
    const got = [];
    for await (const chunk of cs) got.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(got, content);
    await assert.rejects(client.chat.completions.create({ model, messages, logprobs: true, top_logprobs: 21 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'top_logprobs');
    await assert.rejects(client.chat.completions.create({ model, messages, top_logprobs: 2 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'top_logprobs');
  },
  async models() {
    const list = await client.models.list();
    // server_test.sh serves the model under two names (--served-model-name tiny tiny-alias).
    assert.deepEqual(list.data.map((m) => m.id), [model, `${model}-alias`]);
  },
};

let failed = 0;
for (const [name, fn] of Object.entries(tests)) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
await untilIdle();
process.exit(failed ? 1 : 0);
