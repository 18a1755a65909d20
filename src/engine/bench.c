/*
 * bench.c - timed runs through the engine core (see bench.h).
 *
 * Prefill time runs from submission until every request has its first
 * token; decode throughput counts the tokens sampled after that moment
 * over the time to the last one.  Requests that finish their prompt early
 * decode while others still prefill, as in a real server; those tokens
 * count toward neither figure.
 */
#include "engine/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct bench_state {
    int n_seqs, n_first;
    long n_after; /* tokens sampled once every request had its first */
    double t_all_first, t_end;
    char error[256];
} bench_state;

typedef struct bench_req {
    bench_state *b;
    int n;
} bench_req;

static int bench_token(void *user, const pt_sample_result *r) {
    (void)r;
    bench_req *q = user;
    bench_state *b = q->b;
    double now = pt_now();
    if (q->n++ == 0 && ++b->n_first == b->n_seqs) b->t_all_first = now;
    else if (b->n_first == b->n_seqs) b->n_after++;
    b->t_end = now;
    return 0;
}

static void bench_done(void *user, const pt_sched_stats *st) {
    bench_req *q = user;
    if (st->finish == PT_FINISH_NONE && !q->b->error[0])
        snprintf(q->b->error, sizeof q->b->error, "%s", st->error);
}

int pt_bench_requests(pt_engine *e, int n_seqs, int n_prompt, int n_gen, uint64_t seed,
                      pt_bench_run *out, int max_seqs, pt_err *err) {
    memset(out, 0, sizeof *out);
    out->n_seqs = n_seqs, out->n_prompt = n_prompt, out->n_gen = n_gen;
    pt_core_opts co = {.max_seqs = max_seqs > 0 ? max_seqs : n_seqs, .n_ctx = PT_MIN(e->n_ctx, n_prompt + n_gen + 1)};
    pt_core *c = pt_core_new(e, &co);
    bench_state b = {.n_seqs = n_seqs};
    bench_req *reqs = pt_xcalloc((size_t)n_seqs, sizeof *reqs);
    int32_t *prompt = pt_xmalloc(sizeof(int32_t) * (size_t)n_prompt);
    int vocab = e->model->cfg.vocab_size, rc = 0;
    pt_rng rng;
    pt_rng_seed(&rng, seed);
    for (int s = 0; s < n_seqs && rc == 0; s++) {
        for (int i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)(pt_rng_next(&rng) % (uint64_t)vocab);
        reqs[s].b = &b;
        pt_sched_job job = {.prompt = prompt, .n_prompt = n_prompt, .on_token = bench_token,
                            .on_done = bench_done, .user = &reqs[s]};
        job.params.sampling = pt_sampling_default();
        job.params.sampling.temperature = 0;
        job.params.sampling.n_logprobs = -1;
        job.params.max_tokens = n_gen;
        job.params.ignore_eos = true;
        rc = pt_core_check(c, &job, err);
        if (rc == 0) pt_core_add(c, &job, (uint64_t)s + 1);
    }
    double t0 = pt_now();
    while (rc == 0 && pt_core_step(c) > 0) {}
    out->timing = pt_core_get_timing(c);
    pt_core_free(c);
    free(prompt);
    free(reqs);
    if (rc) return -1;
    if (b.error[0]) return pt_fail(err, "%s", b.error);
    out->t_prefill = b.t_all_first - t0;
    out->t_decode = b.t_end - b.t_all_first;
    out->prefill_tok_s = out->t_prefill > 0 ? (double)n_seqs * n_prompt / out->t_prefill : 0;
    out->decode_tok_s = out->t_decode > 0 ? (double)b.n_after / out->t_decode : 0;
    return 0;
}

typedef struct one_run {
    pt_sched_stats st;
    bool done;
} one_run;

static int one_token(void *user, const pt_sample_result *r) {
    (void)user, (void)r;
    return 0;
}

static void one_done(void *user, const pt_sched_stats *st) {
    one_run *o = user;
    o->st = *st;
    o->done = true;
}

