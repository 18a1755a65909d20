// hardening.test.mjs - `petrel serve` against careless and hostile clients:
// an empty API key, slow clients, descriptor exhaustion, DNS rebinding,
// cross-origin web pages and non-JSON bodies (docs/server.md, "Security
// model").  run.sh runs it with the other *.test.mjs (CTest server/e2e);
// `run.sh WORK PETREL 8 hardening.test.mjs` runs it alone.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { PETREL, startServer } from './lib.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const env0 = { ...process.env };
delete env0.PETREL_API_KEY;

// Runs petrel to its end (or 30 s): the exit code (null if it had to be
// killed, i.e. it did not refuse) and stderr.
function petrel(args, env = {}) {
  return new Promise((resolve) => {
    const child = execFile(PETREL, args, { env: { ...env0, ...env }, timeout: 30000 },
      (err, stdout, stderr) => resolve({ code: child.exitCode, stderr }));
  });
}

// One request on a fresh connection (raw bytes, so Host and Origin are
// ours to choose); resolves with status, lower-cased headers and body.
function request(port, head, body = '') {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = '';
    sock.on('data', (d) => { got += d; });
    sock.on('error', reject);
    sock.on('close', () => {
      const [h, ...rest] = got.split('\r\n\r\n');
      const lines = h.split('\r\n');
      const headers = {};
      for (const l of lines.slice(1)) {
        const i = l.indexOf(':');
        headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
      }
      const status = Number(/^HTTP\/1\.1 (\d+)/.exec(lines[0])?.[1]);
      const text = rest.join('\r\n\r\n');
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      resolve({ status, headers, text, json });
    });
    sock.write(`${head.replace(/\n/g, '\r\n')}Connection: close\r\n\r\n${body}`);
  });
}

const get = (port, path, headers = '') => request(port, `GET ${path} HTTP/1.1\n${headers}`);
function post(port, path, headers, body) {
  return request(port, `POST ${path} HTTP/1.1\n${headers}Content-Length: ${Buffer.byteLength(body)}\n`, body);
}
const COMPLETION = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 2, temperature: 0 });

function assertError(r, status, code) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json?.error, `not an OpenAI-style error: ${r.text}`);
  assert.equal(r.json.error.code, code);
  assert.ok(r.json.error.message.length > 0);
}

// A client that sends prefix, then one byte every 200 ms until the server
// closes the connection; resolves with what it got and how long it lived.
function trickler(port, prefix) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const sock = net.connect(port, '127.0.0.1');
    let got = '', timer = null;
    sock.on('connect', () => {
      sock.write(prefix);
      timer = setInterval(() => sock.write('a'), 200);
    });
    sock.on('data', (d) => { got += d; });
    sock.on('error', () => {});
    sock.on('close', () => { clearInterval(timer); resolve({ ms: performance.now() - t0, got }); });
  });
}
const SLOW_HEAD = 'GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ';
const SLOW_BODY = 'POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n'
  + 'Content-Length: 100000\r\n\r\n{';

// Resolves with the value, or rejects if it takes longer than ms.
function within(promise, ms, what) {
  let t;
  return Promise.race([promise, new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`${what}: not done in ${ms} ms`)), ms); })])
    .finally(() => clearTimeout(t));
}

describe('API key', () => {
  test('--api-key "" is a start-up error', async () => {
    const r = await petrel(['serve', '--port', '0', '--api-key', '']);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /--api-key is empty/);
  });

  test('an empty PETREL_API_KEY is a start-up error that names it', async () => {
    const r = await petrel(['serve', '--port', '0'], { PETREL_API_KEY: '' });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /PETREL_API_KEY is set but empty/);
  });

  test('PETREL_API_KEY turns authentication on, and the start-up line says so', async () => {
    const srv = await startServer(['--threads', '1', '--ctx', '64'], { PETREL_API_KEY: 'sk-from-env' });
    try {
      assert.match(srv.log(), /listening on .*API key required/);
      assertError(await get(srv.port, '/v1/models', 'Host: localhost\n'), 401, 'invalid_api_key');
      assertError(await get(srv.port, '/v1/models', 'Host: localhost\nAuthorization: Bearer sk-from-en\n'), 401, 'invalid_api_key');
      assertError(await get(srv.port, '/v1/models', 'Host: localhost\nAuthorization: Bearer \n'), 401, 'invalid_api_key');
      const ok = await get(srv.port, '/v1/models', 'Host: localhost\nAuthorization: Bearer sk-from-env\n');
      assert.equal(ok.status, 200, ok.text);
    } finally { await srv.stop(); }
  });

  test('without a key the start-up line says that anyone may use it', async () => {
    const srv = await startServer(['--threads', '1', '--ctx', '64'], { PETREL_API_KEY: undefined });
    try {
      assert.match(srv.log(), /listening on .*no API key/);
      assert.doesNotMatch(srv.log(), /API key required/);
      assert.equal((await get(srv.port, '/v1/models', 'Host: localhost\n')).status, 200);
    } finally { await srv.stop(); }
  });
});

