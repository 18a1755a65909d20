// bench_report_render.mjs PETREL_BIN WORKDIR RUN.json - CTest
// cli/bench_report_chromium: the `petrel bench serve` report opened in
// headless Chromium (Debian's chromium package) checks that its plots
// render, not merely parse.
//
// The report is re-rendered from a committed run (--report-from), so the
// page is this build's HTML over real data.  Then:
//  1. --dump-dom: Chromium's DOM has the seven plots as SVG elements, each
//     with its drawn series (paths or dots);
//  2. --screenshot: the PNG (decoded here with node's zlib) has far more
//     pixels in the series colours than the legend swatches alone could
//     paint, and the page is not blank.
// Exit 77 (skipped) when chromium is not installed.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { inflateSync } from 'node:zlib';
import assert from 'node:assert/strict';

const [bin, work, runJson] = process.argv.slice(2);
const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
if (!chromium) {
  console.log('skipped: chromium is not installed (Debian package chromium)');
  process.exit(77);
}
rmSync(work, { recursive: true, force: true });
mkdirSync(work, { recursive: true });
const html = `${work}/report.html`;
let r = spawnSync(bin, ['bench', 'serve', '--report-from', runJson, '--html', html], { encoding: 'utf8' });
assert.equal(r.status, 0, `re-rendering failed: ${r.stderr}`);

// A fresh profile per run and nothing that reaches out.
const browse = (...extra) =>
  spawnSync(chromium, ['--headless', '--no-sandbox', '--disable-gpu',
    '--disable-background-networking', '--no-first-run', `--user-data-dir=${work}/profile`,
    ...extra, `file://${html}`], { encoding: 'buffer', timeout: 120e3, maxBuffer: 64 << 20 });

// ---- 1. the DOM Chromium built ---------------------------------------------------
r = browse('--dump-dom');
assert.equal(r.status, 0, `chromium --dump-dom failed: ${r.stderr}`);
const dom = r.stdout.toString('utf8');
const figures = [...dom.matchAll(/<figure id="([a-z-]+)"><svg[^>]*class="plot"[\s\S]*?<\/svg>/g)];
assert.deepEqual(figures.map((m) => m[1]).sort(),
  ['decode-depth', 'itl', 'kv', 'rss', 'sweep-ttft', 'throughput', 'ttft'], 'the seven plots');
for (const [svg, id] of figures) {
  const drawn = (svg.match(/<path class="series"|<circle class="dot"/g) || []).length;
  assert.ok(drawn > 0, `plot ${id} has drawn series in the DOM`);
  assert.ok(!svg.includes('no data'), `plot ${id} has data`);
}

// ---- 2. the pixels ------------------------------------------------------------------
const shot = `${work}/report.png`;
r = browse('--hide-scrollbars', '--window-size=1440,2800', `--screenshot=${shot}`);
assert.ok(existsSync(shot), `chromium made no screenshot: ${r.stderr}`);
const img = decodePng(readFileSync(shot));
assert.ok(img.width >= 1000 && img.height >= 2000, `screenshot ${img.width}x${img.height}`);
const count = (rgb, tol = 24) => {
  let n = 0;
  for (let i = 0; i < img.data.length; i += img.channels)
    if (Math.abs(img.data[i] - rgb[0]) <= tol && Math.abs(img.data[i + 1] - rgb[1]) <= tol &&
        Math.abs(img.data[i + 2] - rgb[2]) <= tol) n++;
  return n;
};
// The legend swatches are 10x10: at most 6 blue, 5 red and 1 green ones.
const blue = count([0x1f, 0x77, 0xb4]), red = count([0xd6, 0x27, 0x28]);
const green = count([0x2c, 0xa0, 0x2c]), white = count([255, 255, 255], 4);
const total = img.width * img.height;
console.log(`pixels: blue ${blue}, red ${red}, green ${green}, white ${white} of ${total}`);
assert.ok(blue > 6 * 100 + 1500, 'blue series (TTFT, ITL, throughput, RSS) were drawn');
assert.ok(red > 5 * 100 + 800, 'red series (cached TTFT, medians) were drawn');
assert.ok(green > 100 + 300, 'the green KV series was drawn');
assert.ok(white < total * 0.98, 'the page is not blank');
console.log(`ok: ${figures.length} plots in the DOM and on screen`);

// A PNG decoder for what Chromium writes: 8-bit RGB or RGBA, not interlaced.
function decodePng(buf) {
  assert.equal(buf.toString('latin1', 1, 4), 'PNG', 'a PNG file');
  let off = 8, width, height, depth, type, interlace;
  const idat = [];
  while (off < buf.length) {
    const len = buf.readUInt32BE(off), kind = buf.toString('latin1', off + 4, off + 8);
    const body = buf.subarray(off + 8, off + 8 + len);
    if (kind === 'IHDR') {
      width = body.readUInt32BE(0), height = body.readUInt32BE(4);
      depth = body[8], type = body[9], interlace = body[12];
    } else if (kind === 'IDAT') idat.push(body);
    off += 12 + len;
  }
  assert.ok(depth === 8 && (type === 2 || type === 6) && !interlace, `PNG type ${type}/${depth}`);
  const channels = type === 6 ? 4 : 3, stride = width * channels;
  const raw = inflateSync(Buffer.concat(idat)), data = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)], src = y * (stride + 1) + 1, dst = y * stride;
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? data[dst + x - channels] : 0;
      const b = y ? data[dst - stride + x] : 0;
      const c = y && x >= channels ? data[dst - stride + x - channels] : 0;
      let v = raw[src + x];
      if (f === 1) v += a;
      else if (f === 2) v += b;
      else if (f === 3) v += (a + b) >> 1;
      else if (f === 4) {
        const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
        v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      data[dst + x] = v & 255;
    }
  }
  return { width, height, channels, data };
}
