// kvdisk.test.mjs - the prefix cache's disk tier through the server: a
// restarted server on the same --kv-disk reuses the pages the last one
// wrote and answers the same; after a kill -9 (and the debris a crash
// mid-write leaves) it starts, removes the debris, and still answers the
// same; a full file system turns writing off and serving goes on.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync, truncateSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, waitForLog, PETREL } from './lib.mjs';

const PROMPT = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. '
  + 'One day, she saw a big red ball in the park and ran to get it. Her friend Tom came too.';
const body = { model: 'stories260K', prompt: PROMPT, max_tokens: 24, temperature: 0 };
const full = (n) => Math.floor((n - 1) / 16) * 16;

describe('--kv-disk', () => {
  let dir, cold;
  before(() => { dir = mkdtempSync(path.join(os.tmpdir(), 'petrel-kvdisk-')); });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a restart reuses the pages written at exit', async () => {
    let srv = await startServer(['--threads', '2', '--kv-disk', dir]);
    cold = await srv.client().completions.create(body);
    assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal((await srv.stop('SIGTERM')).code, 0);
    assert.ok(readdirSync(dir).filter((f) => f.endsWith('.kv')).length >= 3);

    srv = await startServer(['--threads', '2', '--kv-disk', dir]);
    const warm = await srv.client().completions.create(body);
    assert.equal(warm.usage.prompt_tokens_details.cached_tokens, full(cold.usage.prompt_tokens));
    assert.equal(warm.choices[0].text, cold.choices[0].text);
    // a second server on the same directory is refused clearly
    const second = spawnSync(PETREL, ['serve', '--port', '0', '--kv-disk', dir], { encoding: 'utf8', timeout: 60000 });
    assert.notEqual(second.status, 0);
    assert.match(second.stderr, /in use by another petrel process/);
    await srv.stop('SIGTERM');
  });

  test('after kill -9 and a crash mid-write: starts, removes the debris, answers the same', async () => {
    let srv = await startServer(['--threads', '2', '--kv-disk', dir]);
    await srv.client().completions.create(body);
    const { sig } = await srv.stop('SIGKILL');
    assert.equal(sig, 'SIGKILL');
    // what a writer killed mid-file leaves, and a file cut short
    writeFileSync(path.join(dir, '00000000deadbeef.kv.tmp'), 'PETRELKV half a page');
    const victim = readdirSync(dir).find((f) => f.endsWith('.kv'));
    truncateSync(path.join(dir, victim), 100);
    srv = await startServer(['--threads', '2', '--kv-disk', dir]);
    assert.match(srv.log(), /removed 1 interrupted and 1 damaged files/);
    assert.ok(!readdirSync(dir).some((f) => f.endsWith('.tmp')));
    const again = await srv.client().completions.create(body);
    assert.equal(again.choices[0].text, cold.choices[0].text);
    await srv.stop('SIGTERM');
  });

  test('a full file system stops the writes, not the server', async (t) => {
    // a 64 KiB tmpfs in a private mount namespace (needs root and unshare)
    const probe = spawnSync('unshare', ['-m', 'sh', '-c', 'mount -t tmpfs -o size=64k tmpfs /mnt && echo ok'], { encoding: 'utf8' });
    if (probe.stdout.trim() !== 'ok') { t.skip('cannot mount a tmpfs here'); return; }
    const script = 'mount -t tmpfs -o size=64k tmpfs /mnt && exec "$0" "$@"';
    // 16 pages of RAM: six different prompts evict each other's pages,
    // whose copies fill the 64 KiB file system
    const srv = await startServer(['--threads', '2', '--kv-disk', '/mnt/kv', '--kv-budget', '160K'], {},
      { wrap: (args) => ['unshare', ['-m', 'sh', '-c', script, PETREL, ...args]] });
    const c = srv.client();
    try {
      for (let i = 0; i < 8; i++) {
        const r = await c.completions.create({ ...body, prompt: `${i}. ${PROMPT}` });
        assert.equal(r.choices[0].finish_reason, 'length');
      }
      const h = await fetch(`${srv.url}/health`);
      assert.equal(h.status, 200);
      // the writer thread writes evicted pages after the requests that
      // evicted them: its warning comes when it reaches the page that
      // does not fit, later on a loaded machine
      await waitForLog(srv, /cannot write \(No space left on device\); the disk tier stops writing/);
      assert.equal(srv.log().match(/the disk tier stops writing/g).length, 1);
    } finally {
      await srv.stop('SIGTERM');
    }
  });
});
