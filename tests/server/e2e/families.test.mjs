// families.test.mjs - chat end to end for the model families of issue 16
// (Gemma 2, Gemma 3, Qwen3-MoE, gpt-oss) in `petrel serve`, with their real
// chat templates (tests/template/chat, fuzz/corpus/jinja) and the tiny
// random transformers fixtures of tests/fixtures/hf.  The fixtures ship no
// tokenizer, so each gets a byte-level one here: every byte one token (no
// merges) and the family's special tokens, which makes a rendered
// prompt's token count exact and checkable.  The models write gibberish,
// so what is asserted is what can fail: the prompt the template renders
// (usage.prompt_tokens against the text written out here), template errors
// as 400s, grammar-forced calls and JSON as well-formed OpenAI answers in
// harmony (gpt-oss) and Hermes (Qwen3) markup, streamed deltas that add up
// to the whole answer, and tool round trips the openai client sends.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Ajv from 'ajv';
import { SOURCE_DIR, startServer } from './lib.mjs';

const MODEL = 'fam';
const VOCAB = 320; // every fixture's vocab_size
const ajv = new Ajv();

// GPT-2's byte -> printable character map (byte-level BPE vocabularies).
function byteChars() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const map = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) map[b] = bs.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + n++);
  return map;
}

// specials: [[content, special]] at ids 0.. ; then the 256 bytes; then
// two-byte fillers up to VOCAB (never produced by encoding, but the model
// may sample them).
function tokenizerJson(specials) {
  const chars = byteChars();
  const vocab = {};
  const added = specials.map(([content, special], id) => {
    vocab[content] = id;
    return { id, content, special, single_word: false, lstrip: false, rstrip: false, normalized: false };
  });
  let id = specials.length;
  for (const c of chars) vocab[c] = id++;
  for (let i = 0; id < VOCAB; i++) vocab[chars[97 + (i % 26)] + chars[97 + Math.floor(i / 26)]] = id++;
  return {
    version: '1.0', added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null, decoder: { type: 'ByteLevel' },
    model: { type: 'BPE', vocab, merges: [] },
  };
}

// The tokens a rendered prompt has under that tokenizer: one per special
// token written out, one per byte of the rest.
function countTokens(text, specials) {
  let n = 0;
  for (let i = 0; i < text.length;) {
    const s = specials.find(([c]) => text.startsWith(c, i));
    if (s) { n++; i += s[0].length; continue; }
    const cp = text.codePointAt(i);
    n += Buffer.byteLength(String.fromCodePoint(cp));
    i += cp > 0xffff ? 2 : 1;
  }
  return n;
}

const tmp = mkdtempSync(path.join(os.tmpdir(), 'petrel-families-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

// A model directory: the fixture's weights and config, our tokenizer, the
// real template, and generation_config's end tokens.
function modelDir(fixture, template, specials, config, eos) {
  const dir = path.join(tmp, fixture), src = path.join(SOURCE_DIR, 'tests/fixtures/hf', fixture);
  mkdirSync(dir);
  for (const f of ['config.json', 'model.safetensors']) symlinkSync(path.join(src, f), path.join(dir, f));
  writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson(specials)));
  writeFileSync(path.join(dir, 'tokenizer_config.json'),
    JSON.stringify({ ...config, chat_template: readFileSync(path.join(SOURCE_DIR, template), 'utf8') }));
  writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: eos }));
  return dir;
}

// A streamed answer gathered: reasoning, content, calls by index.
async function gather(stream) {
  const a = { reasoning: '', content: '', calls: [], finish: null };
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    a.reasoning += c.delta?.reasoning_content ?? '';
    a.content += c.delta?.content ?? '';
    for (const d of c.delta?.tool_calls ?? []) {
      if (!a.calls[d.index]) {
        assert.match(d.id, /^call_/); // the first chunk of a call names it
        assert.equal(d.type, 'function');
        a.calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
      }
      a.calls[d.index].arguments += d.function?.arguments ?? '';
    }
    if (c.finish_reason) a.finish = c.finish_reason;
  }
  return a;
}

// The streamed answer is the whole one (greedy: the same tokens).
function sameAnswer(streamed, whole) {
  const m = whole.choices[0].message;
  assert.equal(streamed.reasoning, m.reasoning_content ?? '');
  assert.equal(streamed.content, m.content ?? '');
  assert.deepEqual(streamed.calls.map((c) => [c.name, c.arguments]),
    (m.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]));
  assert.equal(streamed.finish, whole.choices[0].finish_reason);
}

// A clean exit: under ASan a leak (say, of a harmony parser) fails it.
async function stopClean(srv) {
  if (!srv) return;
  const { code } = await srv.stop();
  assert.equal(code, 0, srv.log());
}

async function post(srv, body) {
  const r = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: MODEL, ...body }),
  });
  return { status: r.status, json: await r.json() };
}

