// bench_serve.mjs PETREL_BIN WORKDIR - CTest cli/bench_serve: `petrel bench
// serve` run briefly against the bundled stories260K, then its outputs
// checked (no npm packages: node's own modules only).
//
//  1. every workload ran; every request finished (finish_reason stop or
//     length, no error); its token counts are exactly the server's usage
//     (prompt, completion, cached) and completion_tokens == max_tokens
//     (ignore_eos); repeated long prompts and later chat turns were served
//     from the RAM prefix cache; restart ran (then prompts resent after it
//     were restored from the SSD tier) or says why it was skipped;
//     the summary's sweep has every --concurrency level;
//  2. the HTML is well-formed (every non-void tag closed, in order), is
//     offline (no script, no external reference) and has the plots, each
//     with drawn series and none saying "no data";
//  3. against a fake server whose stream has no `usage`, the run refuses
//     the responses: exit status 1 and every record carries the error;
//  4. --url against a running `petrel serve` works, and samples the RSS of
//     the process listening on that port.
import { spawnSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import assert from 'node:assert/strict';

const [bin, work] = process.argv.slice(2);
mkdirSync(work, { recursive: true });

// ---- 1. a brief run -------------------------------------------------------------
const json = `${work}/run.json`, html = `${work}/run.html`;
const args = ['bench', 'serve', '-m', 'models/stories260K.gguf', '-o', json, '-n', '8',
  '-C', '1,2,4', '--users', '2', '--turns', '3', '--shared-users', '3', '--agents', '1',
  '--agent-turns', '2', '--long-requests', '1', '--long-tokens', '300', '--sweep-requests', '1',
  '--sweep-tokens', '64', '--restart-requests', '2', '--rss-interval', '50', '--', '--ctx', '1024'];
const r = spawnSync(bin, args, { encoding: 'utf8', timeout: 600e3 });
assert.equal(r.status, 0, `bench serve failed:\n${r.stderr}`);
// A failed check below shows what the run printed, to tell a server fault
// from a harness one.
process.on('uncaughtException', (e) => {
  console.error(`${e.stack}\n--- bench serve's stderr (tail):\n${r.stderr.slice(-4000)}`);
  process.exit(1);
});
const run = JSON.parse(readFileSync(json, 'utf8'));
assert.equal(run.server.n_ctx, 1024, 'the server flags after -- reached the server');

const by = (w) => run.requests.filter((q) => q.workload === w);
for (const w of ['probe', 'chat', 'shared', 'agent', 'long', 'depth', 'sweep'])
  assert.ok(by(w).length > 0, `workload ${w} sent requests`);
for (const q of run.requests) {
  const id = `request ${q.id} (${q.workload}) ${JSON.stringify({ ...q, body: undefined })}`;
  assert.equal(q.error, undefined, `${id} failed: ${q.error}`);
  assert.equal(q.status, 200, id);
  assert.ok(['stop', 'length'].includes(q.finish_reason), `${id} finished: ${q.finish_reason}`);
  assert.equal(typeof q.usage, 'object', `${id} has usage`);
  assert.equal(q.prompt_tokens, q.usage.prompt_tokens, `${id} prompt tokens from usage`);
  assert.equal(q.completion_tokens, q.usage.completion_tokens, `${id} completion from usage`);
  assert.equal(q.cached_tokens, q.usage.prompt_tokens_details.cached_tokens, `${id} cached`);
  assert.equal(q.completion_tokens, q.body.max_tokens, `${id}: ignore_eos gives max_tokens`);
  assert.ok(q.body.stream && q.body.stream_options.include_usage, `${id} asked for usage`);
  assert.ok(q.ttft_ms > 0 && q.e2e_ms >= q.ttft_ms, `${id} timings`);
  assert.ok(q.prompt_tokens <= run.server.n_ctx, `${id} fits the context`);
}
const repeat = by('long').filter((q) => q.phase === 'repeat');
assert.ok(repeat.length && repeat.every((q) => q.cache === 'ram' && q.cached_tokens > 0),
  'a repeated long prompt is served from the prefix cache');
assert.ok(by('chat').some((q) => q.turn > 0 && q.cached_tokens > 0), 'later chat turns reuse history');
assert.ok(by('restart').length > 0 || run.notes.some((n) => /restart skipped/.test(n)),
  'restart ran or says why not');
if (by('restart').length) // the server has --kv-disk: resent prompts come back from disk
  assert.ok(by('restart').some((q) => q.phase === 'after-restart' && q.cache === 'ssd'),
    'after a restart on the same --kv-disk, prompts are SSD-restored');
assert.deepEqual(run.summary.sweep.map((l) => l.concurrency), [1, 2, 4], 'sweep levels');
for (const l of run.summary.sweep) {
  assert.equal(l.requests, l.concurrency, `sweep ${l.concurrency}: one request per client`);
  assert.ok(l.tok_s > 0, 'aggregate throughput');
}
assert.ok(run.samples.some((s) => s.rss_mb > 0), 'server RSS sampled from /proc');
const depths = by('depth').map((q) => q.prompt_tokens);
assert.ok(depths.length >= 3 && depths.every((d, i) => !i || d > depths[i - 1]), 'growing depths');
assert.ok(run.summary.decode_by_depth.length >= 3, 'decode speed binned by depth');
assert.equal(run.summary.all.failed, 0);

// ---- 2. the report --------------------------------------------------------------
const page = readFileSync(html, 'utf8');
assert.ok(page.startsWith('<!DOCTYPE html>'), 'doctype');
const voids = new Set(['meta', 'br', 'hr', 'img', 'input', 'link', 'area', 'base', 'col', 'wbr']);
const stack = [];
for (const m of page.matchAll(/<(\/?)([a-zA-Z][a-zA-Z0-9]*)\b[^>]*?(\/?)>/g)) {
  const [, close, name, self] = m, tag = name.toLowerCase();
  if (self || voids.has(tag)) continue;
  if (!close) stack.push(tag);
  else assert.equal(stack.pop(), tag, `closing </${tag}> at offset ${m.index}`);
}
assert.deepEqual(stack, [], 'every element closed');
assert.ok(!/<script|<link|<img|<iframe|\bsrc=|\bhref=|url\(/i.test(page), 'offline: no external parts');
const plots = [...page.matchAll(/<figure id="([a-z-]+)"><svg class="plot"[\s\S]*?<\/svg>/g)];
const ids = plots.map((m) => m[1]);
for (const id of ['ttft', 'itl', 'throughput', 'sweep-ttft', 'decode-depth', 'rss', 'kv'])
  assert.ok(ids.includes(id), `plot ${id} present`);
for (const [svg, id] of plots) {
  assert.ok(!svg.includes('class="nodata"'), `plot ${id} has data`);
  assert.ok(/<path class="series"|<circle class="dot"/.test(svg), `plot ${id} draws a series`);
}
const ttft = plots.find((m) => m[1] === 'ttft')[0];
assert.ok((ttft.match(/<path class="series"/g) || []).length >= 2, 'TTFT: cold and cached curves');

// ---- 3. a server without usage is refused ---------------------------------------
const fake = http.createServer((req, res) => {
  if (req.url === '/v1/models') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    return res.end(JSON.stringify({ data: [{ id: 'fake', meta: { n_ctx: 512 } }] }));
  }
  if (req.url === '/health') return res.writeHead(200).end('{"status":"ok"}');
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    const ev = (o) => res.write(`data: ${JSON.stringify(o)}\n\n`);
    ev({ choices: [{ index: 0, delta: { role: 'assistant', content: 'Once' } }] });
    ev({ choices: [{ index: 0, delta: { content: ' upon' }, finish_reason: 'length' }] });
    res.end('data: [DONE]\n\n');
  });
});
await new Promise((ok) => fake.listen(0, '127.0.0.1', ok));
const port = fake.address().port;
const child = spawn(bin, ['bench', 'serve', '--url', `http://127.0.0.1:${port}`, '-w', 'long',
  '-o', `${work}/nousage.json`], { stdio: ['ignore', 'ignore', 'pipe'] });
