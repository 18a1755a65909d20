// e2e.test.mjs - `petrel serve` driven by the official OpenAI client (and
// by raw fetch and curl where the bytes on the wire matter).
//
// Environment (set by run.sh): PETREL_BIN, PETREL_SOURCE_DIR,
// E2E_CLIENTS (the load test's concurrency), E2E_OUT (results file).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import net from 'node:net';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import {
  SOURCE_DIR, chatBody, loadRound, referenceAnswers, rssKiB, startServer, streamChat,
} from './lib.mjs';

const run = promisify(execFile);
const CLIENTS = Number(process.env.E2E_CLIENTS || 64);
const fixture = JSON.parse(readFileSync(path.join(SOURCE_DIR, 'tests/fixtures/stories260K-greedy.json'), 'utf8'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function post(url, body, headers = {}) {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON: the assertion says so */ }
  return { status: r.status, headers: r.headers, text, json };
}

// An OpenAI-style error body with the given status, code and param.
function assertError(res, status, code, param) {
  assert.equal(res.status, status, res.text);
  assert.ok(res.json, `error body is not JSON: ${res.text}`);
  const e = res.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  assert.ok('param' in e && 'code' in e, 'error has param and code');
  if (code !== undefined) assert.equal(e.code, code);
  if (param !== undefined) assert.equal(e.param, param);
}

async function rejects(promise, status, code, param) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof OpenAI.APIError, String(err));
    assert.equal(err.status, status);
    if (code !== undefined) assert.equal(err.code, code);
    if (param !== undefined) assert.equal(err.param, param);
    return true;
  });
}