const USER = [{ role: 'user', content: 'Hi' }];
const SYS_USER = [{ role: 'system', content: 'Be terse.' }, { role: 'user', content: 'Hi' }];
const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: {
      type: 'object', properties: { city: { enum: ['Oslo', 'Rome'] }, unit: { enum: ['c', 'f'] } },
      required: ['city', 'unit'], additionalProperties: false,
    },
  },
};
const ADD = {
  type: 'function',
  function: {
    name: 'add', description: 'Adds',
    parameters: {
      type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['a', 'b'], additionalProperties: false,
    },
  },
};
const valid = { get_weather: ajv.compile(WEATHER.function.parameters), add: ajv.compile(ADD.function.parameters) };
function checkCall(name, args) {
  assert.ok(valid[name], `unknown tool ${name}`);
  assert.ok(valid[name](JSON.parse(args)), `${name}(${args})`);
}

describe('Gemma 2 (no system role)', () => {
  const SPECIALS = [['<pad>', true], ['<bos>', true], ['<eos>', true], ['<start_of_turn>', true], ['<end_of_turn>', true]];
  let srv;
  before(async () => {
    const dir = modelDir('gemma2', 'tests/template/chat/google-gemma-2-2b-it.jinja', SPECIALS,
      { bos_token: '<bos>', eos_token: '<eos>', add_bos_token: true }, [2, 4]);
    srv = await startServer(['--threads', '1', '-m', dir, '--model-name', MODEL]);
  });
  after(async () => stopClean(srv));

  test('the prompt is the template\'s; streamed equals whole', async () => {
    const body = { model: MODEL, messages: USER, temperature: 0, max_tokens: 16 };
    const whole = await srv.client().chat.completions.create(body);
    assert.equal(whole.usage.prompt_tokens,
      countTokens('<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n', SPECIALS));
    sameAnswer(await gather(await srv.client().chat.completions.create({ ...body, stream: true })), whole);
  });

  test('a system message is a 400 that says why', async () => {
    const r = await post(srv, { messages: SYS_USER, max_tokens: 4 });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /System role not supported/);
  });
});

describe('Gemma 3 (the system message folds into the first turn)', () => {
  const SPECIALS = [['<pad>', true], ['<bos>', true], ['<eos>', true], ['<start_of_turn>', true], ['<end_of_turn>', true]];
  let srv;
  before(async () => {
    const dir = modelDir('gemma3_text', 'fuzz/corpus/jinja/gemma3.jinja', SPECIALS,
      { bos_token: '<bos>', eos_token: '<eos>', add_bos_token: true }, [2, 4]);
    srv = await startServer(['--threads', '1', '-m', dir, '--model-name', MODEL]);
  });
  after(async () => stopClean(srv));

  test('prompt tokens of the folded prompt', async () => {
    const r = await srv.client().chat.completions.create({ model: MODEL, messages: SYS_USER, temperature: 0, max_tokens: 8 });
    assert.equal(r.usage.prompt_tokens, countTokens(
      '<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n', SPECIALS));
  });
});

