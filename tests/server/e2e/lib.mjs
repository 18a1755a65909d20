// lib.mjs - shared by the end-to-end suite and the load benchmark: start
// `petrel serve` on a free loopback port, stop it, read its memory, and
// drive many concurrent streaming clients.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

export const PETREL = process.env.PETREL_BIN || 'build/petrel';
export const SOURCE_DIR = process.env.PETREL_SOURCE_DIR || process.cwd();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let serial = 0;

// Starts `petrel serve --port 0` with extra flags; resolves once the port
// file appears.  The server's stderr is kept for failure messages.
// opts.nofile: run it under `ulimit -n` of that many descriptors.
export async function startServer(extra = [], env = {}, opts = {}) {
  const portFile = path.join(os.tmpdir(), `petrel-e2e-${process.pid}-${serial++}.port`);
  rmSync(portFile, { force: true });
  const args = ['serve', '--port', '0', '--port-file', portFile, ...extra];
  // opts.wrap(args) -> [cmd, argv] runs the server under another command
  const [cmd, argv] = opts.wrap ? opts.wrap(args)
    : opts.nofile
    ? ['sh', ['-c', `ulimit -n ${opts.nofile} && exec "$0" "$@"`, PETREL, ...args]]
    : [PETREL, args];
  const fullEnv = { ...process.env, ...env };
  for (const k of Object.keys(fullEnv)) if (fullEnv[k] === undefined) delete fullEnv[k];
  const proc = spawn(cmd, argv, { stdio: ['ignore', 'ignore', 'pipe'], env: fullEnv });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  for (let i = 0; ; i++) {
    // the port file is written after the start-up lines; wait for those
    // to reach us too, so tests may read them at once
    if (existsSync(portFile) && readFileSync(portFile, 'utf8').endsWith('\n') && /listening on/.test(log)) break;
    if (proc.exitCode !== null) throw new Error(`petrel serve exited ${proc.exitCode}:\n${log}`);
    if (i > 2400) throw new Error(`petrel serve did not start in 120 s:\n${log}`);
    await sleep(50);
  }
  const port = Number(readFileSync(portFile, 'utf8'));
  rmSync(portFile, { force: true });
  const url = `http://127.0.0.1:${port}`;
  return {
    port, proc, url, exited,
    log: () => log,
    client: (apiKey = 'sk-none') => new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0, timeout: 120000 }),
    // Sends sig and resolves with the exit status (code, sig).
    async stop(sig = 'SIGTERM') {
      if (proc.exitCode === null) proc.kill(sig);
      return exited;
    },
  };
}

// Resolves once the server's log matches re; fails after ms with the log.
// For lines a server thread writes on its own time (no fixed sleeps).
export async function waitForLog(srv, re, ms = 60000) {
  for (const t0 = Date.now(); !re.test(srv.log());) {
    if (srv.proc.exitCode !== null || Date.now() - t0 > ms)
      throw new Error(`no ${re} in the server's log after ${Date.now() - t0} ms:\n${srv.log()}`);
    await sleep(50);
  }
}

// Resident set size of a process in KiB (Linux).
export function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

export function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  const i = Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1);
  return sorted[Math.max(0, i)];
}

export const PROMPTS = [
  'Once upon a time', 'Lily wanted to', 'The little dog', 'One day, a boy named Tim',
  'The sun was shining', 'Tom and Sue', 'A big red ball', 'In the park',
];

export function chatBody(prompt, maxTokens) {
  return {
    model: 'stories260K',
    messages: [{ role: 'user', content: prompt }],
    temperature: 0,
    max_tokens: maxTokens,
  };
}

// One streamed chat completion: the text, client-side time to the first
// content chunk, and the server's timings.
export async function streamChat(client, prompt, maxTokens) {
  const t0 = performance.now();
  let ttft = null, text = '', finish = null, timings = null, usage = null;
  const stream = await client.chat.completions.create({
    ...chatBody(prompt, maxTokens), stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c?.delta?.content) {
      if (ttft === null) ttft = performance.now() - t0;
      text += c.delta.content;
    }
    if (c?.finish_reason) finish = c.finish_reason;
    if (chunk.usage) usage = chunk.usage;
    if (chunk.timings) timings = chunk.timings;
  }
  if (ttft === null) ttft = performance.now() - t0;
  return { text, ttft, finish, timings, usage, total: performance.now() - t0 };
}

// n concurrent streaming clients over the prompts; each answer is checked
// against want (prompt -> text).  Returns TTFT figures in ms.
export async function loadRound(server, n, maxTokens, want) {
  const client = server.client();
  const results = await Promise.all(Array.from({ length: n }, (_, i) =>
    streamChat(client, PROMPTS[i % PROMPTS.length], maxTokens)));
  const wrong = [];
  results.forEach((r, i) => {
    const p = PROMPTS[i % PROMPTS.length];
    if (want && r.text !== want.get(p)) wrong.push({ i, prompt: p, got: r.text, want: want.get(p) });
  });
  const ttft = results.map((r) => r.ttft).sort((a, b) => a - b);
  const serverTtft = results.map((r) => r.timings?.ttft_ms ?? NaN).sort((a, b) => a - b);
  const wall = Math.max(...results.map((r) => r.total));
  const tokens = results.reduce((s, r) => s + (r.usage?.completion_tokens ?? 0), 0);
  return {
    clients: n, wrong,
    ttft_p50_ms: percentile(ttft, 50), ttft_p99_ms: percentile(ttft, 99),
    server_ttft_p50_ms: percentile(serverTtft, 50), server_ttft_p99_ms: percentile(serverTtft, 99),
    wall_ms: wall, completion_tokens: tokens, tokens_per_second: tokens / (wall / 1000),
  };
}

// The answers of single, non-streamed requests: the reference for loads.
export async function referenceAnswers(server, maxTokens) {
  const client = server.client();
  const want = new Map();
  for (const p of PROMPTS) {
    const r = await client.chat.completions.create(chatBody(p, maxTokens));
    want.set(p, r.choices[0].message.content);
  }
  return want;
}