describe('petrel serve', () => {
  let srv, client;
  before(async () => {
    srv = await startServer(['--threads', '1', '--ctx', '2048', '--parallel', '4']);
    client = srv.client();
  });
  after(async () => {
    const { code, sig } = await srv.stop('SIGTERM');
    assert.equal(sig, null, srv.log());
    assert.equal(code, 0, srv.log());
  });

  test('models', async () => {
    const list = await client.models.list();
    assert.equal(list.data.length, 1);
    assert.equal(list.data[0].id, 'stories260K');
    assert.equal(list.data[0].object, 'model');
    const m = await client.models.retrieve('stories260K');
    assert.equal(m.id, 'stories260K');
    await rejects(client.models.retrieve('gpt-4o'), 404, 'model_not_found');
    const h = await (await fetch(`${srv.url}/health`)).json();
    assert.equal(h.status, 'ok');
  });

  test('completions match llama.cpp greedy tokens', async () => {
    for (const c of fixture.cases) {
      const r = await client.completions.create({
        model: 'stories260K', prompt: c.prompt, max_tokens: 48, temperature: 0,
      });
      assert.equal(r.object, 'text_completion');
      assert.match(r.id, /^cmpl-/);
      assert.equal(r.choices[0].text, c.continuation_text);
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
      assert.equal(r.usage.completion_tokens, 48);
      assert.equal(r.usage.total_tokens, c.prompt_ids.length + 48);
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
      assert.ok(r.timings.ttft_ms > 0 && r.timings.decode_tokens_per_second > 0);
      // token ids work as a prompt too
      const r2 = await client.completions.create({
        model: 'stories260K', prompt: c.prompt_ids, max_tokens: 48, temperature: 0,
      });
      assert.equal(r2.choices[0].text, c.continuation_text);
    }
  });

  test('streamed text equals non-streamed text at temperature 0', async () => {
    for (const c of fixture.cases) {
      const whole = await client.chat.completions.create(chatBody(c.prompt, 40));
      assert.equal(whole.object, 'chat.completion');
      assert.equal(whole.choices[0].message.role, 'assistant');
      const s = await streamChat(client, c.prompt, 40);
      assert.equal(s.text, whole.choices[0].message.content);
      assert.equal(s.finish, whole.choices[0].finish_reason);
      // the streamed request repeats the prompt: the prefix cache serves its
      // full pages, so only cached_tokens may differ
      const { prompt_tokens_details: cs_, ...su } = s.usage, { prompt_tokens_details: cw_, ...wu } = whole.usage;
      assert.deepEqual(su, wu);
      assert.ok(cs_.cached_tokens >= cw_.cached_tokens);
      assert.ok(s.timings && s.timings.ttft_ms > 0);

      const cw = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 30, temperature: 0 });
      const cs = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 30, temperature: 0, stream: true });
      let text = '', finish = null;
      for await (const chunk of cs) {
        text += chunk.choices[0]?.text ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(text, cw.choices[0].text);
      assert.equal(finish, cw.choices[0].finish_reason);
    }
  });

  test('a seeded sample is reproducible', async () => {
    const body = { ...chatBody('Once upon a time', 24), temperature: 0.9, top_p: 0.95, top_k: 40, seed: 42 };
    const a = await client.chat.completions.create(body);
    const b = await client.chat.completions.create(body);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  });

  test('stop sequences, also across token boundaries', async () => {
    const c = fixture.cases[0];
    const full = c.continuation_text;
    // one stop inside a token run, one spanning several tokens, one absent
    for (const stop of [' little', 'ere was a li', 'park. One', ['zzz', 'Lily.'], ', there']) {
      const stops = Array.isArray(stop) ? stop : [stop];
      let cut = full.length;
      for (const s of stops) { const i = full.indexOf(s); if (i >= 0 && i < cut) cut = i; }
      const want = full.slice(0, cut);
      const r = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 48, temperature: 0, stop });
      assert.equal(r.choices[0].text, want, `stop ${JSON.stringify(stop)}`);
      assert.equal(r.choices[0].finish_reason, 'stop');
      const s = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 48, temperature: 0, stop, stream: true });
      let text = '';
      for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
      assert.equal(text, want, `streamed, stop ${JSON.stringify(stop)}`);
    }
    const r = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 48, temperature: 0, stop: 'never there' });
    assert.equal(r.choices[0].text, full);
    assert.equal(r.choices[0].finish_reason, 'length');
  });

  test('logprobs (chat and completions formats)', async () => {
    const r = await client.chat.completions.create({ ...chatBody('Once upon a time', 12), logprobs: true, top_logprobs: 3 });
    const content = r.choices[0].logprobs.content;
    // an end-of-text token counts as generated but has no text to report
    const eos = r.choices[0].finish_reason === 'stop' ? 1 : 0;
    assert.equal(content.length, r.usage.completion_tokens - eos);
    for (const t of content) {
      assert.equal(typeof t.token, 'string');
      assert.ok(t.logprob <= 0);
      assert.ok(Array.isArray(t.bytes));
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.top_logprobs[0].logprob, t.logprob); // greedy: the best one
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    }
    const s = await client.chat.completions.create({ ...chatBody('Once upon a time', 12), logprobs: true, top_logprobs: 3, stream: true });
    const streamed = [];
    for await (const chunk of s) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);

    const c = fixture.cases[0];
    const cr = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 10, temperature: 0, logprobs: 2 });
    const lp = cr.choices[0].logprobs;
    assert.equal(lp.tokens.length, 10);
    assert.equal(lp.tokens.join(''), cr.choices[0].text);
    assert.deepEqual(lp.tokens, c.continuation_pieces.slice(0, 10));
    assert.equal(lp.text_offset[0], 0);
    for (let i = 1; i < 10; i++) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + lp.tokens[i - 1].length);
    for (const top of lp.top_logprobs) assert.equal(Object.keys(top).length, 2);
    const none = await client.completions.create({ model: 'stories260K', prompt: c.prompt, max_tokens: 4, temperature: 0 });
    assert.equal(none.choices[0].logprobs, null);
  });

  test('errors: OpenAI-style bodies and statuses', async () => {
    const u = `${srv.url}/v1/chat/completions`;
    assertError(await post(u, '{"messages": ['), 400, 'invalid_json');
    assertError(await post(u, '[]'), 400, 'invalid_json');
    assertError(await post(u, { messages: 'hi' }), 400, 'invalid_type', 'messages');
    await rejects(client.chat.completions.create({ ...chatBody('x', 4), temperature: 'hot' }), 400, 'invalid_type', 'temperature');
    await rejects(client.chat.completions.create({ ...chatBody('x', 4), temperature: 5 }), 400, 'invalid_value', 'temperature');
    await rejects(client.chat.completions.create({ ...chatBody('x', 4), n: 17 }), 400, 'invalid_value', 'n');
    await rejects(client.chat.completions.create({ ...chatBody('x', 4), model: 'gpt-4o' }), 404, 'model_not_found', 'model');
    await rejects(client.completions.create({ model: 'stories260K', prompt: 'word '.repeat(3000) }), 400, 'context_length_exceeded', 'prompt');
    assertError(await post(`${srv.url}/v1/nothing`, {}), 404, 'not_found');
    const g = await fetch(u);
    assert.equal(g.status, 405);
    assert.equal(g.headers.get('allow'), 'POST');
    assertError({ status: g.status, json: await g.json(), text: '' }, 405, 'method_not_allowed');
    // the server is unharmed
    const ok = await client.chat.completions.create(chatBody('Once upon a time', 4));
    assert.equal(ok.usage.completion_tokens, 4);
  });

  test('raw SSE bytes (curl -N)', async () => {
    const body = JSON.stringify({ ...chatBody('Once upon a time', 6), stream: true, stream_options: { include_usage: true } });
    const { stdout } = await run('curl', ['-sN', '-i', '-H', 'Content-Type: application/json', '-d', body, `${srv.url}/v1/chat/completions`]);
    const [head, payload] = stdout.split('\r\n\r\n');
    assert.match(head, /^HTTP\/1\.1 200 OK/);
    assert.match(head, /\r\nContent-Type: text\/event-stream\r\n/);
    assert.match(head + "\r\n", /\r\nTransfer-Encoding: chunked\r\n/);
    assert.ok(payload.endsWith('\n\ndata: [DONE]\n\n'), JSON.stringify(payload.slice(-60)));
    const events = payload.split('\n\n').filter((e) => e.length);
    for (const e of events) assert.match(e, /^data: /);
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
    assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    for (const c of chunks) {
      assert.equal(c.object, 'chat.completion.chunk');
      assert.equal(c.id, chunks[0].id);
    }
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.completion_tokens, 6);
    assert.equal(chunks.at(-2).choices[0].finish_reason, 'length');
    // HTTP/1.0: no chunked encoding, the stream ends with the connection
    const r10 = await run('curl', ['-sN', '-i', '--http1.0', '-H', 'Content-Type: application/json', '-d', body, `${srv.url}/v1/chat/completions`]);
    assert.doesNotMatch(r10.stdout, /Transfer-Encoding/);
    assert.ok(r10.stdout.endsWith('data: [DONE]\n\n'));
    // the same JSON bytes, non-streamed, through curl
    const { stdout: j } = await run('curl', ['-s', '-H', 'Content-Type: application/json', '-d', JSON.stringify(chatBody('Once upon a time', 6)), `${srv.url}/v1/chat/completions`]);
    const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    assert.equal(JSON.parse(j).choices[0].message.content, text);
  });

  test('a client that disconnects cancels its generation', async () => {
    const ac = new AbortController();
    const s = await client.completions.create(
      { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, stream: true, ignore_eos: true },
      { signal: ac.signal });
    let seen = 0;
    try {
      for await (const chunk of s) { if (++seen === 2) ac.abort(); void chunk; }
    } catch { /* aborted */ }
    for (let i = 0; i < 200; i++) {
      const h = await (await fetch(`${srv.url}/health`)).json();
      const logged = /POST \/v1\/completions 499 \((client closed|connection error)\)/.test(srv.log());
      if (h.running === 0 && h.waiting === 0 && h.kv_pages_reserved === 0 && logged) return;
      await sleep(10);
    }
    assert.fail('the cancelled sequence still holds a slot');
  });

  test('a non-streamed request is cancelled when its client leaves', async () => {
    const before = (srv.log().match(/ 499 /g) || []).length;
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 150);
    await assert.rejects(client.completions.create(
      { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, ignore_eos: true },
      { signal: ac.signal }));
    for (let i = 0; i < 300; i++) {
      const h = await (await fetch(`${srv.url}/health`)).json();
      if (h.running === 0 && (srv.log().match(/ 499 /g) || []).length > before) return;
      await sleep(10);
    }
    assert.fail('the abandoned request kept running');
  });

  test(`${CLIENTS} concurrent streaming clients, answers exact, memory stable`, async () => {
    const load = await startServer(['--threads', '1', '--ctx', '256', '--parallel', String(CLIENTS), '--quiet']);
    try {
      const want = await referenceAnswers(load, 32);
      const first = await loadRound(load, CLIENTS, 32, want);
      assert.deepEqual(first.wrong, []);
      const rss1 = rssKiB(load.proc.pid);
      let last = first;
      for (let i = 0; i < 3; i++) {
        last = await loadRound(load, CLIENTS, 32, want);
        assert.deepEqual(last.wrong, []);
      }
      const rss2 = rssKiB(load.proc.pid);
      const h = await (await fetch(`${load.url}/health`)).json();
      assert.equal(h.kv_pages_reserved, 0);
      // bounded growth: allocator noise, not a per-request leak (ASan's
      // quarantine holds freed memory for a while; LeakSanitizer checks
      // leaks at exit there)
      const growth = rss2 - rss1;
      const limit = process.env.E2E_SANITIZED === '1' ? 128 * 1024 : 16 * 1024;
      const result = { ...last, rss_kib_after_round1: rss1, rss_kib_after_round4: rss2 };
      console.log('load:', JSON.stringify(result));
      if (process.env.E2E_OUT) writeFileSync(process.env.E2E_OUT, JSON.stringify(result, null, 2) + '\n');
      assert.ok(growth < limit, `RSS grew by ${growth} KiB over 3 rounds`);
    } finally {
      const { code } = await load.stop('SIGTERM');
      assert.equal(code, 0, load.log());
    }
  });
});

