// Soak (bounded): three 20-turn chats at once beside a stream decoding a long reply. Every turn
// equals the same request run alone (a server with --parallel 1 and no pool, requests one at a
// time) and every turn after the first resumes a kept state.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metric } from './helpers.mjs';

let on, alone, con, calone;
const model = 'tiny-next';
const TURNS = 20;
const SYSTEM = 'You are a careful assistant. You copy text exactly, you add numbers step by step, ' +
  'and you remember what the user said earlier in the chat. Keep every answer short and plain. '.repeat(2);

before(async () => {
  [on, alone] = await Promise.all([startServer(['--parallel', '4']),
    startServer(['--parallel', '1', '--state-cache-bytes', '0'])]);
  con = new OpenAI({ baseURL: `${on.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  calone = new OpenAI({ baseURL: `${alone.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await Promise.all([on.stop(), alone.stop()]); });

function userMessage(chat, turn) {
  const a = (chat * 97 + turn * 31) % 900 + 10, b = (chat * 13 + turn * 57) % 90 + 5;
  const kinds = [`What is ${a} + ${b}?`, `Copy this: chat ${chat} turn ${turn} says hello to the river.`,
    `Reverse these words: stone ${turn} apple ${chat} cloud.`, 'What did I ask you first?'];
  return kinds[turn % kinds.length];
}

const params = (messages) => ({ model, messages, temperature: 0, max_tokens: 32, chat_template_kwargs: { enable_thinking: false } });

test('three 20-turn chats beside a long stream: every turn equals alone and resumes', { timeout: 300000 }, async () => {
  // The long stream: a story decoded while the chats run.
  const long = (async () => {
    const s = await con.chat.completions.create({
      model, stream: true, temperature: 0, max_tokens: 1500, ignore_eos: true,
      messages: [{ role: 'user', content: 'Tell me a long story about a dog.' }],
    });
    let n = 0;
    for await (const c of s) for (const ch of c.choices) if (ch.delta.content) n++;
    return n;
  })();
  const transcripts = await Promise.all([0, 1, 2].map(async (chat) => {
    const messages = [{ role: 'system', content: SYSTEM }];
    const turns = [];
    for (let turn = 0; turn < TURNS; turn++) {
      messages.push({ role: 'user', content: userMessage(chat, turn) });
      const r = await con.chat.completions.create(params(messages));
      const content = r.choices[0].message.content;
      turns.push({ messages: structuredClone(messages), content, cached: r.usage.prompt_tokens_details.cached_tokens });
      messages.push({ role: 'assistant', content });
    }
    return turns;
  }));
  assert.ok((await long) > 100);
  for (const [chat, turns] of transcripts.entries()) {
    for (const [turn, t] of turns.entries()) {
      const r = await calone.chat.completions.create(params(t.messages));
      assert.equal(t.content, r.choices[0].message.content, `chat ${chat} turn ${turn}`);
      if (turn > 0) assert.ok(t.cached > 0, `chat ${chat} turn ${turn} resumed nothing`);
    }
  }
  assert.ok((await metric(on.url, 'tensorfold_state_cache_hits_total')) >= 3 * (TURNS - 1));
});
