// pool.test.mjs - several models behind one endpoint (`petrel serve -m A
// -m B`, `--models-dir`).  The second model is stories260K with its final
// norm's weights scaled unevenly (a GGUF file written here): its greedy
// text differs, so a request that reached the wrong model would show, and
// it stays f32 (quantized models' greedy text may change with the batch,
// which interleaving would make a flaky comparison).  A third, a directory
// (stories260K converted to 4-bit MLX affine by `petrel convert`), checks
// that --models-dir serves directories too.  Checked: interleaved requests to
// both models from the openai client give exactly what each model gives
// served alone; /v1/models lists every model with its state; an unknown
// model is a 404 naming the served ones; and under a --pool-memory that
// holds one model, a request for the other evicts the first only after
// its requests in flight have finished, and every answer is still right.
// A model whose load blocks (dummy weights whose config.json is a FIFO
// the test writes last) shows that a load does not stall the server, that
// a request waits at most --pool-wait, and that a failed load answers the
// requests waiting for it.
// The eviction is made certain, not likely: PETREL_SCHED_HOLD=3 keeps the
// first model's two requests queued (in flight) until the test cancels
// one of them, after the other model's request has marked it "evicting".
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, copyFileSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, PETREL, SOURCE_DIR } from './lib.mjs';

const GGUF = path.join(SOURCE_DIR, 'models', 'stories260K.gguf');
const A = 'stories260K', B = 'tweaked', C = 's4';
const PROMPTS = ['Once upon a time', 'Lily wanted to', 'The little dog', 'One day, a boy named Tim'];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A copy of the GGUF at `to` with output_norm.weight[i] scaled by
// 1 + sin(i) / 2 (GGUF v3: header, metadata, tensor infos, aligned data).
function tweak(from, to) {
  const b = readFileSync(from);
  let o = 8; // magic, version
  const u32 = () => { o += 4; return b.readUInt32LE(o - 4); };
  const u64 = () => { o += 8; return Number(b.readBigUInt64LE(o - 8)); };
  const str = () => { const n = u64(); o += n; return b.toString('utf8', o - n, o); };
  const size = [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8]; // by GGUF value type
  const skip = (t) => {
    if (t === 8) str();
    else if (t === 9) { const et = u32(), n = u64(); for (let i = 0; i < n; i++) skip(et); }
    else o += size[t];
  };
  const nTensors = u64(), nKv = u64();
  let align = 32;
  for (let i = 0; i < nKv; i++) {
    const key = str(), t = u32();
    if (key === 'general.alignment') align = b.readUInt32LE(o);
    skip(t);
  }
  let norm = null;
  for (let i = 0; i < nTensors; i++) {
    const name = str(), nd = u32();
    let n = 1;
    for (let d = 0; d < nd; d++) n *= u64();
    const type = u32(), off = u64();
    if (name === 'output_norm.weight') norm = { n, type, off };
  }
  assert.ok(norm && norm.type === 0, 'output_norm.weight is f32');
  const base = Math.ceil(o / align) * align + norm.off;
  for (let i = 0; i < norm.n; i++)
    b.writeFloatLE(b.readFloatLE(base + 4 * i) * (1 + Math.sin(i) / 2), base + 4 * i);
  writeFileSync(to, b);
}

let dir, tweaked, s4dir;
before(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'petrel-pool-'));
  mkdirSync(path.join(dir, 'models'));
  tweaked = path.join(dir, 'models', `${B}.gguf`);
  tweak(GGUF, tweaked);
  copyFileSync(GGUF, path.join(dir, 'models', `${A}.gguf`));
  s4dir = path.join(dir, 'models', C);
  execFileSync(PETREL, ['convert', '-q', '4', '-g', '32', GGUF, s4dir], { stdio: 'ignore' });
});
after(() => { rmSync(dir, { recursive: true, force: true }); });

function completion(model, i, maxTokens = 24) {
  return { model, prompt: PROMPTS[i % PROMPTS.length], max_tokens: maxTokens, temperature: 0 };
}
function chat(model, i, maxTokens = 24) {
  return { model, messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], max_tokens: maxTokens, temperature: 0 };
}