describe('slow clients', () => {
  const HT = 2; // --header-timeout, seconds: short so the test takes seconds

  test('200 trickling clients are closed by the deadline while /health answers within 1 s', async (t) => {
    const srv = await startServer(['--threads', '1', '--ctx', '64', '--header-timeout', String(HT)]);
    try {
      await (await fetch(`${srv.url}/health`)).json(); // fetch's own set-up is not the server's time
      const slow = [];
      for (let i = 0; i < 200; i++) slow.push(trickler(srv.port, i % 4 === 3 ? SLOW_BODY : SLOW_HEAD));
      let left = slow.length;
      const all = Promise.all(slow.map((p) => p.finally(() => { left--; })));
      const lat = [];
      while (left > 0) {
        const t0 = performance.now();
        const r = await fetch(`${srv.url}/health`);
        assert.equal(r.status, 200);
        await r.json();
        lat.push(performance.now() - t0);
        await sleep(100);
        if (lat.length > 300) break; // 30 s: the deadline did not close them
      }
      const done = await within(all, 1000, 'slow clients');
      t.diagnostic(`/health ms: ${lat.map((x) => x.toFixed(0)).join(" ")}`);
      t.diagnostic(`${lat.length} /health probes, slowest ${Math.max(...lat).toFixed(1)} ms; `
        + `slow clients closed after ${Math.min(...done.map((d) => d.ms)).toFixed(0)}..${Math.max(...done.map((d) => d.ms)).toFixed(0)} ms`);
      assert.ok(lat.length >= 5, `only ${lat.length} /health probes`);
      assert.ok(Math.max(...lat) < 1000, `/health took up to ${Math.max(...lat).toFixed(0)} ms`);
      for (const [i, d] of done.entries()) {
        assert.match(d.got, /^HTTP\/1\.1 408 /, `client ${i}: ${JSON.stringify(d.got.slice(0, 80))}`);
        assert.match(d.got, /"code":"request_timeout"/);
        assert.match(d.got, i % 4 === 3 ? /--min-body-rate/ : /--header-timeout/);
        // closed by the deadline: not before it, and not long after (the
        // linger that follows an error reply is bounded too)
        assert.ok(d.ms > (HT - 0.5) * 1000 && d.ms < (HT + 4) * 1000, `client ${i} closed after ${d.ms.toFixed(0)} ms`);
      }
    } finally {
      const { code } = await srv.stop();
      assert.equal(code, 0, srv.log());
    }
  });

  test('a body that keeps up with --min-body-rate is served across windows', async () => {
    const srv = await startServer(['--threads', '1', '--ctx', '64', '--header-timeout', '1', '--min-body-rate', '2000']);
    try {
      // 7 KB at about 3 KB/s: three windows, each bringing more than 2000 bytes
      const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 2, temperature: 0, user: 'x'.repeat(7000) });
      const got = await new Promise((resolve) => {
        const sock = net.connect(srv.port, '127.0.0.1');
        let text = '';
        sock.on('data', (d) => { text += d; });
        sock.on('close', () => resolve(text));
        sock.on('error', () => {});
        sock.on('connect', async () => {
          sock.write(`POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n`);
          for (let i = 0; i < body.length; i += 300) {
            sock.write(body.slice(i, i + 300));
            await sleep(100);
          }
        });
      });
      assert.match(got, /^HTTP\/1\.1 200 /, got.slice(0, 300));
    } finally { await srv.stop(); }
  });
});

