// sdk.test.mjs - the SDKs applications use, from npm, against `petrel serve`
// with the bundled stories260K (which left alone writes stories, not JSON
// or calls): the Vercel AI SDK (generateObject with a zod schema, tools with
// toolChoice 'required', streamText), LangChain.js (withStructuredOutput,
// bindTools) and the openai client (zodResponseFormat, tools, n: 3,
// streamed tool-call deltas).  Every output is parsed and validated with
// zod or ajv.  Schemas bound their strings so a grammar-forced answer
// always fits in max_tokens, whatever the seed.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Ajv from 'ajv';
import { z } from 'zod';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateObject, generateText, streamText, tool } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { startServer } from './lib.mjs';

const MODEL = 'stories260K';
const Person = z.object({
  name: z.string().min(1).max(12),
  age: z.number().int().min(1).max(99),
  mood: z.enum(['happy', 'sad']),
});
const WeatherArgs = z.object({ city: z.string().min(1).max(10), unit: z.enum(['c', 'f']) });
const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', minLength: 1, maxLength: 10 }, unit: { enum: ['c', 'f'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const ADD_TOOL = {
  type: 'function',
  function: {
    name: 'add',
    parameters: {
      type: 'object',
      properties: { a: { type: 'integer', minimum: 0, maximum: 999 }, b: { type: 'integer', minimum: 0, maximum: 999 } },
      required: ['a', 'b'],
      additionalProperties: false,
    },
  },
};
const ajv = new Ajv();
const validArgs = {
  get_weather: ajv.compile(WEATHER_TOOL.function.parameters),
  add: ajv.compile(ADD_TOOL.function.parameters),
};

function checkCall(call) {
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(call.type, 'function');
  const v = validArgs[call.function.name];
  assert.ok(v, `unknown tool ${call.function.name}`);
  const args = JSON.parse(call.function.arguments);
  assert.ok(v(args), `${call.function.arguments}: ${ajv.errorsText(v.errors)}`);
  return args;
}

let srv;
before(async () => { srv = await startServer(['--threads', '2']); });
after(async () => { await srv?.stop(); });

describe('Vercel AI SDK (ai + @ai-sdk/openai-compatible)', () => {
  const model = () => createOpenAICompatible({
    name: 'petrel', baseURL: `${srv.url}/v1`, apiKey: 'sk-none', supportsStructuredOutputs: true, includeUsage: true,
  })(MODEL);

  test('generateObject with a zod schema', async () => {
    for (const seed of [1, 2, 3]) {
      const { object, finishReason } = await generateObject({
        model: model(), schema: Person, schemaName: 'person', prompt: 'Describe a person.',
        seed, temperature: 1, maxOutputTokens: 200, maxRetries: 0,
      });
      assert.equal(finishReason, 'stop');
      Person.parse(object);
    }
  });

  test("tools with toolChoice 'required'", async () => {
    const r = await generateText({
      model: model(),
      tools: {
        get_weather: tool({ description: 'The weather in a city', inputSchema: WeatherArgs }),
        add: tool({ inputSchema: z.object({ a: z.number().int().min(0).max(999), b: z.number().int().min(0).max(999) }) }),
      },
      toolChoice: 'required', prompt: 'What is the weather in Paris?',
      seed: 7, maxOutputTokens: 200, maxRetries: 0,
    });
    assert.equal(r.finishReason, 'tool-calls');
    assert.ok(r.toolCalls.length >= 1);
    for (const c of r.toolCalls) {
      assert.ok(['get_weather', 'add'].includes(c.toolName));
      assert.ok(!c.invalid, `invalid call: ${JSON.stringify(c)}`);
      if (c.toolName === 'get_weather') WeatherArgs.parse(c.input);
    }
  });

  test('streamText streams the text generateText returns', async () => {
    const opts = { model: model(), prompt: 'Once upon a time', temperature: 0, maxOutputTokens: 24, maxRetries: 0 };
    const whole = await generateText(opts);
    const s = streamText(opts);
    let text = '';
    for await (const t of s.textStream) text += t;
    assert.ok(whole.text.length > 0);
    assert.equal(text, whole.text);
    assert.equal((await s.usage).outputTokens, whole.usage.outputTokens);
  });
});

describe('LangChain.js (@langchain/openai)', () => {
  const llm = (extra = {}) => new ChatOpenAI({
    model: MODEL, apiKey: 'sk-none', configuration: { baseURL: `${srv.url}/v1` },
    temperature: 1, maxTokens: 200, maxRetries: 0, ...extra,
  });

  test('withStructuredOutput (json_schema) validates', async () => {
    const structured = llm().withStructuredOutput(Person, { name: 'person', method: 'jsonSchema' });
    for (let i = 0; i < 3; i++) Person.parse(await structured.invoke('Describe a person.'));
  });

  test("bindTools with tool_choice 'required'", async () => {
    const bound = llm().bindTools([WEATHER_TOOL, ADD_TOOL], { tool_choice: 'required' });
    const msg = await bound.invoke('What is the weather in Paris?');
    assert.ok(msg.tool_calls.length >= 1, JSON.stringify(msg));
    for (const c of msg.tool_calls) {
      assert.match(c.id, /^call_/);
      assert.ok(validArgs[c.name](c.args), JSON.stringify(c));
    }
  });

  test('bindTools with a named tool, streamed', async () => {
    const bound = llm({ streaming: true }).bindTools([WEATHER_TOOL, ADD_TOOL], {
      tool_choice: { type: 'function', function: { name: 'add' } },
    });
    let acc;
    for await (const chunk of await bound.stream('Add two numbers.')) acc = acc ? acc.concat(chunk) : chunk;
    assert.equal(acc.tool_calls.length, 1, JSON.stringify(acc));
    assert.equal(acc.tool_calls[0].name, 'add');
    assert.ok(validArgs.add(acc.tool_calls[0].args));
  });
});