async function streamText(client, body, opts) {
  let text = '';
  for await (const c of await client.chat.completions.create({ ...body, stream: true }, opts))
    text += c.choices[0]?.delta?.content ?? '';
  return text;
}

// What a model answers when it is the only one served: completion and
// chat texts per prompt.
async function alone(modelArgs, model) {
  const srv = await startServer(['--threads', '1', '-q', ...modelArgs]);
  try {
    const client = srv.client();
    const out = { completion: [], chat: [] };
    for (let i = 0; i < PROMPTS.length; i++) {
      out.completion.push((await client.completions.create(completion(model, i))).choices[0].text);
      out.chat.push((await client.chat.completions.create(chat(model, i))).choices[0].message.content);
    }
    return out;
  } finally {
    await srv.stop();
  }
}

async function models(srv) {
  const r = await (await fetch(`${srv.url}/v1/models`)).json();
  return Object.fromEntries(r.data.map((m) => [m.id, m.state]));
}

async function until(what, fn) {
  for (let i = 0; !(await fn()); i++) {
    if (i > 2400) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

describe('model pool', () => {
  let ref;
  before(async () => {
    ref = { [A]: await alone(['-m', GGUF], A), [B]: await alone(['-m', tweaked], B) };
    assert.notDeepEqual(ref[A], ref[B], 'the two models were meant to answer differently');
  });

  test('two models at once: interleaved requests equal each model alone; /v1/models; 404', async () => {
    const srv = await startServer(['--threads', '2', '-q', '--models-dir', path.join(dir, 'models')]);
    try {
      // sorted by name: s4 is the first, loaded at start-up; the others on demand
      const all = { [C]: 'loaded', [A]: 'unloaded', [B]: 'unloaded' };
      assert.deepEqual(await models(srv), all);
      const h = await (await fetch(`${srv.url}/health`)).json();
      assert.equal(h.status, 'ok');
      assert.deepEqual(h.models, all);
      const client = srv.client();
      const jobs = [];
      for (let i = 0; i < PROMPTS.length; i++)
        for (const m of [A, B]) {
          jobs.push(client.completions.create(completion(m, i)).then((r) => ['completion', m, i, r.model, r.choices[0].text]));
          jobs.push(client.chat.completions.create(chat(m, i)).then((r) => ['chat', m, i, r.model, r.choices[0].message.content]));
          jobs.push(streamText(client, chat(m, i)).then((t) => ['chat', m, i, m, t]));
        }
      for (const [kind, m, i, served, text] of await Promise.all(jobs)) {
        assert.equal(served, m);
        assert.equal(text, ref[m][kind][i], `${kind} ${m} prompt ${i}`);
      }
      // no --pool-memory: all stay
      assert.deepEqual(await models(srv), { [C]: 'loaded', [A]: 'loaded', [B]: 'loaded' });
      const s4 = await client.completions.create(completion(C, 0));
      assert.equal(s4.model, C);
      assert.equal(s4.usage.completion_tokens, 24);
      const one = await (await fetch(`${srv.url}/v1/models/${A}`)).json();
      assert.equal(one.state, 'loaded');
      assert.equal(one.meta.n_vocab, 512);

      await assert.rejects(client.completions.create(completion('nope', 0)), (e) => {
        assert.equal(e.status, 404);
        assert.equal(e.code, 'model_not_found');
        assert.match(e.message, /'nope' does not exist; this server serves 's4', 'stories260K', 'tweaked'/);
        return true;
      });
      const r = await fetch(`${srv.url}/v1/models/nope`);
      assert.equal(r.status, 404);
      assert.match((await r.json()).error.message, /'s4', 'stories260K', 'tweaked'/);

      const metrics = await (await fetch(`${srv.url}/metrics`)).text();
      const n = 3 * PROMPTS.length; // requests per model
      for (const m of [A, B]) {
        assert.match(metrics, new RegExp(`petrel:request_success_total\\{model_name="${m}",finished_reason="length"\\} ${n}\\n`));
        assert.match(metrics, new RegExp(`petrel:model_loaded\\{model_name="${m}"\\} 1\\n`));
      }
      const { code } = await srv.stop(); // unloads, evictions and all: a clean exit (no leak under ASan)
      assert.equal(code, 0, srv.log());
    } finally {
      await srv.stop();
    }
  });

  test('an eviction under --pool-memory lets the requests in flight finish', async () => {
    // 1K holds neither model: one is loaded at a time
    const srv = await startServer(['--threads', '2', '--pool-memory', '1K', '-m', GGUF, '-m', `${B}=${tweaked}`],
      { PETREL_SCHED_HOLD: '3' });
    try {
      const client = srv.client();
      const a1 = streamText(client, chat(A, 0));
      const cancel = new AbortController();
      const a2 = client.completions.create(completion(A, 1), { signal: cancel.signal }).catch((e) => e);
      const gauge = async (name, m) => Number(new RegExp(`petrel:${name}\\{model_name="${m}"\\} (\\d+)`)
        .exec(await (await fetch(`${srv.url}/metrics`)).text())[1]);
      await until('both held in the scheduler', async () => (await gauge('num_requests_waiting', A)) === 2);
      const b1 = client.completions.create(completion(B, 2));
      await until(`${A} evicting`, async () => (await models(srv))[A] === 'evicting');
      assert.equal((await models(srv))[B], 'unloaded'); // it waits for the room
      assert.equal(await gauge('num_requests_waiting', B), 1);
      cancel.abort(); // a cancel releases the hold: a1 runs to its end
      assert.equal(await a1, ref[A].chat[0]);
      assert.equal((await b1).choices[0].text, ref[B].completion[2]);
      assert.ok((await a2) instanceof Error);
      assert.deepEqual(await models(srv), { [A]: 'unloaded', [B]: 'loaded' });
      assert.match(srv.log(), /model stories260K: evicting once its 2 request\(s\) finish, for tweaked/);
      // and back: the idle tweaked goes at once for stories260K
      assert.equal((await client.completions.create(completion(A, 3))).choices[0].text, ref[A].completion[3]);
      assert.deepEqual(await models(srv), { [A]: 'loaded', [B]: 'unloaded' });
      const { code } = await srv.stop(); // unloads, evictions and all: a clean exit (no leak under ASan)
      assert.equal(code, 0, srv.log());
    } finally {
      await srv.stop();
    }
  });

  test('a load off the loop: others answer meanwhile; --pool-wait bounds the wait; a failed load is a 500', async () => {
    const fifo = path.join(dir, 'config.json');
    execFileSync('mkfifo', [fifo]);
    const srv = await startServer(['--threads', '1', '--pool-wait', '1', '-m', GGUF, '-m', `slow=dummy:${fifo}`]);
    try {
      const client = srv.client();
      await assert.rejects(client.completions.create(completion('slow', 0)), (e) => {
        assert.equal(e.status, 503);
        assert.equal(e.code, 'model_loading');
        assert.match(e.message, /'slow' did not load within 1 s \(--pool-wait\)/);
        return true;
      });
      // the loader is still blocked on the FIFO; the server is not
      assert.deepEqual(await models(srv), { [A]: 'loaded', slow: 'loading' });
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
      assert.equal((await client.completions.create(completion(A, 0))).choices[0].text, ref[A].completion[0]);
      const waiting = client.completions.create(completion('slow', 1), { timeout: 60000 }).catch((e) => e);
      await until('the request waiting', async () => (await (await fetch(`${srv.url}/health`)).json()).waiting === 1);
      const fd = openSync(fifo, 'w'); // now the load goes on, and fails: dummy weights have no tokenizer
      writeSync(fd, readFileSync(path.join(SOURCE_DIR, 'tests/cuda/tiny-llama.json')));
      closeSync(fd);
      const e = await waiting;
      assert.equal(e.status, 500);
      assert.equal(e.code, 'model_load_failed');
      assert.match(e.message, /the model 'slow' did not load: this model has no tokenizer/);
      assert.deepEqual(await models(srv), { [A]: 'loaded', slow: 'unloaded' });
      assert.equal((await client.completions.create(completion(A, 1))).choices[0].text, ref[A].completion[1]);
      const { code } = await srv.stop(); // unloads, evictions and all: a clean exit (no leak under ASan)
      assert.equal(code, 0, srv.log());
    } finally {
      await srv.stop();
    }
  });
});
