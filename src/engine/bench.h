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

#endif
