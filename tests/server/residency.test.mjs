// The residency owner end to end: with it (the default), without it (TENSORFOLD_NO_RESIDENCY=1 and
// --no-residency: no owner at all) the server starts, serves, and gives the same greedy answers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metric } from './helpers.mjs';

const model = 'tiny-next';
const servers = {};

before(async () => {
  [servers.held, servers.env, servers.flag] = await Promise.all([
    startServer(['--residency-tick', '100ms']),
    startServer([], { TENSORFOLD_NO_RESIDENCY: '1' }),
    startServer(['--no-residency']),
  ]);
});
after(async () => {
  await Promise.all(Object.values(servers).map((s) => s.stop()));
});

const client = (s) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });

async function answers(s) {
  const c = client(s);
  const out = [];
  for (const content of ['What is 123 + 456?', 'Tell me a story about a dog.', 'Name three colours.']) {
    for (const thinking of [true, false]) {
      const r = await c.chat.completions.create({
        model, messages: [{ role: 'user', content }], temperature: 0, max_tokens: 48,
        chat_template_kwargs: { enable_thinking: thinking },
      });
      const m = r.choices[0].message;
      out.push({ content: m.content, reasoning: m.reasoning_content ?? '', finish: r.choices[0].finish_reason, usage: r.usage });
    }
  }
  const p = await c.completions.create({ model, prompt: 'Once upon a time', temperature: 0, max_tokens: 32 });
  out.push({ text: p.choices[0].text, usage: p.usage });
  return out;
}

test('the same greedy answers with residency, with TENSORFOLD_NO_RESIDENCY=1 and with --no-residency', async () => {
  const [held, env, flag] = await Promise.all([answers(servers.held), answers(servers.env), answers(servers.flag)]);
  assert.ok(held.some((a) => (a.content ?? a.text).length > 0));
  assert.deepEqual(env, held);
  assert.deepEqual(flag, held);
});

test('with residency the set holds the weights and follows the states; without it there is no owner', async () => {
  assert.equal(await metric(servers.held.url, 'tensorfold_residency_active'), 1);
  const text = await (await fetch(`${servers.held.url}/metrics`)).text();
  const held = Number(text.match(/^tensorfold_residency_held_bytes\{memory="host"\} (\d+)/m)[1]);
  assert.ok(held > 28e6, `held ${held} bytes: the weights alone are 29 MB`);
  assert.equal(await metric(servers.held.url, 'tensorfold_residency_unheld_buffers_total'), 0);
  // Ticks run while idle (every 100 ms here).
  const t0 = await metric(servers.held.url, 'tensorfold_residency_ticks_total');
  await new Promise((r) => setTimeout(r, 400));
  assert.ok((await metric(servers.held.url, 'tensorfold_residency_ticks_total')) > t0);
  assert.equal(await metric(servers.held.url, 'tensorfold_residency_pages_found_out_total'), 0);
  for (const s of [servers.env, servers.flag]) {
    assert.equal(await metric(s.url, 'tensorfold_residency_active'), 0);
    assert.equal(await metric(s.url, 'tensorfold_residency_ticks_total'), undefined);
    assert.match(s.log(), /residency: off/);
    assert.doesNotMatch(s.log(), /\[warn/);
  }
  assert.doesNotMatch(servers.held.log(), /\[warn|\[error/);
});
