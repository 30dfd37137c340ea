// API key, body limit, queue limit and shutdown: each on its own server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, post } from './helpers.mjs';

const model = 'tiny-next';
const STORY = [{ role: 'user', content: 'Tell me a story about a dog.' }];

test('API key: missing or wrong -> 401; right -> 200; /health stays open', async () => {
  const srv = await startServer(['--api-key', 'sekret']);
  try {
    const bad = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const none = await post(srv.url, '/v1/chat/completions', { messages: STORY });
    assert.equal(none.status, 401);
    assert.equal(none.json.error.type, 'authentication_error');
    const good = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const r = await good.chat.completions.create({ model, messages: STORY, max_tokens: 3 });
    assert.equal(r.usage.completion_tokens, 3);
    assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  } finally {
    await srv.stop();
  }
});

test('body over the limit -> 413 in the error shape', async () => {
  const srv = await startServer(['--max-body-bytes', '1000']);
  try {
    const r = await post(srv.url, '/v1/chat/completions', { messages: [{ role: 'user', content: 'x'.repeat(5000) }] });
    assert.equal(r.status, 413);
    assert.ok(r.json.error.message.includes('too large'));
    const ok = await post(srv.url, '/v1/chat/completions', { messages: STORY, max_tokens: 2 });
    assert.equal(ok.status, 200);
  } finally {
    await srv.stop();
  }
});

test('queue full -> 429 with Retry-After', async () => {
  const srv = await startServer(['--parallel', '1', '--max-queue', '0']);
  try {
    const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const s = await client.chat.completions.create({ model, messages: STORY, max_tokens: 100000, ignore_eos: true, stream: true, temperature: 1 });
    const it = s[Symbol.asyncIterator]();
    await it.next();  // the stream runs and holds the only slot
    const r = await post(srv.url, '/v1/chat/completions', { messages: STORY, max_tokens: 2 });
    assert.equal(r.status, 429);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(r.json.error.type, 'rate_limit_error');
    s.controller.abort();
  } finally {
    await srv.stop();
  }
});

test('SIGTERM with a stream open: the stream ends cleanly and the server exits within 3 s', async () => {
  const srv = await startServer();
  const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0 });
  const s = await client.chat.completions.create({ model, messages: STORY, max_tokens: 100000, ignore_eos: true, stream: true, temperature: 1 });
  const it = s[Symbol.asyncIterator]();
  await it.next();
  const t0 = Date.now();
  const code = await srv.stop('SIGTERM');
  const ms = Date.now() - t0;
  assert.equal(code, 0, srv.log());
  assert.ok(ms < 3000, `took ${ms} ms`);
  let finished = false;
  for (;;) {
    const { value, done } = await it.next();
    if (done) break;
    if (value.choices[0]?.finish_reason) finished = true;
  }
  assert.ok(finished, 'the open stream got a final chunk');
  assert.ok(!/\[error\]|\[critical\]/.test(srv.log()), srv.log());
});
