// spec.test.mjs - speculative decoding through the API: greedy answers are
// the same with `--spec off`, `--spec ngram`, `--spec draft` (stories260K
// drafting for itself) and with a Predicted Output (`prediction`), alone
// and under concurrent requests; usage.completion_tokens_details'
// accepted/rejected_prediction_tokens add up to timings.drafted_tokens
// (streamed too), summed over n > 1 choices; a bad `prediction` is a 400
// naming the field.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { PROMPTS, SOURCE_DIR, chatBody, startServer } from './lib.mjs';

const MAX = 64;
// a prompt whose answer repeats itself, so the n-gram drafter finds matches
const REPEAT = 'Once upon a time, there was a little girl named Lily. Lily said: "Once upon a time, '
  + 'there was a little girl named Lily."';

// The usage fields agree with the timings, whatever was drafted.
function checkUsage(usage, timings, what) {
  const d = usage.completion_tokens_details;
  assert.ok(d, `${what}: no completion_tokens_details in ${JSON.stringify(usage)}`);
  assert.equal(d.accepted_prediction_tokens + d.rejected_prediction_tokens, timings.drafted_tokens, what);
  assert.equal(d.accepted_prediction_tokens, timings.accepted_tokens, what);
  assert.ok(d.accepted_prediction_tokens >= 0 && d.rejected_prediction_tokens >= 0, what);
  // every emitted token was either accepted or the model's own
  assert.ok(d.accepted_prediction_tokens <= usage.completion_tokens, what);
  return d;
}

async function answer(server, prompt, extra = {}) {
  const r = await server.client().chat.completions.create({ ...chatBody(prompt, MAX), ...extra });
  checkUsage(r.usage, r.timings, `${prompt}: ${JSON.stringify(extra).slice(0, 60)}`);
  return r;
}

