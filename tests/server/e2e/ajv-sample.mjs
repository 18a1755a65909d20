// ajv-sample.mjs DIR [N] [STRIDE] - issue 14's sample: generated output
// for N MaskBench schemas (every STRIDE-th file of DIR, a MaskBench split
// unpacked: {"schema", "tests"} per file) validates with ajv.  One
// `petrel serve` (the bundled stories260K unless PETREL_MODEL), temperature
// 1, seeded by the file's index, response_format json_schema; 4 requests
// in flight.  Schemas Petrel refuses (400) are counted and skipped, as are
// ones ajv cannot compile (draft-04 only forms, remote refs); outputs cut
// by max_tokens are counted apart (not JSON yet, not a grammar failure).
// Prints the counts and every invalid output with ajv's errors; exits 1
// if any output that finished fails ajv.
//
//   tests/server/e2e/run.sh build/e2e-server build/petrel 1 ajv-sample.mjs \
//       "$PWD/build/maskbench/maskbench-data" 500 7
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import Ajv from 'ajv';
import { startServer } from './lib.mjs';

const dir = process.argv[2];
const want = Number(process.argv[3] || 500);
const stride = Number(process.argv[4] || 7);
const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();

// draft-04's boolean exclusiveMinimum/Maximum and "id" in ajv 8's terms
// (formats are not checked: ajv-formats is not installed)
function modernize(s) {
  if (Array.isArray(s)) return s.map(modernize);
  if (!s || typeof s !== 'object') return s;
  const o = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === '$schema' || (k === 'id' && typeof v === 'string')) continue; /* draft-04's id: ajv 8 wants $id */
    if ((k === 'exclusiveMinimum' || k === 'exclusiveMaximum') && typeof v === 'boolean') continue;
    o[k] = k === 'properties' || k === 'patternProperties' || k === '$defs' || k === 'definitions'
      ? Object.fromEntries(Object.entries(v || {}).map(([p, x]) => [p, modernize(x)]))
      : modernize(v);
  }
  for (const [b, k] of [['minimum', 'exclusiveMinimum'], ['maximum', 'exclusiveMaximum']])
    if (s[k] === true && typeof s[b] === 'number') { o[k] = s[b]; delete o[b]; }
  return o;
}

const srv = await startServer(['--parallel', '4']);
const model = (await (await fetch(`${srv.url}/v1/models`)).json()).data[0].id;
const counts = { tried: 0, refused: 0, ajv_cannot: 0, cut: 0, valid: 0, invalid: 0, not_json: 0 };
const bad = [];
let next = 0;
async function one(i) {
  const f = files[i];
  const { schema } = JSON.parse(readFileSync(path.join(dir, f), 'utf8'));
  let check;
  try {
    check = new Ajv({ strict: false, validateFormats: false, allErrors: true, unicodeRegExp: false }).compile(modernize(schema));
  } catch {
    counts.ajv_cannot++;
    return;
  }
  const body = {
    model, temperature: 1, seed: i, max_tokens: 1500,
    messages: [{ role: 'user', content: 'Write the JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'out', schema } },
  };
  const r = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const j = await r.json();
  if (r.status === 400) { counts.refused++; return; }
  if (r.status !== 200) throw new Error(`${f}: ${r.status} ${JSON.stringify(j)}`);
  counts.tried++;
  const c = j.choices[0];
  if (c.finish_reason === 'length') { counts.cut++; return; }
  let v;
  try { v = JSON.parse(c.message.content); } catch {
    counts.not_json++;
    bad.push(`${f}: not JSON: ${c.message.content.slice(0, 300)}`);
    return;
  }
  if (check(v)) counts.valid++;
  else {
    counts.invalid++;
    bad.push(`${f}: ${JSON.stringify(check.errors).slice(0, 400)}\n  ${c.message.content.slice(0, 300)}`);
  }
}
async function worker() {
  while (counts.valid + counts.invalid + counts.not_json < want) {
    const i = next;
    next += stride;
    if (i >= files.length) return;
    await one(i);
  }
}
await Promise.all([worker(), worker(), worker(), worker()]);
await srv.stop();
console.log(JSON.stringify({ ...counts, files_seen: Math.ceil(Math.min(files.length, next) / stride) }));
for (const b of bad) console.log(b);
process.exit(counts.invalid + counts.not_json > 0 ? 1 : 0);