int pt_bench_prompt(pt_engine *e, const int32_t *prompt, int n, int n_gen, double *ttft,
                    double *per_token, int *n_cached, pt_err *err) {
    pt_core_opts co = {.max_seqs = 1};
    pt_core *c = pt_core_new(e, &co);
    one_run o = {0};
    pt_sched_job job = {.prompt = prompt, .n_prompt = n, .on_token = one_token,
                        .on_done = one_done, .user = &o};
    job.params.sampling = pt_sampling_default();
    job.params.sampling.temperature = 0;
    job.params.sampling.n_logprobs = -1;
    job.params.max_tokens = n_gen;
    job.params.ignore_eos = true;
    if (pt_core_check(c, &job, err)) {
        pt_core_free(c);
        return -1;
    }
    pt_core_add(c, &job, 1);
    while (pt_core_step(c) > 0) {}
    pt_core_free(c);
    if (o.st.finish == PT_FINISH_NONE) return pt_fail(err, "%s", o.st.error);
    *ttft = o.st.ttft;
    *per_token = o.st.n_generated > 1 ? o.st.t_decode / (o.st.n_generated - 1) : 0;
    *n_cached = o.st.n_cached;
    return 0;
}

typedef struct spec_run {
    int32_t *toks;
    int n, cap;
    double cpu_first, cpu_last; /* process CPU time at the first and last token */
    pt_sched_stats st;
} spec_run;

/* CPU time of the whole process: on a loaded machine it counts the work
 * done, where the wall clock counts the time slices other processes took. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int spec_token(void *user, const pt_sample_result *r) {
    spec_run *o = user;
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 256;
        o->toks = pt_xrealloc(o->toks, sizeof(int32_t) * (size_t)o->cap);
    }
    o->toks[o->n++] = r->id;
    o->cpu_last = cpu_seconds();
    if (o->n == 1) o->cpu_first = o->cpu_last;
    return 0;
}

static void spec_done(void *user, const pt_sched_stats *st) {
    ((spec_run *)user)->st = *st;
}

static int spec_once(pt_engine *e, const int32_t *prompt, int n_prompt, int n_gen,
                     const pt_spec_params *spec, spec_run *o, long *steps, pt_err *err) {
    pt_core_opts co = {.max_seqs = 1};
    pt_core *c = pt_core_new(e, &co);
    pt_sched_job job = {.prompt = prompt, .n_prompt = n_prompt, .on_token = spec_token,
                        .on_done = spec_done, .user = o};
    job.params.sampling = pt_sampling_default();
    job.params.sampling.temperature = 0;
    job.params.sampling.n_logprobs = -1;
    job.params.max_tokens = n_gen;
    job.params.ignore_eos = true;
    job.params.spec = *spec;
    if (pt_core_check(c, &job, err)) {
        pt_core_free(c);
        return -1;
    }
    pt_core_add(c, &job, 1);
    while (pt_core_step(c) > 0) {}
    *steps = pt_core_get_timing(c).n_steps;
    pt_core_free(c);
    if (o->st.finish == PT_FINISH_NONE) return pt_fail(err, "%s", o->st.error);
    return 0;
}

int pt_bench_spec(pt_engine *e, int n_prompt, int n_gen, const pt_spec_params *spec,
                  pt_bench_spec_run *out, pt_err *err) {
    memset(out, 0, sizeof *out);
    int32_t *prompt = pt_xmalloc(sizeof(int32_t) * (size_t)n_prompt);
    pt_rng rng;
    pt_rng_seed(&rng, 7);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(pt_rng_next(&rng) % (uint64_t)e->model->cfg.vocab_size);
    spec_run plain = {0}, fast = {0};
    pt_spec_params off = {0}, on = *spec;
    long steps;
    int rc = spec_once(e, prompt, n_prompt, n_gen, &off, &plain, &steps, err);
    if (rc == 0) {
        on.oracle = plain.toks;
        on.n_oracle = plain.n;
        rc = spec_once(e, prompt, n_prompt, n_gen, &on, &fast, &out->steps_spec, err);
    }
    if (rc == 0 && (plain.n != fast.n ||
                    memcmp(plain.toks, fast.toks, sizeof(int32_t) * (size_t)plain.n) != 0))
        rc = pt_fail(err, "speculative output differs from plain greedy output");
    if (rc == 0) {
        double dp = plain.st.t_decode, df = fast.st.t_decode;
        out->tok_s_plain = dp > 0 ? (plain.n - 1) / dp : 0;
        out->tok_s_spec = df > 0 ? (fast.n - 1) / df : 0;
        double cp = plain.cpu_last - plain.cpu_first, cf = fast.cpu_last - fast.cpu_first;
        out->cpu_tok_s_plain = cp > 0 ? (plain.n - 1) / cp : 0;
        out->cpu_tok_s_spec = cf > 0 ? (fast.n - 1) / cf : 0;
        out->n_drafted = fast.st.n_drafted;
        out->n_accepted = fast.st.n_accepted;
        out->n_generated = fast.n;
    }
    free(plain.toks), free(fast.toks), free(prompt);
    return rc;
}