describe('petrel serve with limits and an API key', () => {
  let srv;
  const key = 'sk-test-123';
  before(async () => { srv = await startServer(['--threads', '1', '--ctx', '64', '--max-body', '2000', '--api-key', key]); });
  after(async () => { await srv.stop('SIGTERM'); });

  test('API key', async () => {
    await rejects(srv.client('wrong').models.list(), 401, 'invalid_api_key');
    const r = await fetch(`${srv.url}/v1/models`);
    assertError({ status: r.status, json: await r.json(), text: '' }, 401, 'invalid_api_key');
    const ok = await srv.client(key).models.list();
    assert.equal(ok.data[0].id, 'stories260K');
    assert.equal((await fetch(`${srv.url}/health`)).status, 200); // health needs no key
  });

  test('oversized body gets 413 before it is read', async () => {
    const big = JSON.stringify({ ...chatBody('x'.repeat(5000), 4) });
    assertError(await post(`${srv.url}/v1/chat/completions`, big, { authorization: `Bearer ${key}` }), 413, 'request_too_large');
    const { stdout } = await run('curl', ['-s', '-i', '-H', `Authorization: Bearer ${key}`, '-d', big, `${srv.url}/v1/completions`]);
    assert.match(stdout, /^HTTP\/1\.1 413 /);
    assert.match(stdout, /"code":"request_too_large"/);
  });

  test('prompt longer than the context', async () => {
    await rejects(srv.client(key).chat.completions.create(chatBody('Once upon a time '.repeat(30), 4)), 400, 'context_length_exceeded', 'messages');
    // a prompt that fits but leaves little room ends with "length"
    const r = await srv.client(key).completions.create({ model: 'stories260K', prompt: 'Once upon a time '.repeat(14), max_tokens: 100, temperature: 0 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.ok(r.usage.prompt_tokens + r.usage.completion_tokens <= 64);
  });
});

// Writes raw bytes on a fresh connection and resolves with everything the
// server sends until it closes (or until ms pass).
function raw(port, bytes, ms = 3000) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = '';
    const done = () => { sock.destroy(); resolve(got); };
    const timer = setTimeout(done, ms);
    sock.on('data', (d) => { got += d; });
    sock.on('close', () => { clearTimeout(timer); resolve(got); });
    sock.on('error', () => {});
    sock.write(bytes);
  });
}

