// metrics.test.mjs - GET /metrics read the way Prometheus reads it: the
// exposition parsed by parse-prometheus-text-format (npm), scraped during
// a burst of concurrent requests from the official openai client and after
// it, with every counter equal to what the responses told the clients
// (requests by finish reason, prompt / generated / cached tokens) and the
// histograms holding one observation per request (TTFT, end-to-end) or per
// token after the first (inter-token).  /metrics obeys the API key and the
// Host check like /v1/*; /health says ready, and "loading" (503) while
// the model loads: the model is dummy weights whose config.json is a FIFO,
// so its load waits, deterministically, until the test writes the config;
// then start-up ends (dummy weights have no tokenizer) with status 1.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { spawn, execFileSync } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { startServer, PROMPTS, PETREL, SOURCE_DIR } from './lib.mjs';

const KEY = 'sk-metrics-test';
const MODEL = 'stories260K';

async function scrape(srv) {
  const r = await fetch(`${srv.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const families = parsePrometheusTextFormat(await r.text()); // throws on a malformed line
  return Object.fromEntries(families.map((f) => [f.name, f]));
}

// The one sample of a family whose labels include `labels`.
function value(m, name, labels = {}) {
  const f = m[name];
  assert.ok(f, `${name} is missing`);
  const s = f.metrics.find((x) => Object.entries(labels).every(([k, v]) => x.labels?.[k] === v));
  assert.ok(s, `${name}${JSON.stringify(labels)} is missing`);
  assert.equal(s.labels.model_name, MODEL);
  return Number(s.value);
}

// A histogram's buckets, checked cumulative; returns the +Inf count.
function observations(m, name) {
  const f = m[name];
  assert.equal(f?.type, 'HISTOGRAM', `${name} is not a histogram`);
  const b = Object.entries(f.metrics[0].buckets).map(([le, v]) => [le === "+Inf" ? Infinity : Number(le), Number(v)])
    .sort((x, y) => x[0] - y[0]); // an object lists integer-like keys ("1", "10") first
  for (let i = 1; i < b.length; i++) {
    assert.ok(b[i][0] > b[i - 1][0], `${name}: bounds ascend`);
    assert.ok(b[i][1] >= b[i - 1][1], `${name}: buckets are cumulative`);
  }
  assert.equal(b[b.length - 1][0], Infinity);
  return b[b.length - 1][1];
}

describe('/metrics', () => {
  let srv;
  before(async () => { srv = await startServer(['--threads', '2', '--parallel', '4', '-q'], { PETREL_API_KEY: KEY }); });
  after(async () => { await srv.stop('SIGTERM'); });

  test('it follows the API key and the Host check', async () => {
    assert.equal((await fetch(`${srv.url}/metrics`)).status, 401);
    const wrong = await fetch(`${srv.url}/metrics`, { headers: { authorization: 'Bearer nope' } });
    assert.equal(wrong.status, 401);
    // fetch() will not send a foreign Host; node:http will
    const rebound = await new Promise((resolve, reject) => {
      http.get({ port: srv.port, host: '127.0.0.1', path: '/metrics',
        headers: { authorization: `Bearer ${KEY}`, host: 'evil.example' } }, (r) => { r.resume(); resolve(r.statusCode); })
        .on('error', reject);
    });
    assert.equal(rebound, 403);
    const h = await (await fetch(`${srv.url}/health`)).json();
    assert.equal(h.status, 'ok');
  });

  test('counters equal what concurrent clients were told', async () => {
    const before0 = await scrape(srv);
    assert.equal(value(before0, 'petrel:prompt_tokens_total'), 0);
    assert.equal(observations(before0, 'petrel:time_to_first_token_seconds'), 0);
    const total = value(before0, 'petrel:kv_blocks_total');
    assert.ok(total > 0);

    const client = srv.client(KEY);
    const N = 24;
    const jobs = [];
    for (let i = 0; i < N; i++) {
      const prompt = PROMPTS[i % PROMPTS.length];
      const max = 4 + (i * 7) % 40;
      if (i % 3 === 0) {
        jobs.push(client.completions.create({ model: MODEL, prompt, max_tokens: max, temperature: 0 })
          .then((r) => ({ usage: r.usage, finish: r.choices[0].finish_reason })));
      } else {
        jobs.push((async () => {
          const s = await client.chat.completions.create({
            model: MODEL, messages: [{ role: 'user', content: prompt }], max_tokens: max,
            temperature: i % 2 ? 0 : 0.8, seed: i, stream: true, stream_options: { include_usage: true },
          });
          let usage = null, finish = null;
          for await (const ch of s) {
            if (ch.usage) usage = ch.usage;
            if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
          }
          return { usage, finish };
        })());
      }
    }
    // scraped mid-burst: well-formed, and the gauges within their bounds
    const mid = await scrape(srv);
    assert.ok(value(mid, 'petrel:num_requests_running') <= 4);
    assert.ok(value(mid, 'petrel:kv_blocks_used') + value(mid, 'petrel:kv_blocks_free') === total);

    const res = await Promise.all(jobs);
    const sum = (f) => res.reduce((a, r) => a + f(r), 0);
    const m = await scrape(srv);
    for (const reason of ['stop', 'length']) {
      assert.equal(value(m, 'petrel:request_success_total', { finished_reason: reason }),
        res.filter((r) => r.finish === reason).length, `finished_reason=${reason}`);
    }
    assert.equal(value(m, 'petrel:request_success_total', { finished_reason: 'abort' }), 0);
    assert.equal(value(m, 'petrel:prompt_tokens_total'), sum((r) => r.usage.prompt_tokens));
    assert.equal(value(m, 'petrel:generation_tokens_total'), sum((r) => r.usage.completion_tokens));
    assert.equal(value(m, 'petrel:prefix_cache_queries_total'), sum((r) => r.usage.prompt_tokens));
    assert.equal(value(m, 'petrel:prefix_cache_hits_total'),
      sum((r) => r.usage.prompt_tokens_details?.cached_tokens ?? 0));
    assert.equal(value(m, 'petrel:spec_decode_num_draft_tokens_total'), 0); // no --spec
    assert.equal(observations(m, 'petrel:time_to_first_token_seconds'), N);
    assert.equal(observations(m, 'petrel:e2e_request_latency_seconds'), N);
    assert.equal(observations(m, 'petrel:request_queue_time_seconds'), N);
    assert.equal(observations(m, 'petrel:inter_token_latency_seconds'),
      sum((r) => r.usage.completion_tokens - 1));
    // all done: nothing running, every block free again
    assert.equal(value(m, 'petrel:num_requests_running'), 0);
    assert.equal(value(m, 'petrel:num_requests_waiting'), 0);
    assert.equal(value(m, 'petrel:kv_blocks_used'), 0);
    assert.equal(value(m, 'petrel:kv_blocks_free'), total);
  });

  test('n > 1 counts as usage does: the request and its prompt once, every choice\'s tokens', async () => {
    const before = await scrape(srv);
    const r = await srv.client(KEY).chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Tell me a story' }], n: 3,
      max_tokens: 12, temperature: 0.8, seed: 5,
    });
    assert.equal(r.choices.length, 3);
    const after = await scrape(srv);
    const delta = (name, labels) => value(after, name, labels) - value(before, name, labels);
    const total = (m) => ['stop', 'length', 'abort', 'error']
      .reduce((a, reason) => a + value(m, 'petrel:request_success_total', { finished_reason: reason }), 0);
    assert.equal(total(after) - total(before), 1);
    assert.equal(delta('petrel:prompt_tokens_total'), r.usage.prompt_tokens);
    assert.equal(delta('petrel:generation_tokens_total'), r.usage.completion_tokens);
    assert.equal(observations(after, 'petrel:time_to_first_token_seconds')
      - observations(before, 'petrel:time_to_first_token_seconds'), 1);
    assert.equal(observations(after, 'petrel:inter_token_latency_seconds')
      - observations(before, 'petrel:inter_token_latency_seconds'), r.usage.completion_tokens - 3);
  });

  test('a client that leaves mid-stream counts as abort', async () => {
    const ac = new AbortController();
    const s = await srv.client(KEY).chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Tell me a story' }],
      max_tokens: 4000, ignore_eos: true, stream: true,
    }, { signal: ac.signal });
    try {
      for await (const ch of s) { if (ch.choices[0]?.delta?.content) ac.abort(); }
    } catch { /* the abort */ }
    for (let i = 0; ; i++) { // the server notices at its next write; bounded by the count, not a clock
      const m = await scrape(srv);
      if (value(m, 'petrel:request_success_total', { finished_reason: 'abort' }) === 1) break;
      assert.ok(i < 2000, 'the aborted stream was never counted');
      await new Promise((r) => setTimeout(r, 10));
    }
  });
});

describe('/health while the model loads', () => {
  test('503 "loading" until ready; generation routes 503 model_loading; a failed load exits', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'petrel-loading-'));
    const fifo = path.join(dir, 'config.json');
    const portFile = path.join(dir, 'port');
    execFileSync('mkfifo', [fifo]);
    const proc = spawn(PETREL, ['serve', '-m', `dummy:${fifo}`, '--port', '0', '--port-file', portFile, '-q'],
      { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, PETREL_API_KEY: KEY } });
    let log = '';
    proc.stderr.on('data', (d) => { log += d; });
    const exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
    try {
      // the port file waits for readiness; the first line names the port at once
      let port;
      for (let i = 0; !(port = /http:\/\/127\.0\.0\.1:(\d+)\/health says "loading"/.exec(log)?.[1]); i++) {
        assert.ok(i < 12000 && proc.exitCode === null, `no loading line:\n${log}`);
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.ok(!existsSync(portFile), 'the port file was written before the model loaded');
      const url = `http://127.0.0.1:${port}`;
      const auth = { authorization: `Bearer ${KEY}` };
      const h = await fetch(`${url}/health`);
      assert.equal(h.status, 503);
      assert.equal((await h.json()).status, 'loading');
      const chat = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST', headers: { ...auth, 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
      });
      assert.equal(chat.status, 503);
      assert.equal((await chat.json()).error.code, 'model_loading');
      const models = await fetch(`${url}/v1/models`, { headers: auth });
      assert.equal(models.status, 503);
      assert.equal((await fetch(`${url}/metrics`)).status, 401); // the key holds while loading too
      const m = await fetch(`${url}/metrics`, { headers: auth });
      assert.equal(m.status, 200);
      const fams = parsePrometheusTextFormat(await m.text());
      assert.ok(fams.some((f) => f.name === 'petrel:num_requests_running'));
      // the loader is blocked opening the FIFO: give it a small model's config
      const fd = openSync(fifo, 'w');
      writeSync(fd, readFileSync(path.join(SOURCE_DIR, 'tests/cuda/tiny-llama.json')));
      closeSync(fd);
      assert.equal(await exited, 1);
      assert.match(log, /no tokenizer/); // loaded, then refused by the server's start-up
    } finally {
      if (proc.exitCode === null) proc.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