describe('descriptor limit (ulimit -n 64)', () => {
  // 80 slow clients against 64 descriptors: the server stops accepting at
  // its cap (or when accept fails), says so once, and /health still answers
  // once the deadline frees slots.
  async function flood(t, extra, nofile = 64) {
    const srv = await startServer(['--threads', '1', '--ctx', '64', '--header-timeout', '2', ...extra], {}, { nofile });
    try {
      const slow = Array.from({ length: 80 }, () => trickler(srv.port, SLOW_HEAD));
      await sleep(500);
      const t0 = performance.now();
      const r = await within(fetch(`${srv.url}/health`), 30000, '/health');
      assert.equal(r.status, 200);
      t.diagnostic(`/health behind 80 slow clients answered after ${(performance.now() - t0).toFixed(0)} ms`);
      const done = await within(Promise.all(slow), 30000, 'slow clients');
      for (const d of done) assert.match(d.got, /^HTTP\/1\.1 408 /);
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
      return srv.log();
    } finally {
      const { code } = await srv.stop();
      assert.equal(code, 0, srv.log());
    }
  }

  test('the default cap leaves room: one log line, no accept failures', async (t) => {
    const log = await flood(t, []);
    const cap = Number(/up to (\d+) connections/.exec(log)?.[1]);
    assert.ok(cap > 0 && cap < 64, `cap ${cap}`);
    assert.equal(log.match(/not accepting new connections/g)?.length, 1, log);
    assert.doesNotMatch(log, /Too many open files|accept failed/);
  });

  test('--max-connections above the limit: accept failures pause accepting, logged once', async (t) => {
    const log = await flood(t, ['--max-connections', '500']);
    assert.match(log, /--max-connections 500 is more than/);
    assert.equal(log.match(/not accepting new connections/g)?.length, 1, log);
    assert.equal(log.match(/Too many open files/g)?.length, 1, log);
  });
});

