// prefix.test.mjs - the prefix cache through the API: the same prompt sent
// again reports its reused positions in usage.prompt_tokens_details
// .cached_tokens and answers with the same text; --prefix-cache off
// reuses nothing.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './lib.mjs';

const PROMPT = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. '
  + 'One day, she saw a big red ball in the park and ran to get it. Her friend Tom came too.';

function body(prompt) {
  return { model: 'stories260K', prompt, max_tokens: 24, temperature: 0 };
}

describe('prefix cache', () => {
  let on, off;
  before(async () => {
    on = await startServer(['--threads', '2']);
    off = await startServer(['--threads', '2', '--prefix-cache', 'off']);
  });
  after(async () => { await on.stop('SIGTERM'); await off.stop('SIGTERM'); });

  test('a repeated prompt reuses its pages and answers the same', async () => {
    const c = on.client();
    const first = await c.completions.create(body(PROMPT));
    const n = first.usage.prompt_tokens;
    assert.ok(n > 40, `prompt of ${n} tokens`);
    assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
    for (let i = 0; i < 2; i++) {
      const again = await c.completions.create(body(PROMPT));
      const cached = again.usage.prompt_tokens_details.cached_tokens;
      // every full page but the one holding the last prompt token
      assert.equal(cached, Math.floor((n - 1) / 16) * 16);
      assert.equal(again.choices[0].text, first.choices[0].text);
    }
    // streamed, with usage: the same figure
    const stream = await c.completions.create({ ...body(PROMPT), stream: true, stream_options: { include_usage: true } });
    let text = '', usage = null;
    for await (const ch of stream) {
      text += ch.choices[0]?.text ?? '';
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(text, first.choices[0].text);
    assert.equal(usage.prompt_tokens_details.cached_tokens, Math.floor((n - 1) / 16) * 16);
    const h = await (await fetch(`${on.url}/health`, { headers: { host: 'localhost' } })).json();
    assert.ok(h.kv_pages_cached > 0, JSON.stringify(h)); // freed, still findable
    assert.equal(h.kv_pages_reserved, 0);
    const other = await off.client().completions.create(body(PROMPT));
    await off.client().completions.create(body(PROMPT));
    const again = await off.client().completions.create(body(PROMPT));
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(other.choices[0].text, first.choices[0].text);
  });
});
