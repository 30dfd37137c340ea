// Starts `tensorfold serve` on a free loopback port and waits until /health says ok.
import { spawn } from 'node:child_process';
import net from 'node:net';

export const BIN = process.env.TF_BIN ?? 'build/release/apps/tensorfold';
export const MODEL = process.env.TF_MODEL ?? 'models/tiny-next';

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

export async function startServer(extra = [], env = {}) {
  const port = await freePort();
  const proc = spawn(BIN, ['serve', '--model', MODEL, '--port', String(port), '--threads', '2', ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  let log = '';
  proc.stdout.on('data', (d) => (log += d));
  proc.stderr.on('data', (d) => (log += d));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 20000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`server exited ${proc.exitCode}: ${log}`);
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`server not healthy in 20 s: ${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    port,
    proc,
    log: () => log,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((r) => proc.once('exit', (code, sig) => r(code ?? sig)));
      proc.kill(signal);
      return done;
    },
  };
}

// POST a raw body and return {status, headers, json|text}.
export async function post(url, path, body, headers = {}) {
  const r = await fetch(url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, headers: r.headers, json, text };
}

export async function metric(url, name) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : undefined;
}
