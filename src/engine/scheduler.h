/*
 * scheduler.h - continuous batching: many sequences share one engine.
 *
 * The engine (model, KV cache, backend) is not thread-safe, so one thread
 * owns it: the scheduler thread.  Other threads hand it jobs (a prompt and
 * generation parameters) through a FIFO queue and get their tokens back
 * through callbacks that run on the scheduler thread.
 *
 * Each step the scheduler
 *   1. drops cancelled jobs (their KV pages go back to the pool),
 *   2. admits waiting jobs in arrival order while fewer than max_seqs run and
 *      the KV pool can hold each job's worst case (prompt + max_tokens), so
 *      a running sequence never runs out of pages,
 *   3. builds ONE batch: a decode row for every running sequence plus
 *      prefill chunks of newly admitted prompts, up to max_batch rows,
 *   4. runs one forward and samples every sequence that produced logits with
 *      its own sampler.
 *
 * The scheduler knows nothing of HTTP or text: it deals in token ids.  The
 * caller detokenizes and matches stop strings in on_token, which may ask to
 * stop.
 *
 * Invariants:
 *   - on_done is called exactly once for every job pt_sched_submit accepted,
 *     and after it neither callback is called again for that job;
 *   - the sum over running jobs of their reserved pages never exceeds the
 *     pool, so pt_kv_seq_reserve cannot fail mid-generation;
 *   - jobs leave the queue in the order they entered it (a big job at the
 *     head waits for room rather than being overtaken).
 */
#ifndef PETREL_SCHEDULER_H
#define PETREL_SCHEDULER_H

#include "engine/engine.h"

typedef struct pt_sched pt_sched;

typedef struct pt_sched_opts {
    int max_seqs;    /* sequences decoded together (default 8) */
    int n_ctx;       /* positions per sequence: prompt + output (default e->n_ctx) */
    int max_prefill; /* prompt rows per step, to bound decode latency (default max_batch) */
    int max_queue;   /* waiting jobs before submit refuses (default 4096) */
} pt_sched_opts;

/* What a finished job reports. */
typedef struct pt_sched_stats {
    int n_prompt, n_generated;
    int n_cached;     /* prompt tokens whose KV was reused (no prefix cache yet: 0) */
    int finish;       /* enum pt_finish; PT_FINISH_NONE if failed (see error) */
    double t_queue;   /* submit -> admitted, seconds */
    double ttft;      /* submit -> first token sampled */
    double t_prefill; /* admitted -> first token sampled */
    double t_decode;  /* first token -> last token */
    char error[256];  /* why it failed; empty on success */
} pt_sched_stats;

/* A sampled token.  Return nonzero to stop the job (finish = stop). */
typedef int (*pt_sched_token_fn)(void *user, const pt_sample_result *r);
typedef void (*pt_sched_done_fn)(void *user, const pt_sched_stats *st);

typedef struct pt_sched_job {
    const int32_t *prompt; /* copied by pt_sched_submit */
    int n_prompt;
    pt_gen_params params;    /* max_tokens <= 0: until the context is full */
    const int32_t *bias_ids; /* logit bias (pt_sampler_set_bias), copied */
    const float *bias_vals;
    int n_bias;
    pt_sched_token_fn on_token;
    pt_sched_done_fn on_done;
    void *user;
} pt_sched_job;

/* Starts the scheduler thread on e, which it then owns until pt_sched_stop. */
int pt_sched_start(pt_sched **out, pt_engine *e, const pt_sched_opts *o, pt_err *err);

/* Queues a job; thread-safe.  Returns its id (> 0), or 0 with err set if the
 * job can never run (empty prompt, prompt too long) or the queue is full or
 * shut down; then no callback is ever called. */
uint64_t pt_sched_submit(pt_sched *s, const pt_sched_job *job, pt_err *err);

/* Cancels a job, waiting or running; thread-safe.  Its on_done follows (with
 * finish = cancel) at the next step unless it already finished.  Unknown or
 * finished ids are ignored, so a late cancel is harmless. */
void pt_sched_cancel(pt_sched *s, uint64_t id);

/* Cancels every job.  Thread-safe. */
void pt_sched_cancel_all(pt_sched *s);

/* Counts, thread-safe: jobs waiting, running, and KV pages reserved. */
void pt_sched_load(pt_sched *s, int *n_waiting, int *n_running, int *pages_reserved);

/* Cancels whatever is left, joins the thread and frees the scheduler (all
 * on_done callbacks have run when it returns).  NULL is a no-op. */
void pt_sched_stop(pt_sched *s);

/* Pages a job of n_positions positions may need. */
int pt_sched_pages_for(const pt_engine *e, int n_positions);

#endif
