// preempt.test.mjs - continuous batching under a KV budget too small for
// the load: 16 concurrent requests of mixed lengths against a server whose
// --kv-budget holds about two of them.  The scheduler grows sequences
// lazily and preempts (recomputes) the latest arrivals; every request must
// still finish with exactly the text it gets when run alone.
// PETREL_SCHED_HOLD=16 keeps the scheduler's first step back until all 16
// are queued: they then run together whatever the arrival timing (on a
// loaded machine they could otherwise trickle in one after another and
// never meet), so the preemptions are certain, not likely.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './lib.mjs';

const PROMPTS = ['Once upon a time', 'Lily wanted to', 'The little dog', 'One day, a boy named Tim'];

function request(i) {
  return {
    model: 'stories260K',
    prompt: PROMPTS[i % PROMPTS.length],
    max_tokens: 16 + ((i * 13) % 48), // 16..63
    temperature: 0,
  };
}

describe('petrel serve under a small --kv-budget', () => {
  let srv;
  // stories260K stores 640 bytes of f16 K+V per position: 160 KiB is 256
  // positions, 16 pages: the 16 prompts take one page each, so the first
  // to grow past 16 positions finds the pool empty and preempts.
  before(async () => {
    srv = await startServer(['--threads', '2', '--parallel', '16', '--kv-budget', '160K'],
      { PETREL_SCHED_HOLD: '16' });
  });
  after(async () => { await srv.stop('SIGTERM'); });

  test('16 concurrent requests equal the same requests alone', async () => {
    const client = srv.client();
    // together first: the hold applies to the first step only
    const together = await Promise.all(
      Array.from({ length: 16 }, (_, i) => client.completions.create(request(i))));
    const alone = [];
    for (let i = 0; i < 16; i++) alone.push(await client.completions.create(request(i)));
    let preempted = 0;
    for (let i = 0; i < 16; i++) {
      const a = alone[i], t = together[i];
      assert.equal(t.choices[0].text, a.choices[0].text, `request ${i}`);
      assert.equal(t.choices[0].finish_reason, a.choices[0].finish_reason, `request ${i}`);
      assert.equal(t.usage.completion_tokens, a.usage.completion_tokens, `request ${i}`);
      assert.equal(a.timings.preemptions, 0);
      preempted += t.timings.preemptions;
    }
    assert.ok(preempted > 0, 'the budget was meant to force preemptions');
    const h = await (await fetch(`${srv.url}/health`)).json();
    assert.equal(h.kv_pages_reserved, 0, JSON.stringify(h)); // every page is back
  });
});