describe('openai (structured output, tools, n, streamed calls)', () => {
  test('response_format json_schema via zodResponseFormat', async () => {
    const c = await srv.client().chat.completions.parse({
      model: MODEL, messages: [{ role: 'user', content: 'Describe a person.' }],
      response_format: zodResponseFormat(Person, 'person'), seed: 3, max_tokens: 200,
    });
    Person.parse(c.choices[0].message.parsed);
  });

  test('tools: zodFunction, required, auto and none', async () => {
    const client = srv.client();
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const forced = await client.chat.completions.parse({
      model: MODEL, messages, seed: 5, max_tokens: 200,
      tools: [zodFunction({ name: 'get_weather', parameters: WeatherArgs })], tool_choice: 'required',
    });
    const ch = forced.choices[0];
    assert.equal(ch.finish_reason, 'tool_calls');
    assert.equal(ch.message.content, null);
    assert.equal(ch.message.tool_calls.length, 1);
    WeatherArgs.parse(ch.message.tool_calls[0].function.parsed_arguments);
    // auto: the story-writing model answers in text, and that is content
    const auto = await client.chat.completions.create({
      model: MODEL, messages, tools: [WEATHER_TOOL], tool_choice: 'auto', temperature: 0, max_tokens: 16,
    });
    assert.equal(auto.choices[0].finish_reason, 'length');
    assert.ok(auto.choices[0].message.content.length > 0);
    assert.equal(auto.choices[0].message.tool_calls, undefined);
    const none = await client.chat.completions.create({
      model: MODEL, messages, tools: [WEATHER_TOOL], tool_choice: 'none', temperature: 0, max_tokens: 16,
    });
    assert.equal(none.choices[0].message.content, auto.choices[0].message.content);
    // the call and its result go back through the template
    const call = ch.message.tool_calls[0];
    const next = await client.chat.completions.create({
      model: MODEL, temperature: 0, max_tokens: 8, tools: [WEATHER_TOOL],
      messages: [...messages,
        { role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: { name: call.function.name, arguments: call.function.arguments } }] },
        { role: 'tool', tool_call_id: call.id, content: '21 degrees' }],
    });
    assert.ok(next.usage.prompt_tokens > forced.usage.prompt_tokens);
    assert.equal(typeof next.choices[0].message.content, 'string');
  });

  test('malformed call markup in the output comes back as content, streamed and not', async () => {
    // a grammar makes the model write the markup: a JSON string holding an
    // unclosed tag, invalid JSON in a closed one, and a call with escaped quotes
    const client = srv.client();
    for (const markup of ['<tool_call>{"name": "add", "arguments": {', '<tool_call>{oops}</tool_call> done',
      'x <tool_call>{"name":"add","arguments":{}}</tool_call>']) {
      const body = {
        model: MODEL, messages: [{ role: 'user', content: 'hi' }], tools: [ADD_TOOL], max_tokens: 200,
        // one seed for both requests: the grammar lets the sampler put a
        // "\n" before the string, and two unseeded samples differed there
        seed: 69, // samples that "\n" today
        response_format: { type: 'json_schema', json_schema: { name: 'm', schema: { const: markup } } },
      };
      const r = await client.chat.completions.create(body);
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.equal(r.choices[0].message.tool_calls, undefined);
      assert.equal(JSON.parse(r.choices[0].message.content), markup);
      let text = '';
      for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
        assert.equal(chunk.choices[0]?.delta?.tool_calls, undefined);
        text += chunk.choices[0]?.delta?.content ?? '';
      }
      assert.equal(text, r.choices[0].message.content);
    }
  });

  test('bad tool requests are 400s naming the field', async () => {
    const client = srv.client();
    const base = { model: MODEL, messages: [{ role: 'user', content: 'hi' }] };
    const cases = [
      [{ tools: [WEATHER_TOOL], tool_choice: 'sometimes' }, 'tool_choice'],
      [{ tools: [WEATHER_TOOL], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
      [{ tool_choice: 'required' }, 'tool_choice'],
      [{ tools: [{ type: 'function', function: {} }] }, 'tools[0]'],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'array', uniqueItems: true } } }], tool_choice: 'required' }, 'tools'],
      [{ tools: [WEATHER_TOOL], parallel_tool_calls: 'yes' }, 'parallel_tool_calls'],
    ];
    for (const [extra, param] of cases) {
      await assert.rejects(client.chat.completions.create({ ...base, ...extra }),
        (e) => e.status === 400 && e.param === param, JSON.stringify(extra));
    }
  });

  test('n: 3 gives three distinct seeded choices, with logprobs, usage summed', async () => {
    const client = srv.client();
    const body = {
      model: MODEL, messages: [{ role: 'user', content: 'Tell me a story about a dog.' }],
      n: 3, seed: 11, temperature: 1, max_tokens: 16, logprobs: true, top_logprobs: 2,
    };
    const r = await client.chat.completions.create(body);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 3);
    let n = 0;
    for (const c of r.choices) {
      assert.ok(c.logprobs.content.length > 0);
      for (const t of c.logprobs.content) assert.equal(t.top_logprobs.length, 2);
      n += c.logprobs.content.length;
    }
    assert.equal(r.usage.completion_tokens, n);
    // the same seed streamed: each index's text is its non-streamed text
    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    const text = ['', '', ''], finish = [];
    let usage;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text[c.index] += c.delta.content ?? '';
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.deepEqual(text, r.choices.map((c) => c.message.content));
    assert.deepEqual(finish, r.choices.map((c) => c.finish_reason));
    assert.equal(usage.completion_tokens, r.usage.completion_tokens);
    // the later choices reused the prompt's pages (the request's log line)
    const line = srv.log().split('\n').filter((l) => l.includes('choices=3')).pop();
    assert.match(line, /sibling_cached=(\d+)/);
    assert.ok(Number(/sibling_cached=(\d+)/.exec(line)[1]) > 0, line);
  });

  test('n: 3 forced tool calls, each valid', async () => {
    const r = await srv.client().chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], n: 3, max_tokens: 200,
      tools: [WEATHER_TOOL, ADD_TOOL], tool_choice: 'required',
    });
    assert.equal(r.choices.length, 3);
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'tool_calls');
      c.message.tool_calls.forEach(checkCall);
    }
  });

  test('streamed tool-call deltas in OpenAI chunk format', async () => {
    const client = srv.client();
    const body = {
      model: MODEL, messages: [{ role: 'user', content: 'Weather in Oslo?' }], seed: 9, max_tokens: 200,
      tools: [WEATHER_TOOL], tool_choice: { type: 'function', function: { name: 'get_weather' } },
    };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    const calls = [];
    let finish;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      for (const d of c.delta.tool_calls ?? []) {
        if (d.id) {
          assert.equal(d.index, calls.length);
          assert.equal(d.type, 'function');
          assert.equal(typeof d.function.name, 'string');
          calls.push({ id: d.id, type: 'function', function: { name: d.function.name, arguments: d.function.arguments ?? '' } });
        } else {
          calls[d.index].function.arguments += d.function.arguments;
        }
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.deepEqual(checkCall(calls[0]), JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments));
    // the SDK's own stream helper assembles the same call
    const helper = client.chat.completions.stream({ ...body });
    const final = await helper.finalChatCompletion();
    assert.equal(final.choices[0].message.tool_calls[0].function.arguments, calls[0].function.arguments);
  });
});

