// Malformed HTTP on raw sockets: each gets an error status or a closed connection, and the server
// keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer } from './helpers.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv.stop(); });

// Sends raw bytes (in pieces, with pauses) and returns what came back before the server closed
// or `ms` passed.
function raw(pieces, ms = 3000) {
  return new Promise((resolve) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    let data = '';
    const finish = () => { sock.destroy(); resolve(data); };
    const timer = setTimeout(finish, ms);
    sock.on('data', (d) => (data += d.toString('latin1')));
    sock.on('close', () => { clearTimeout(timer); resolve(data); });
    sock.on('error', () => {});
    sock.on('connect', async () => {
      for (const p of pieces) {
        if (typeof p === 'number') await new Promise((r) => setTimeout(r, p));
        else if (!sock.destroyed) sock.write(p);
      }
    });
  });
}

async function stillServes() {
  const r = await fetch(`${srv.url}/health`);
  assert.equal(r.status, 200);
}

function status(resp) {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(resp);
  return m ? Number(m[1]) : null;
}

function request(body, extraHeaders = '') {
  return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(body, 'latin1')}\r\nConnection: close\r\n${extraHeaders}\r\n` + body;
}

test('bad request line', async () => {
  const r = await raw(['GARBAGE\r\n\r\n']);
  assert.ok(r === '' || status(r) >= 400, r);
  await stillServes();
});

test('huge header', async () => {
  const r = await raw([`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200000)}\r\n\r\n`]);
  assert.ok(r === '' || status(r) >= 400, r.slice(0, 200));
  await stillServes();
});

test('slow partial body, then the client goes away', async () => {
  const r = await raw([request('{"messages": [').slice(0, -5), 300, 'xx', 300], 1000);
  assert.ok(r === '' || status(r) >= 400, r);
  await stillServes();
});

test('invalid UTF-8 inside a JSON string', async () => {
  const body = '{"messages": [{"role": "user", "content": "bad \xff\xfe bytes"}]}';
  const r = await raw([Buffer.from(request(body), 'latin1')]);
  assert.equal(status(r), 400, r);
  assert.match(r, /not valid JSON/);
  await stillServes();
});

test('deeply nested JSON', async () => {
  const depth = 100000;  // copying or destroying such a value recursively would overflow the stack
  const body = '{"messages": ' + '['.repeat(depth) + ']'.repeat(depth) + '}';
  const r = await raw([request(body)], 20000);  // generous: the ASan build on a busy machine is slow
  assert.equal(status(r), 400, r.slice(0, 300));
  assert.match(r, /nests arrays\/objects deeper than/);
  await stillServes();
});

test('wrong content length (longer than the body) and a body that is not JSON', async () => {
  const r1 = await raw(['POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{}'], 1500);
  assert.ok(r1 === '' || status(r1) >= 400, r1);
  const r2 = await raw([request('hello')]);
  assert.equal(status(r2), 400);
  await stillServes();
});
