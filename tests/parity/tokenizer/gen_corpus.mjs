// gen_corpus.mjs - the tokenizer parity corpus: hand-written strings plus
// seeded random mixtures, the same on every run and machine.
//
//   node gen_corpus.mjs OUT.json [N_RANDOM]
//
// Characters are drawn only from blocks assigned by Unicode 13, so that the
// character classes of PCRE2 (Unicode 14), utf8proc (15) and Node's ICU agree
// on every one of them.

import { writeFileSync } from "node:fs";

// mulberry32: tiny, seedable, and identical in every JS engine.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const HAND = [
  "",
  "Hello world",
  "Once upon a time, there was a little girl named Lily.",
  "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
  "I'm sure you'll see they've done it; we'd say it's what I'd've DONE. He'S HERE, YOU'LL SEE.",
  "don't  can't\twon't\nshan't 're 've 'm 'll 'd 's 't",
  "'ſ and 'K are not contractions",
  "  leading spaces", "trailing spaces   ", "   ", " ", "\t", "\n", "\n\n", "\r\n", " \n ",
  "a  b   c    d     e", "tabs\tand\t\tmore\t\t\ttabs", "line1\nline2\n\nline4\n\n\n\nline8",
  "mixed \t \n \r\n whitespace \u00a0nbsp\u3000ideographic\u2028ls\u2029ps\ufeffbom",
  "1234567890", "3.14159265358979", "1,000,000.00", "+1 (555) 123-4567", "2024-01-15T10:30:00Z",
  "0x1F600 0b1010 1e-9 -42 007", "١٢٣ ٤٥٦ ߀߁ ๑๒๓ ⑫ ½ ²³ Ⅻ",
  "int main(void) {\n    printf(\"hello, %s\\n\", argv[1]);\n    return 0;\n}\n",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "const add = (a, b) => a + b; // arrow\nexport default { add };",
  "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
  "#!/bin/sh\nfor f in *.c; do gcc -O2 -c \"$f\" || exit 1; done",
  "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&=e|f^g",
  "你好，世界！今天天气很好。我们去公园散步吧。",
  "日本語のテキスト、ひらがなとカタカナと漢字。東京は大きい都市です。",
  "한국어 텍스트입니다. 안녕하세요! 감사합니다.",
  "中文English混合text测试123数字",
  "😀😃😄 😁😆", "👍🏽👋🏿🤝", "👨‍👩‍👧‍👦 family", "🏳️‍🌈🏴‍☠️", "🇯🇵🇺🇸🇩🇪🇫🇷", "❤️‍🔥 ✨ ☕️ ⭐",
  "👩🏾‍💻 writes code; 🧑‍🚀 flies", "emoji at end 🎉", "🎉 emoji at start",
  "e\u0301 vs \u00e9", "A\u030a vs \u00c5 vs \u212b", "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o\u0358",
  "Tiếng Việt có dấu", "हिन्दी भाषा", "العربية مَرْحَبًا", "עִבְרִית", "ไทย ภาษา", "Ελληνικά Ωμέγα", "Русский язык ЁЖЗ",
  "ﬁ ﬂ ﬀ ① ㈱ ｈａｌｆ ｗｉｄｔｈ", "Ǆ ǅ ǆ İ ı ß ẞ",
  "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<s>[INST] Hello [/INST] Hi</s>", "<s>", "</s>", "<unk>", "<bos>", "<eos>", "<pad>",
  "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
  "<think>\nreasoning\n</think>\nanswer", "<tool_call>{\"name\": \"f\"}</tool_call>",
  "<|endoftext|>", "<|end_of_text|>", "<unused0><unused99>", "<0x41><0xFF>", "▁▁▁", "▁hello▁world",
  "text<|im_start|>text", "<s><s></s>", "<|im_start|><|im_start|>", "<|im_start", "im_start|>",
  "<start_of_image>", "<mask>[multimodal]", "<table><tr><td>cell</td></tr></table>",
  "\u0000nul\u0000", "\u0001\u0002\u001f\u007f controls", "\u200b\u200c\u200d zero width", "\u00ad soft hyphen",
  "a\u0085b next line", "\u180e mongolian vowel separator",
];