describe('HTTP/1.1 protocol edges', () => {
  let srv;
  before(async () => { srv = await startServer(['--threads', '1', '--ctx', '256', '--idle-timeout', '1']); });
  after(async () => {
    const { code } = await srv.stop('SIGTERM');
    assert.equal(code, 0, srv.log());
  });

  test('pipelined requests are answered in order', async () => {
    const req = 'GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n';
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 3, temperature: 0 });
    const post = `POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    const last = 'GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n';
    const got = await raw(srv.port, req + post + last);
    const statuses = [...got.matchAll(/HTTP\/1\.1 (\d+)/g)].map((m) => m[1]);
    assert.deepEqual(statuses, ['200', '200', '200']);
    assert.ok(got.indexOf('"status":"ok"') < got.indexOf('text_completion'));
    assert.ok(got.indexOf('text_completion') < got.indexOf('"object":"list"'));
  });

  test('garbage gets a JSON 400 and the connection is closed', async () => {
    const got = await raw(srv.port, 'HELLO\r\n\r\n');
    assert.match(got, /^HTTP\/1\.1 400 /);
    assert.match(got, /Connection: close/);
    assert.match(got, /"type":"invalid_request_error"/);
    const v2 = await raw(srv.port, 'GET / HTTP/2.0\r\n\r\n');
    assert.match(v2, /^HTTP\/1\.1 505 /);
    const smuggle = await raw(srv.port, 'POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n');
    assert.match(smuggle, /^HTTP\/1\.1 400 /);
    const huge = await raw(srv.port, `GET /health HTTP/1.1\r\nX-Big: ${'a'.repeat(20000)}\r\n\r\n`);
    assert.match(huge, /^HTTP\/1\.1 431 /);
  });

  test('a chunked request body is accepted', async () => {
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
    const { stdout } = await run('curl', ['-s', '-H', 'Transfer-Encoding: chunked', '-H', 'Content-Type: application/json',
      '--data-binary', body, `${srv.url}/v1/completions`]);
    assert.equal(JSON.parse(stdout).choices[0].text, fixture.cases[0].continuation_text.slice(0, JSON.parse(stdout).choices[0].text.length));
    assert.equal(JSON.parse(stdout).usage.completion_tokens, 5);
  });

  test('idle and half-sent connections are closed after --idle-timeout', async () => {
    const t0 = performance.now();
    const got = await raw(srv.port, 'GET /health HTTP/1.1\r\nHost: x\r\n', 10000);
    assert.equal(got, '');
    const waited = performance.now() - t0;
    assert.ok(waited > 800 && waited < 8000, `closed after ${waited} ms`);
  });
});

describe('shutdown', () => {
  test('SIGTERM lets an in-flight stream finish, then exits 0', async () => {
    const srv = await startServer(['--threads', '1', '--ctx', '256']);
    const s = await srv.client().completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 200, temperature: 0, stream: true, ignore_eos: true });
    let text = '', finish = null, n = 0;
    for await (const chunk of s) {
      if (n++ === 1) srv.proc.kill('SIGTERM');
      text += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'length');
    assert.ok(text.length > 0);
    const { code } = await srv.exited;
    assert.equal(code, 0, srv.log());
    assert.match(srv.log(), /SIGTERM/);
  });

  test('a second SIGINT cancels what is left, and it still exits 0', async () => {
    const srv = await startServer(['--threads', '1', '--ctx', '2048', '--shutdown-timeout', '60']);
    const s = await srv.client().completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, stream: true, ignore_eos: true });
    let n = 0, error = null;
    try {
      for await (const chunk of s) {
        if (++n === 2) {
          // the second signal must come after the first was handled (two
          // pending SIGINTs merge into one)
          srv.proc.kill('SIGINT');
          while (!/SIGINT: not accepting/.test(srv.log())) await sleep(1);
          srv.proc.kill('SIGINT');
        }
        void chunk;
      }
    } catch (e) { error = e; }
    assert.ok(error, 'the cancelled stream reports an error');
    const { code } = await srv.exited;
    assert.equal(code, 0, srv.log());
  });
});