describe('browser requests', () => {
  const APP = 'http://app.example:3000';
  let srv, port;
  before(async () => {
    srv = await startServer(['--threads', '1', '--ctx', '64', '--cors-origin', APP], { PETREL_API_KEY: undefined });
    port = srv.port;
  });
  after(async () => { await srv.stop(); });

  test('DNS rebinding: a foreign Host on a loopback server gets 403', async () => {
    for (const host of [`evil.example:${port}`, 'evil.example', `localhost.evil.example:${port}`, `127.0.0.1.nip.io:${port}`])
      assertError(await get(port, '/health', `Host: ${host}\n`), 403, 'host_not_allowed');
    // what a rebound page sends: its own name as Host and as Origin
    const evil = `evil.example:${port}`;
    assertError(await post(port, '/v1/completions', `Host: ${evil}\nOrigin: http://${evil}\nContent-Type: application/json\n`, COMPLETION), 403, 'host_not_allowed');
    for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`, 'LOCALHOST.', 'localhost'])
      assert.equal((await get(port, '/health', `Host: ${host}\n`)).status, 200, host);
    assert.equal((await get(port, '/health')).status, 200); // no Host: not a browser
  });

  test('--allowed-hosts adds names', async () => {
    const s2 = await startServer(['--threads', '1', '--ctx', '64', '--allowed-hosts', 'petrel.internal,other.internal']);
    try {
      assert.equal((await get(s2.port, '/health', 'Host: petrel.internal:8080\n')).status, 200);
      assert.equal((await get(s2.port, '/health', 'Host: other.internal\n')).status, 200);
      assert.equal((await get(s2.port, '/health', 'Host: localhost\n')).status, 200);
      assertError(await get(s2.port, '/health', 'Host: evil.example\n'), 403, 'host_not_allowed');
    } finally { await s2.stop(); }
    const bad = await petrel(['serve', '--port', '0', '--allowed-hosts', 'petrel.internal:8080']);
    assert.equal(bad.code, 1, bad.stderr);
    assert.match(bad.stderr, /--allowed-hosts: 'petrel.internal:8080' is not a host name/);
  });

  test('CORS: a foreign origin is refused, the allowed one gets headers', async () => {
    const h = `Host: localhost:${port}\n`;
    // the reproduction: a page posting text/plain from elsewhere
    assertError(await post(port, '/v1/completions', `${h}Origin: http://evil.example\nContent-Type: text/plain\n`, COMPLETION), 403, 'origin_not_allowed');
    assertError(await post(port, '/v1/completions', `${h}Origin: http://evil.example\nContent-Type: application/json\n`, COMPLETION), 403, 'origin_not_allowed');
    assertError(await get(port, '/v1/models', `${h}Origin: null\n`), 403, 'origin_not_allowed');
    assertError(await get(port, '/v1/models', `${h}Origin: http://app.example:3001\n`), 403, 'origin_not_allowed');

    const ok = await post(port, '/v1/completions', `${h}Origin: ${APP}\nContent-Type: application/json\n`, COMPLETION);
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.headers['access-control-allow-origin'], APP);
    assert.equal(ok.headers.vary, 'Origin');
    // errors reach the page too, so it can show them
    const nf = await get(port, '/v1/nothing', `${h}Origin: ${APP}\n`);
    assert.equal(nf.status, 404);
    assert.equal(nf.headers['access-control-allow-origin'], APP);

    // same origin (the page was served from this address) needs no CORS
    const same = await get(port, '/v1/models', `${h}Origin: http://localhost:${port}\n`);
    assert.equal(same.status, 200);
    assert.equal(same.headers['access-control-allow-origin'], undefined);
  });

  test('CORS preflight', async () => {
    const h = `Host: localhost:${port}\n`;
    const pre = await request(port, `OPTIONS /v1/chat/completions HTTP/1.1\n${h}Origin: ${APP}\n`
      + 'Access-Control-Request-Method: POST\nAccess-Control-Request-Headers: authorization, content-type, x-stainless-os\n');
    assert.equal(pre.status, 204, pre.text);
    assert.equal(pre.text, '');
    assert.equal(pre.headers['content-length'], undefined);
    assert.equal(pre.headers['access-control-allow-origin'], APP);
    assert.match(pre.headers['access-control-allow-methods'], /\bPOST\b/);
    const allowed = pre.headers['access-control-allow-headers'].toLowerCase().split(/\s*,\s*/);
    for (const name of ['authorization', 'content-type', 'x-stainless-os']) assert.ok(allowed.includes(name), allowed.join());
    assert.ok(Number(pre.headers['access-control-max-age']) > 0);
    const models = await request(port, `OPTIONS /v1/models HTTP/1.1\n${h}Origin: ${APP}\nAccess-Control-Request-Method: GET\n`);
    assert.equal(models.status, 204);
    assert.match(models.headers['access-control-allow-methods'], /\bGET\b/);
    const evil = await request(port, `OPTIONS /v1/chat/completions HTTP/1.1\n${h}Origin: http://evil.example\nAccess-Control-Request-Method: POST\n`);
    assertError(evil, 403, 'origin_not_allowed');
    assert.equal(evil.headers['access-control-allow-origin'], undefined);
  });

  test('--cors-origin "*"', async () => {
    const s2 = await startServer(['--threads', '1', '--ctx', '64', '--cors-origin', '*']);
    try {
      const r = await get(s2.port, '/v1/models', 'Host: localhost\nOrigin: http://anything.example\n');
      assert.equal(r.status, 200);
      assert.equal(r.headers['access-control-allow-origin'], '*');
    } finally { await s2.stop(); }
  });

  test('a POST body must be application/json: else 415', async () => {
    const h = 'Host: localhost\n';
    assertError(await post(port, '/v1/completions', `${h}Content-Type: text/plain\n`, COMPLETION), 415, 'unsupported_media_type');
    assertError(await post(port, '/v1/completions', `${h}Content-Type: application/x-www-form-urlencoded\n`, COMPLETION), 415, 'unsupported_media_type');
    assertError(await post(port, '/v1/chat/completions', h, COMPLETION), 415, 'unsupported_media_type');
    for (const ct of ['application/json', 'application/json; charset=utf-8', 'Application/JSON'])
      assert.equal((await post(port, '/v1/completions', `${h}Content-Type: ${ct}\n`, COMPLETION)).status, 200, ct);
  });
});
