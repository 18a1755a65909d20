/*
 * bench.h - timed runs through the engine core, for `petrel bench`: the
 * same loop that serves requests, fed random token ids.
 */
#ifndef PETREL_BENCH_H
#define PETREL_BENCH_H

#include "engine/core.h"

typedef struct pt_bench_run {
    double t_prefill;   /* admission -> first token, seconds (the slowest request) */
    double t_decode;    /* all first tokens -> last token, seconds */
    int n_seqs, n_prompt, n_gen;
    double decode_tok_s;  /* tokens after the last first token / t_decode: aggregate */
    double prefill_tok_s; /* n_seqs * n_prompt / t_prefill */
    pt_core_timing timing; /* where the steps' time went */
} pt_bench_run;

/* n_seqs requests of n_prompt random tokens each (seeded), each generating
 * n_gen tokens greedily past end-of-text, all submitted at once to a core
 * allowing max_seqs running (0: all n_seqs).  The KV pool must hold them (see bench's
 * sizing) or they are preempted, which the timing then includes. */
int pt_bench_requests(pt_engine *e, int n_seqs, int n_prompt, int n_gen, uint64_t seed,
                      pt_bench_run *out, int max_seqs, pt_err *err);

/* One request of prompt[0..n) generating n_gen tokens: time to its first
 * token, seconds per later token, and the prompt positions the prefix
 * cache served. */
int pt_bench_prompt(pt_engine *e, const int32_t *prompt, int n, int n_gen, double *ttft,
                    double *per_token, int *n_cached, pt_err *err);

/* Speculative decoding against plain decoding on the same random prompt of
 * n_prompt tokens, n_gen tokens each, greedy: decode tok/s of both, the
 * acceptance, and the mean tokens per verify step.  The two outputs must be
 * identical (else an error: the executor would be wrong).  An oracle
 * drafter gets the plain run's tokens as its truth. */
typedef struct pt_bench_spec_run {
    double tok_s_plain, tok_s_spec;
    double cpu_tok_s_plain, cpu_tok_s_spec; /* per second of process CPU time */
    int n_drafted, n_accepted;
    int n_generated; /* by each run: n_gen, or less where the context ends */
    long steps_spec;
} pt_bench_spec_run;
int pt_bench_spec(pt_engine *e, int n_prompt, int n_gen, const pt_spec_params *spec,
                  pt_bench_spec_run *out, pt_err *err);

#endif
