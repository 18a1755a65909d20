// load.mjs - the loopback load benchmark on its own (docs/benchmarks.md):
// starts `petrel serve` with --parallel CLIENTS, records single-request
// answers, then runs ROUNDS rounds of CLIENTS concurrent streaming chat
// requests, checks every answer, and prints TTFT percentiles as JSON.
//
//   node load.mjs [CLIENTS=64] [ROUNDS=4] [MAX_TOKENS=32] [extra serve flags...]
import { loadRound, referenceAnswers, rssKiB, startServer } from './lib.mjs';

const [clients = '64', rounds = '4', maxTokens = '32', ...extra] = process.argv.slice(2);
const n = Number(clients);
const flags = ['--threads', '1', '--ctx', '256', '--parallel', String(n), '--quiet', ...extra];
const srv = await startServer(flags);
let failed = false;
try {
  const want = await referenceAnswers(srv, Number(maxTokens));
  const all = [];
  for (let r = 0; r < Number(rounds); r++) {
    const res = await loadRound(srv, n, Number(maxTokens), want);
    if (res.wrong.length) failed = true;
    all.push({ round: r + 1, ...res, wrong: res.wrong.length, rss_kib: rssKiB(srv.proc.pid) });
  }
  console.log(JSON.stringify({ flags, max_tokens: Number(maxTokens), rounds: all }, null, 2));
} finally {
  const { code } = await srv.stop('SIGTERM');
  if (code !== 0) { console.error(srv.log()); failed = true; }
}
process.exit(failed ? 1 : 0);
