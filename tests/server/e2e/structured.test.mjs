// structured.test.mjs - response_format through the official openai
// client: json_schema output parses and validates against its schema
// (streamed and not, seeded, temperature 1, the bundled stories260K model,
// which left alone writes stories, not JSON); json_object gives an object;
// a schema feature Petrel cannot enforce is a 400 that names it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './lib.mjs';

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 12 },
    age: { type: 'integer', minimum: 1, maximum: 99 },
    mood: { enum: ['happy', 'sad', null] },
    tags: { type: 'array', items: { type: 'string', maxLength: 5 }, maxItems: 3 },
    pet: { $ref: '#/$defs/pet' },
  },
  required: ['name', 'age', 'mood'],
  additionalProperties: false,
  $defs: { pet: { type: 'object', properties: { kind: { type: 'string' } }, required: ['kind'], additionalProperties: false } },
};

// A validator for the keywords used above (no dependency to install).
function validate(schema, v, root = schema, at = '$') {
  if (schema.$ref) return validate(root.$defs[schema.$ref.split('/').pop()], v, root, at);
  const errs = [];
  const t = Array.isArray(v) ? 'array' : v === null ? 'null' : Number.isInteger(v) ? 'integer' : typeof v;
  if (schema.enum && !schema.enum.some((e) => e === v)) errs.push(`${at}: ${JSON.stringify(v)} not in enum`);
  if (schema.type && !(schema.type === t || (schema.type === 'number' && t === 'integer')))
    errs.push(`${at}: ${t} is not ${schema.type}`);
  if (t === 'string') {
    const n = [...v].length;
    if (schema.minLength !== undefined && n < schema.minLength) errs.push(`${at}: shorter than ${schema.minLength}`);
    if (schema.maxLength !== undefined && n > schema.maxLength) errs.push(`${at}: longer than ${schema.maxLength}`);
  }
  if (t === 'integer') {
    if (schema.minimum !== undefined && v < schema.minimum) errs.push(`${at}: below ${schema.minimum}`);
    if (schema.maximum !== undefined && v > schema.maximum) errs.push(`${at}: above ${schema.maximum}`);
  }
  if (t === 'array') {
    if (schema.maxItems !== undefined && v.length > schema.maxItems) errs.push(`${at}: more than ${schema.maxItems} items`);
    v.forEach((x, i) => schema.items && errs.push(...validate(schema.items, x, root, `${at}[${i}]`)));
  }
  if (t === 'object') {
    for (const k of schema.required || []) if (!(k in v)) errs.push(`${at}: ${k} missing`);
    for (const [k, x] of Object.entries(v)) {
      if (schema.properties && k in schema.properties) errs.push(...validate(schema.properties[k], x, root, `${at}.${k}`));
      else if (schema.additionalProperties === false) errs.push(`${at}: ${k} not allowed`);
    }
  }
  return errs;
}

function parseValid(text) {
  let v;
  assert.doesNotThrow(() => { v = JSON.parse(text); }, `not JSON: ${JSON.stringify(text)}`);
  assert.deepEqual(validate(SCHEMA, v), [], `invalid: ${text}`);
  return v;
}

const FORMAT = { type: 'json_schema', json_schema: { name: 'person', schema: SCHEMA, strict: true } };
const MSG = [{ role: 'user', content: 'Describe a person.' }];

describe('structured output', () => {
  let srv;
  before(async () => { srv = await startServer(['--threads', '2']); });
  after(async () => { await srv.stop('SIGTERM'); });

  test('json_schema: every seeded output parses and validates', async () => {
    const c = srv.client();
    for (let seed = 1; seed <= 8; seed++) {
      const r = await c.chat.completions.create({
        model: 'stories260K', messages: MSG, temperature: 1, seed, max_tokens: 400, response_format: FORMAT,
      });
      assert.equal(r.choices[0].finish_reason, 'stop', `seed ${seed}: ${r.choices[0].message.content}`);
      parseValid(r.choices[0].message.content);
    }
  });

  test('json_schema streamed: the deltas join into valid JSON', async () => {
    const stream = await srv.client().chat.completions.create({
      model: 'stories260K', messages: MSG, temperature: 1, seed: 42, max_tokens: 400, response_format: FORMAT, stream: true,
    });
    let text = '', finish = null;
    for await (const ch of stream) {
      text += ch.choices[0]?.delta?.content ?? '';
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'stop');
    parseValid(text);
  });

  test('json_object on /v1/completions gives an object', async () => {
    const r = await srv.client().completions.create({
      model: 'stories260K', prompt: 'Once upon a time', temperature: 1, seed: 3, max_tokens: 300,
      response_format: { type: 'json_object' },
    });
    const text = r.choices[0].text;
    if (r.choices[0].finish_reason === 'stop') {
      const v = JSON.parse(text);
      assert.equal(typeof v, 'object');
      assert.ok(v !== null && !Array.isArray(v));
    } else {
      assert.ok(text.trimStart().startsWith('{'), text); // cut by max_tokens: still an object's start
    }
  });

  test('an unsupported schema feature is a 400 that names it', async () => {
    const bad = { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } };
    await assert.rejects(
      srv.client().chat.completions.create({ model: 'stories260K', messages: MSG, response_format: bad }),
      (e) => e.status === 400 && /uniqueItems/.test(e.message));
    await assert.rejects(
      srv.client().chat.completions.create({ model: 'stories260K', messages: MSG, response_format: { type: 'xml' } }),
      (e) => e.status === 400);
  });
});