describe('reasoning (a DeepSeek-R1-style template: the prompt opens <think>)', () => {
  let think;
  before(async () => {
    const tpl = path.join(os.tmpdir(), `petrel-think-${process.pid}.jinja`);
    writeFileSync(tpl, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
      "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}");
    think = await startServer(['--threads', '1', '--chat-template', tpl]);
  });
  after(async () => { await think?.stop(); });

  test('an unclosed <think> is reasoning_content, streamed and not; enable_thinking false is content', async () => {
    const client = think.client();
    const body = { model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }], temperature: 0, max_tokens: 20 };
    const r = await client.chat.completions.create(body);
    const m = r.choices[0].message;
    assert.ok(m.reasoning_content.length > 0);
    assert.equal(m.content, '');
    let reasoning = '', content = '';
    for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
      reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
      content += chunk.choices[0]?.delta?.content ?? '';
    }
    assert.equal(reasoning, m.reasoning_content);
    assert.equal(content, '');
    const off = await client.chat.completions.create({ ...body, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(off.choices[0].message.reasoning_content, undefined);
    assert.ok(off.choices[0].message.content.length > 0);
  });

  test('a grammar closes the open <think>: JSON and forced calls are content', async () => {
    const client = think.client();
    const messages = [{ role: 'user', content: 'Describe a person.' }];
    const r = await client.chat.completions.parse({
      model: MODEL, messages, response_format: zodResponseFormat(Person, 'person'), seed: 2, max_tokens: 200,
    });
    assert.equal(r.choices[0].message.reasoning_content, undefined);
    Person.parse(r.choices[0].message.parsed);
    const t = await client.chat.completions.create({
      model: MODEL, messages, tools: [ADD_TOOL], tool_choice: 'required', seed: 2, max_tokens: 200,
    });
    assert.equal(t.choices[0].finish_reason, 'tool_calls');
    t.choices[0].message.tool_calls.forEach(checkCall);
  });
});