async function streamed(server, prompt, extra = {}) {
  const s = await server.client().chat.completions.create({
    ...chatBody(prompt, MAX), ...extra, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, timings = null;
  for await (const ch of s) {
    text += ch.choices[0]?.delta?.content ?? '';
    if (ch.usage) usage = ch.usage, timings = ch.timings;
  }
  assert.ok(usage && timings, 'the final chunk carries usage and timings');
  checkUsage(usage, timings, `${prompt} (streamed)`);
  return { text, usage, timings };
}

describe('speculative decoding', () => {
  let off, ngram, draft;
  const want = new Map(); // prompt -> --spec off answer
  const prompts = [...PROMPTS, REPEAT];
  before(async () => {
    off = await startServer(['--threads', '1', '--spec', 'off']);
    ngram = await startServer(['--threads', '1', '--spec', 'ngram', '--spec-k', '4', '--ngram-min', '1', '--ngram-max', '3']);
    draft = await startServer(['--threads', '1', '--draft-model', path.join(SOURCE_DIR, 'models/stories260K.gguf'), '--spec-k', '4']);
    for (const p of prompts) {
      const r = await answer(off, p);
      assert.equal(r.timings.drafted_tokens, 0, '--spec off drafts nothing');
      assert.equal(r.usage.completion_tokens_details.accepted_prediction_tokens, 0);
      want.set(p, r.choices[0].message.content);
    }
  });
  // a clean exit: under the sanitizers a leak or an error is a nonzero one
  after(async () => {
    for (const srv of [off, ngram, draft]) {
      const st = await srv.stop();
      assert.equal(st.code, 0, srv.log().slice(-4000));
    }
  });

  test('--spec ngram and --spec draft answer as --spec off', async () => {
    let drafted = 0;
    for (const p of prompts) {
      const r = await answer(ngram, p);
      assert.equal(r.choices[0].message.content, want.get(p), `ngram: ${p}`);
      drafted += r.timings.drafted_tokens;
      const d = await answer(draft, p);
      assert.equal(d.choices[0].message.content, want.get(p), `draft: ${p}`);
      // the same model drafting: every draft is the target's own token
      assert.ok(d.timings.drafted_tokens > 0, `draft: ${p}: nothing drafted`);
      assert.equal(d.timings.accepted_tokens, d.timings.drafted_tokens, `draft: ${p}: acceptance 1.0`);
    }
    assert.ok(drafted > 0, 'the n-gram drafter found something to draft');
  });

  test('a Predicted Output drafts and changes nothing, streamed or not, on any --spec', async () => {
    for (const p of prompts) {
      const text = want.get(p);
      for (const server of [off, ngram]) {
        const r = await answer(server, p, { prediction: { type: 'content', content: text } });
        assert.equal(r.choices[0].message.content, text, p);
        const d = r.usage.completion_tokens_details;
        // the exact answer predicted: nearly everything is accepted
        if (r.usage.completion_tokens > 8)
          assert.ok(d.accepted_prediction_tokens >= r.usage.completion_tokens / 2, `${p}: ${JSON.stringify(d)}`);
        // as an array of text parts, split mid-text
        const half = Math.floor(text.length / 2);
        const parts = [{ type: 'text', text: text.slice(0, half) }, { type: 'text', text: text.slice(half) }];
        const s = await streamed(server, p, { prediction: { type: 'content', content: parts } });
        assert.equal(s.text, text, `${p} (streamed, parts)`);
        assert.ok(s.usage.completion_tokens_details.accepted_prediction_tokens > 0 || s.usage.completion_tokens < 3, p);
      }
      // a wrong prediction costs only speed
      const wrong = await answer(ngram, p, { prediction: { type: 'content', content: 'The dog barked at the moon all night long.' } });
      assert.equal(wrong.choices[0].message.content, text, `${p} (wrong prediction)`);
    }
  });

  test('n > 1: every choice drafts from the prediction, usage sums them', async () => {
    const p = REPEAT, text = want.get(p);
    for (const stream of [false, true]) {
      const body = { ...chatBody(p, MAX), n: 3, prediction: { type: 'content', content: text } };
      let texts = ['', '', ''], usage;
      if (stream) {
        const s = await ngram.client().chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
        for await (const ch of s) {
          for (const c of ch.choices) texts[c.index] += c.delta?.content ?? '';
          if (ch.usage) usage = ch.usage;
        }
      } else {
        const r = await ngram.client().chat.completions.create(body);
        texts = r.choices.map((c) => c.message.content);
        usage = r.usage;
      }
      assert.deepEqual(texts, [text, text, text], `stream ${stream}`);
      const d = usage.completion_tokens_details;
      assert.ok(d.accepted_prediction_tokens >= 3 * Math.floor(usage.completion_tokens / 3 / 2), JSON.stringify(usage));
    }
  });

  test('under concurrent requests each answer is its alone answer', async () => {
    const jobs = [];
    for (let i = 0; i < 3; i++)
      prompts.forEach((p, j) => {
        const server = [ngram, draft][(i + j) % 2];
        const extra = (i + j) % 3 === 0 ? { prediction: { type: 'content', content: want.get(p) } }
          : (i + j) % 3 === 1 ? { prediction: { type: 'content', content: want.get(prompts[(j + 1) % prompts.length]) } }
          : {};
        jobs.push((j % 2 ? streamed(server, p, extra) : answer(server, p, extra).then((r) => ({ text: r.choices[0].message.content })))
          .then((r) => assert.equal(r.text, want.get(p), `${p} #${i}`)));
      });
    await Promise.all(jobs);
  });

  test('a bad prediction is a 400 naming the field', async () => {
    const cases = [
      [{ type: 'content', content: 3 }, 'prediction.content'],
      [{ type: 'content' }, 'prediction.content'],
      [{ type: 'text', content: 'x' }, 'prediction.type'],
      [{ content: 'x' }, 'prediction.type'],
      [{ type: 'content', content: [{ type: 'image_url', image_url: { url: 'x' } }] }, 'prediction.content[0]'],
      [{ type: 'content', content: [{ type: 'text', text: 7 }] }, 'prediction.content[0]'],
      ['some text', 'prediction'],
      [[{ type: 'content', content: 'x' }], 'prediction'],
    ];
    for (const [prediction, param] of cases) {
      const res = await fetch(`${ngram.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', host: 'localhost' },
        body: JSON.stringify({ ...chatBody('Hi', 4), prediction }),
      });
      const j = await res.json();
      assert.equal(res.status, 400, JSON.stringify(prediction));
      assert.equal(j.error.param, param, JSON.stringify(j));
      assert.match(j.error.message, /prediction/);
    }
    // null means absent, as every field
    const r = await answer(ngram, 'Hi', { prediction: null });
    assert.equal(r.choices[0].finish_reason.length > 0, true);
  });

  test('bad --spec flags stop the server with a message', async () => {
    await assert.rejects(startServer(['--spec', 'draft']), /--spec draft needs --draft-model/);
    await assert.rejects(startServer(['--draft-model', path.join(SOURCE_DIR, 'tests/fixtures/hf/llama2')]),
      /vocabulary of 320 tokens, the model 512/);
  });
});