describe('Qwen3-MoE (Qwen3 template: <think>, Hermes calls)', () => {
  const SPECIALS = [['<|endoftext|>', true], ['<|im_start|>', true], ['<|im_end|>', true],
    ['<think>', false], ['</think>', false], ['<tool_call>', false], ['</tool_call>', false]];
  let srv;
  before(async () => {
    const dir = modelDir('qwen3_moe', 'fuzz/corpus/jinja/qwen3.jinja', SPECIALS,
      { eos_token: '<|im_end|>', pad_token: '<|endoftext|>' }, [2, 0]);
    srv = await startServer(['--threads', '1', '-m', dir, '--model-name', MODEL]);
  });
  after(async () => stopClean(srv));

  test('enable_thinking false renders the empty <think>; streamed equals whole', async () => {
    const base = '<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n';
    const body = { model: MODEL, messages: SYS_USER, temperature: 0, max_tokens: 24 };
    const on = await srv.client().chat.completions.create(body);
    assert.equal(on.usage.prompt_tokens, countTokens(base, SPECIALS));
    sameAnswer(await gather(await srv.client().chat.completions.create({ ...body, stream: true })), on);
    const off = await srv.client().chat.completions.create({ ...body, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(off.usage.prompt_tokens, countTokens(base + '<think>\n\n</think>\n\n', SPECIALS));
    assert.equal(off.choices[0].message.reasoning_content, undefined);
  });

  test('a forced call is a tool_calls answer, streamed and not', async () => {
    const body = { model: MODEL, messages: USER, tools: [WEATHER, ADD], tool_choice: 'required', temperature: 0, max_tokens: 60 };
    const whole = await srv.client().chat.completions.create(body);
    assert.equal(whole.choices[0].finish_reason, 'tool_calls');
    const [call] = whole.choices[0].message.tool_calls;
    checkCall(call.function.name, call.function.arguments);
    sameAnswer(await gather(await srv.client().chat.completions.create({ ...body, stream: true })), whole);
  });
});

describe('gpt-oss (harmony)', () => {
  const SPECIALS = [['<|endoftext|>', true], ['<|startoftext|>', true], ['<|return|>', true], ['<|start|>', true],
    ['<|end|>', true], ['<|message|>', true], ['<|channel|>', true], ['<|constrain|>', true], ['<|call|>', true]];
  let srv;
  before(async () => {
    const dir = modelDir('gpt_oss', 'tests/template/chat/openai-gpt-oss-120b.jinja', SPECIALS,
      { bos_token: '<|startoftext|>', eos_token: '<|return|>', pad_token: '<|endoftext|>' }, [2, 0, 8]);
    srv = await startServer(['--threads', '1', '-m', dir, '--model-name', MODEL]);
  });
  after(async () => stopClean(srv));

  test('the prompt: system, developer instructions, reasoning effort; ends <|start|>assistant', async () => {
    const r = await srv.client().chat.completions.create({
      model: MODEL, messages: SYS_USER, temperature: 0, max_tokens: 8, chat_template_kwargs: { reasoning_effort: 'low' },
    });
    const date = '2000-01-01'; // strftime_now("%Y-%m-%d"): any date has this length
    const prompt = '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n' +
      `Knowledge cutoff: 2024-06\nCurrent date: ${date}\n\nReasoning: low\n\n` +
      '# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>' +
      '<|start|>developer<|message|># Instructions\n\nBe terse.\n\n<|end|>' +
      '<|start|>user<|message|>Hi<|end|><|start|>assistant';
    assert.equal(r.usage.prompt_tokens, countTokens(prompt, SPECIALS));
    // OpenAI's reasoning_effort reaches the template too ("high": 1 more byte than "low")
    const high = await srv.client().chat.completions.create({
      model: MODEL, messages: SYS_USER, temperature: 0, max_tokens: 8, reasoning_effort: 'high',
    });
    assert.equal(high.usage.prompt_tokens, countTokens(prompt.replace('Reasoning: low', 'Reasoning: high'), SPECIALS));
  });

  // Left alone the random model writes no markers; logit_bias makes it
  // write <|start|>, <|end|>, <|message|>, <|channel|> and <|constrain|>
  // among its bytes, so the special tokens go through the detokenizer,
  // the stream's hold-back and the splitter (random text, not harmony:
  // whatever it is, the stream must add up to the whole answer).
  test('free generation with markers: streamed equals whole', async () => {
    let marked = 0;
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const body = {
        model: MODEL, messages: USER, tools: [WEATHER], seed, temperature: 1, max_tokens: 32, logprobs: true,
        logit_bias: { 3: 5, 4: 7, 5: 9, 6: 7, 7: 5 },
      };
      const whole = await srv.client().chat.completions.create(body);
      sameAnswer(await gather(await srv.client().chat.completions.create({ ...body, stream: true })), whole);
      const raw = whole.choices[0].logprobs.content.map((t) => t.token).join('');
      if (raw.includes('<|message|>') && raw.includes('<|end|>')) marked++;
    }
    assert.ok(marked >= 3, `only ${marked} of 6 answers had <|message|> and <|end|>: raise the bias`);
  });

  test('a forced call (one tool, a named one, any of two): tool_calls, streamed and not', async () => {
    const cases = [
      [[WEATHER], 'required', 'get_weather'],
      [[WEATHER, ADD], { type: 'function', function: { name: 'add' } }, 'add'],
      [[WEATHER, ADD], 'required', null],
    ];
    for (const [tools, tool_choice, name] of cases) {
      // byte tokens, and a whitespace between JSON tokens where the grammar allows it: room for 150
      const body = { model: MODEL, messages: USER, tools, tool_choice, temperature: 0, max_tokens: 150 };
      const whole = await srv.client().chat.completions.create(body);
      const ch = whole.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
      assert.equal(ch.message.content, null);
      assert.equal(ch.message.tool_calls.length, 1);
      const fn = ch.message.tool_calls[0].function;
      if (name) assert.equal(fn.name, name);
      checkCall(fn.name, fn.arguments);
      sameAnswer(await gather(await srv.client().chat.completions.create({ ...body, stream: true })), whole);
    }
  });

  test('response_format: the JSON is the final channel\'s content', async () => {
    const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
    const r = await srv.client().chat.completions.create({
      model: MODEL, messages: USER, temperature: 0, max_tokens: 40,
      response_format: { type: 'json_schema', json_schema: { name: 'r', schema, strict: true } },
    });
    const m = r.choices[0].message;
    assert.equal(m.reasoning_content, undefined);
    assert.ok(ajv.validate(schema, JSON.parse(m.content)), m.content);
  });

  test('a tool round trip as the openai client sends it (content: null) renders', async () => {
    const r = await post(srv, {
      messages: [
        { role: 'user', content: 'Weather in Oslo?' },
        { role: 'assistant', content: null, reasoning_content: 'Call it.', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo","unit":"c"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '3C' },
      ],
      tools: [WEATHER], temperature: 0, max_tokens: 8,
    });
    assert.equal(r.status, 200, JSON.stringify(r.json));
  });
});
