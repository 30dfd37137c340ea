// MTP drafting through the API: a server drafting (--draft-max 3, fixed depth, and beside other
// requests too: --draft-max-streams 0) gives the same greedy answers as the same server asked with
// "draft": false and as a server with drafting off, on chat and completions, streamed or not, alone
// and concurrently, multi-turn (resumed from kept states); seeded sampling gives the same reply
// with and without drafts; /metrics counts drafts and accepted drafts (copy prompts: most are
// accepted), and nothing with drafting off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metric } from './helpers.mjs';

let on, off, con, coff;
const model = 'tiny-next';
const COPY = [
  'Copy this text exactly: the harbour was quiet before dawn and two boats rocked against the pier.',
  'Copy this: seven green lamps stood in a row along the north wall of the old paper mill.',
  'What is 245 + 318?',
  'Continue this text: she folded the map twice, put it in her coat and started up the hill.',
];

before(async () => {
  [on, off] = await Promise.all([
    startServer(['--parallel', '4', '--draft-max', '3', '--draft-fixed', '--draft-max-streams', '0']),
    startServer(['--parallel', '4', '--draft-max', '3', '--no-draft']),
  ]);
  con = new OpenAI({ baseURL: `${on.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  coff = new OpenAI({ baseURL: `${off.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await Promise.all([on.stop(), off.stop()]); });

async function chat(client, messages, extra = {}, stream = false) {
  const params = { model, messages, temperature: 0, max_tokens: 64,
    chat_template_kwargs: { enable_thinking: false }, ...extra };
  if (!stream) {
    const r = await client.chat.completions.create(params);
    return r.choices[0].message.content + '|' + r.choices[0].finish_reason + '|' + r.usage.completion_tokens;
  }
  const s = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '', finish = null, usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      content += ch.delta.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return content + '|' + finish + '|' + usage.completion_tokens;
}

test('drafting is on in one server, off in the other', async () => {
  assert.equal(await metric(on.url, 'tensorfold_draft_enabled'), 1);
  assert.equal(await metric(off.url, 'tensorfold_draft_enabled'), 0);
});

test('greedy chat answers: drafted == "draft": false == drafting off, streamed or not', async () => {
  const before = await metric(on.url, 'tensorfold_draft_tokens_total');
  for (const q of COPY) {
    const messages = [{ role: 'user', content: q }];
    for (const stream of [false, true]) {
      const d = await chat(con, messages, {}, stream);
      assert.equal(await chat(con, messages, { draft: false }, stream), d, q);
      assert.equal(await chat(coff, messages, {}, stream), d, q);
    }
  }
  assert.ok(await metric(on.url, 'tensorfold_draft_tokens_total') > before);
});

test('completions: drafted == "draft": false, with a stop string and max_tokens', async () => {
  for (const max_tokens of [1, 5, 17, 40]) {
    const p = { model, prompt: 'Copy this text exactly: one two three four five six seven eight nine ten.\n',
      temperature: 0, max_tokens, stop: ['nine'] };
    const a = await con.completions.create(p);
    const b = await con.completions.create({ ...p, draft: false });
    assert.equal(a.choices[0].text, b.choices[0].text, `max_tokens ${max_tokens}`);
    assert.equal(a.choices[0].finish_reason, b.choices[0].finish_reason);
    assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
  }
});

test('concurrent drafting and plain requests, multi-turn: same answers as drafting off', async () => {
  const chats = COPY.map((q) => [{ role: 'system', content: 'You copy text exactly and answer briefly. '.repeat(4) },
    { role: 'user', content: q }]);
  for (let turn = 0; turn < 2; turn++) {
    const got = await Promise.all(chats.map((m, i) => chat(con, m, i % 2 ? { draft: false } : {})));
    const want = await Promise.all(chats.map((m) => chat(coff, m)));
    assert.deepEqual(got, want, `turn ${turn}`);
    chats.forEach((m, i) => {
      m.push({ role: 'assistant', content: got[i].split('|')[0] });
      m.push({ role: 'user', content: 'Copy your last answer again.' });
    });
  }
});

test('seeded sampling: the same reply with and without drafts', async () => {
  const messages = [{ role: 'user', content: COPY[3] }];
  for (const seed of [1, 2, 3]) {
    const p = { temperature: 0.8, top_p: 0.95, seed };
    assert.equal(await chat(con, messages, p), await chat(con, messages, { ...p, draft: false }), `seed ${seed}`);
  }
});

test('metrics: drafts proposed and accepted; none with drafting off', async () => {
  const drafted = await metric(on.url, 'tensorfold_draft_tokens_total');
  const accepted = await metric(on.url, 'tensorfold_draft_accepted_tokens_total');
  const steps = await metric(on.url, 'tensorfold_draft_steps_total');
  assert.ok(steps > 0 && drafted >= steps && accepted > 0 && accepted <= drafted,
    `steps ${steps} drafted ${drafted} accepted ${accepted}`);
  assert.ok(accepted / drafted > 0.3, `acceptance ${accepted / drafted}`);  // copy prompts
  assert.equal(await metric(off.url, 'tensorfold_draft_tokens_total'), 0);
  assert.equal(await metric(off.url, 'tensorfold_draft_steps_total'), 0);
});

test('"draft" must be a boolean', async () => {
  await assert.rejects(con.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], draft: 'yes' }),
    (e) => e.status === 400);
});
