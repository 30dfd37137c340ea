// Kept states through the API: a chat's later turns resume (usage.prompt_tokens_details.cached_tokens
// > 0), other chats with the same system prompt resume from it, and every answer equals that of a
// server with the pool turned off (--state-cache-bytes 0), streamed or not.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metric } from './helpers.mjs';

let on, off, con, coff;
const model = 'tiny-next';
const SYSTEM = 'You are a careful assistant. You copy text exactly, you add numbers step by step, ' +
  'and you remember what the user said earlier in the chat. Keep every answer short and plain. '.repeat(2);
const USER = ['Copy this: the quick brown fox jumps over the lazy dog.', 'What is 245 + 318?',
  'Reverse these words: apple river stone.', 'What did I ask you to copy first?'];

before(async () => {
  [on, off] = await Promise.all([startServer(['--parallel', '2']),
    startServer(['--parallel', '2', '--state-cache-bytes', '0'])]);
  con = new OpenAI({ baseURL: `${on.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  coff = new OpenAI({ baseURL: `${off.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await Promise.all([on.stop(), off.stop()]); });

async function ask(client, messages, stream) {
  const params = { model, messages, temperature: 0, max_tokens: 48, chat_template_kwargs: { enable_thinking: false } };
  if (!stream) {
    const r = await client.chat.completions.create(params);
    return { content: r.choices[0].message.content, usage: r.usage };
  }
  const s = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '', usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) content += ch.delta.content ?? '';
  }
  return { content, usage };
}

for (const stream of [false, true]) {
  test(`a ${stream ? 'streamed' : 'plain'} chat resumes every turn after the first and answers as if fresh`, async () => {
    const messages = [{ role: 'system', content: SYSTEM }];
    for (let turn = 0; turn < USER.length; turn++) {
      messages.push({ role: 'user', content: USER[turn] });
      const a = await ask(con, messages, stream);
      const b = await ask(coff, messages, stream);
      assert.equal(a.content, b.content, `turn ${turn}`);
      assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
      assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0);
      // The system prompt alone is over 64 tokens, so even a first turn may resume from the
      // system-prompt state another chat kept; every later turn must.
      if (turn > 0) assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0, `turn ${turn}`);
      assert.ok(a.usage.prompt_tokens_details.cached_tokens < a.usage.prompt_tokens);
      messages.push({ role: 'assistant', content: a.content });
    }
  });
}

test('a new chat with the same system prompt resumes from its kept state; metrics count it', async () => {
  const hits0 = await metric(on.url, 'tensorfold_state_cache_hits_total');
  const a = await ask(con, [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'What is 7 + 8?' }], false);
  assert.ok(a.usage.prompt_tokens_details.cached_tokens >= 64);
  assert.ok((await metric(on.url, 'tensorfold_state_cache_hits_total')) > hits0);
  assert.ok((await metric(on.url, 'tensorfold_state_cache_entries')) > 0);
  assert.ok((await metric(on.url, 'tensorfold_state_cache_bytes')) > 0);
  assert.equal(await metric(off.url, 'tensorfold_state_cache_hits_total'), 0);
});