let err = '';
child.stderr.on('data', (d) => (err += d));
const status = await new Promise((ok) => child.on('exit', ok));
fake.close();
assert.equal(status, 1, `a run without usage fails:\n${err}`);
assert.match(err, /no usage/);
const bad = JSON.parse(readFileSync(`${work}/nousage.json`, 'utf8'));
assert.ok(bad.requests.length > 0 && bad.requests.every((q) => /no usage/.test(q.error)),
  'every response without usage is recorded as refused');
assert.ok(bad.requests.every((q) => q.prompt_tokens === undefined), 'no counts are invented');

// ---- 4. --url against a running petrel serve on this machine ----------------------
// Its memory comes from /proc of the process listening on the port.
const portFile = `${work}/port`;
rmSync(portFile, { force: true });
const srv = spawn(bin, ['serve', '--port', '0', '--port-file', portFile, '-q'], { stdio: 'ignore' });
let srvPort = 0;
for (let i = 0; i < 600 && !srvPort; i++) {
  await new Promise((ok) => setTimeout(ok, 100));
  const t = existsSync(portFile) ? readFileSync(portFile, 'utf8') : '';
  if (t.endsWith('\n')) srvPort = parseInt(t, 10);
}
assert.ok(srvPort > 0, 'petrel serve started');
const u = spawnSync(bin, ['bench', 'serve', '--url', `http://127.0.0.1:${srvPort}`, '-w', 'long',
  '--long-requests', '1', '--long-tokens', '100', '-n', '4', '--rss-interval', '20',
  '-o', `${work}/url.json`], { encoding: 'utf8', timeout: 300e3 });
srv.kill('SIGTERM');
assert.equal(u.status, 0, `bench serve --url failed:\n${u.stderr}`);
const viaUrl = JSON.parse(readFileSync(`${work}/url.json`, 'utf8'));
assert.equal(viaUrl.server.self_started, false);
assert.ok(viaUrl.requests.length >= 4 && viaUrl.requests.every((q) => !q.error), '--url requests');
assert.ok(viaUrl.samples.some((x) => x.rss_mb > 0), 'a local --url server\'s RSS is sampled');
console.log(`ok: ${run.requests.length} requests checked, ${plots.length} plots`);