// Pools for the random mixtures.
const WORDS = (
  "the of and to in is you that it he was for on are as with his they I at be this have from or " +
  "one had by word but not what all were we when your can said there use an each which she do how " +
  "their if will up other about out many then them these so some her would make like him into time " +
  "has look two more write go see number no way could people my than first water been call who oil " +
  "its now find long down day did get come made may part over new sound take only little work know " +
  "place year live me back give most very after thing our just name good sentence man think say " +
  "great where help through much before line right too mean old any same tell boy follow came want " +
  "show also around form three small set put end does another well large must big even such because " +
  "turn here why ask went men read need land different home us move try kind hand picture again " +
  "change off play spell air away animal house point page letter mother answer found study still learn " +
  "Tokenizer Transformer GPU kernel CUDA matmul attention softmax llama qwen gemma Petrel"
).split(" ");
const CODE = [
  "if (", ") {", "}", "else", "return", "for (int i = 0; i < n; i++)", "while", "==", "!=", "<=",
  ">=", "&&", "||", "->", "::", "=>", "+=", "++", "--", "/*", "*/", "//", "#include <stdio.h>",
  "def ", "self.", "import ", "from ", "lambda x:", "print(", "console.log(", "fn ", "let mut ",
  "impl", "pub struct", "std::vec::Vec", "async", "await", "None", "null", "undefined", "true",
  "false", "[]", "{}", "()", "\"str\"", "'c'", "`tpl ${x}`", "0xFF", "1e10", "_private", "__init__",
  "CamelCase", "snake_case", "SCREAMING_CASE", "kebab-case", "a.b.c", "x[i][j]", "&mut", "*ptr",
  "<T>", "Vec<Option<u8>>", "http://example.com/path?q=1&r=2", "user@example.com", "C:\\path\\file",
];
const EMOJI = [
  "😀", "😂", "🥲", "😍", "🤔", "🙃", "👍", "👍🏻", "👍🏿", "🙏🏽", "💪", "👀", "🔥", "✨", "🎉", "❤️",
  "💔", "🌍", "🚀", "🐍", "🦀", "☕", "⚡", "✅", "❌", "⭐", "🌈", "👨‍💻", "👩‍🔬", "🧑‍🤝‍🧑",
  "👨‍👩‍👦", "👨‍👨‍👧‍👧", "🏳️‍🌈", "🏳️‍⚧️", "🏴‍☠️", "❤️‍🔥", "🐻‍❄️", "🇬🇧", "🇨🇳", "🇧🇷", "#️⃣", "1️⃣",
  "©️", "™", "↔️", "🫠", "🥹", "🧠",
];
const PUNCT = [".", ",", "!", "?", ";", ":", "'", "\"", "(", ")", "-", "—", "–", "…", "«", "»",
  "“", "”", "‘", "’", "、", "。", "！", "？", "·", "§", "¶", "†", "€", "$", "£", "¥", "%", "@", "#", "&", "*"];
const SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", "    ", "\u00a0",
  "\u3000", "\u2003", "\n\n\n\n"];
const SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>",
  "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<think>", "</think>", "<|endoftext|>",
  "<unk>", "<pad>", "<unused5>", "<0x20>", "▁"];
// [first, last] code point ranges of old, fully assigned blocks.
const RANGES = [
  [0x4e00, 0x9fa5], [0x3041, 0x3096], [0x30a1, 0x30fa], [0xac00, 0xd7a3], [0x0400, 0x044f],
  [0x0391, 0x03a9], [0x03b1, 0x03c9], [0x05d0, 0x05ea], [0x0627, 0x064a], [0x0e01, 0x0e2e],
  [0x0905, 0x0939], [0x00c0, 0x00ff], [0x0100, 0x017f], [0x0300, 0x036f], [0x2200, 0x22ff],
  [0x2190, 0x21ff], [0x2500, 0x257f], [0xff01, 0xff5e], [0x1d400, 0x1d433], [0x20000, 0x2a6d6],
];

function pick(r, arr) {
  return arr[Math.floor(r() * arr.length)];
}

function randomChar(r) {
  const [lo, hi] = pick(r, RANGES);
  return String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
}

function digits(r) {
  let s = "";
  const n = 1 + Math.floor(r() * 12);
  for (let i = 0; i < n; i++) s += String.fromCharCode(48 + Math.floor(r() * 10));
  return s;
}

// One random string: a few fragments of a few kinds, sometimes joined by
// spaces, sometimes not.
function mixture(r) {
  const kinds = [
    () => pick(r, WORDS), () => pick(r, WORDS), () => pick(r, WORDS),
    () => pick(r, WORDS).toUpperCase(), () => pick(r, CODE), () => pick(r, EMOJI),
    () => pick(r, PUNCT), () => pick(r, SPACES), () => digits(r), () => randomChar(r),
    () => randomChar(r) + randomChar(r) + randomChar(r), () => pick(r, SPECIALS),
    () => pick(r, WORDS) + "'" + pick(r, ["s", "t", "re", "ve", "m", "ll", "d", "S", "LL"]),
    () => "e" + String.fromCodePoint(0x300 + Math.floor(r() * 0x70)),
  ];
  const n = 1 + Math.floor(r() * (r() < 0.2 ? 60 : 14));
  const join = r() < 0.6 ? " " : "";
  let s = "";
  for (let i = 0; i < n; i++) s += (i ? join : "") + pick(r, kinds)();
  return s;
}

// Long inputs: a whole paragraph of prose and of code.
function longOnes(r) {
  const out = [];
  for (let k = 0; k < 8; k++) {
    let s = "";
    for (let i = 0; i < 400; i++) s += pick(r, WORDS) + (r() < 0.1 ? pick(r, PUNCT) : "") + (r() < 0.05 ? "\n" : " ");
    out.push(s);
  }
  for (let k = 0; k < 4; k++) {
    let s = "";
    for (let i = 0; i < 300; i++) s += pick(r, CODE) + (r() < 0.2 ? "\n    " : " ");
    out.push(s);
  }
  return out;
}

const out = process.argv[2];
const nRandom = Number(process.argv[3] ?? 2000);
if (!out) {
  console.error("usage: node gen_corpus.mjs OUT.json [N_RANDOM]");
  process.exit(2);
}
const r = rng(20240531);
const corpus = [...HAND, ...longOnes(r)];
for (let i = 0; i < nRandom; i++) corpus.push(mixture(r));
writeFileSync(out, JSON.stringify(corpus, null, 0));
console.log(`gen_corpus: ${corpus.length} strings -> ${out}`);
