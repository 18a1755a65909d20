/*
 * core.h - the engine loop: requests, their states, and one step at a time.
 *
 * The core owns a set of requests and, each step, asks the policy
 * (sched_policy.h) what to run, applies its preemptions and admissions,
 * runs the rows through the runner (runner.h), samples every request whose
 * rows reached new logits, and applies the finish rules.  It is
 * single-threaded: pt_generate and `petrel bench` drive it directly, the
 * server's scheduler thread (scheduler.h) drives it from a queue.  One
 * loop, one set of stop rules.
 *
 * A request's states, and the function behind each transition:
 *
 *     WAITING ----admitted by the plan (core_step)----> RUNNING
 *     RUNNING ----pool short, lowest priority (preempt)--> PREEMPTED
 *     PREEMPTED --admitted again, recomputes its tokens--> RUNNING
 *     any -------stop, length, cancel or error (finish)-> FINISHED
 *
 * WAITING and PREEMPTED requests hold no KV pages; a PREEMPTED one keeps its
 * tokens and sampler (so it resumes with identical output) and waits at
 * the front of the queue.  FINISHED requests have had on_done called and
 * are freed at the end of the step.
 *
 * Invariants:
 *   - on_done is called exactly once for every request added, and after it
 *     neither callback is called again;
 *   - pages are taken only for rows being computed (lazy growth); the plan
 *     never asks for more than the pool's free pages, preempting instead;
 *   - a request never needs more pages than the whole pool (checked when
 *     it is added), so the oldest request always makes progress.
 */
#ifndef PETREL_CORE_H
#define PETREL_CORE_H

#include "engine/engine.h"

enum pt_req_state { PT_REQ_WAITING, PT_REQ_RUNNING, PT_REQ_PREEMPTED, PT_REQ_FINISHED };

/* What a finished job reports. */
typedef struct pt_sched_stats {
    int n_prompt, n_generated;
    int n_cached;     /* prompt tokens whose KV was reused (no prefix cache yet: 0) */
    int n_preempted;  /* times the request was preempted and recomputed */
    int n_drafted, n_accepted; /* speculative tokens proposed / accepted */
    int n_forced;     /* tokens the grammar forced (jump-forward), emitted */
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
    const int32_t *prompt; /* copied when added */
    int n_prompt;
    pt_gen_params params;    /* max_tokens <= 0: until the context is full */
    const int32_t *bias_ids; /* logit bias (pt_sampler_set_bias), copied */
    const float *bias_vals;
    int n_bias;
    pt_sched_token_fn on_token;
    pt_sched_done_fn on_done;
    void *user;
    /* Extra logits processors (grammar masks...): called on the engine's
     * thread when the request first starts, after the prompt is in the
     * sampler's history, to append processors with pt_sampler_add_proc
     * (applied after the bias and penalties; they see generated tokens
     * only).  proc_arg must live until on_done.  NULL: none. */
    void (*add_procs)(void *proc_arg, pt_sampler *s);
    void *proc_arg;
} pt_sched_job;

typedef struct pt_core_opts {
    int max_seqs;    /* requests running together (default 8) */
    int n_ctx;       /* positions per request: prompt + output (default e->n_ctx) */
    int max_prefill; /* catching-up rows per step (default: the model's max_batch) */
} pt_core_opts;

typedef struct pt_core pt_core;

pt_core *pt_core_new(pt_engine *e, const pt_core_opts *o);
/* Cancels what is left (each on_done runs) and frees the core. */
void pt_core_free(pt_core *c);
/* 0 if the job can run here; else -1 with the reason (empty prompt, too
 * long for the context or the whole KV pool, token id out of range). */
int pt_core_check(const pt_core *c, const pt_sched_job *job, pt_err *err);
/* Adds a checked job under id (ids increase with submission order). */
void pt_core_add(pt_core *c, const pt_sched_job *job, uint64_t id);
/* Finishes the request with finish = cancel; false if id is not live. */
bool pt_core_cancel(pt_core *c, uint64_t id);
/* Finishes every live request with finish = cancel. */
void pt_core_cancel_all(pt_core *c);
/* Runs one step.  Returns the number of live requests after it. */
int pt_core_step(pt_core *c);
/* Live requests (finished ones excluded, also during a step). */
void pt_core_counts(const pt_core *c, int *n_waiting, int *n_running);
/* Where a step's time goes, summed over the steps so far: planning and
 * bookkeeping on the host (the policy, preemption, admission, finishing),
 * the forward (runner), and sampling with the finish rules. */
typedef struct pt_core_timing {
    long n_steps;
    double t_host, t_forward, t_sample;
} pt_core_timing;
pt_core_timing pt_core_get_timing(const pt_core *c);

/* The options in effect (defaults filled in). */
const pt_core_opts *pt_core_options(const pt_core *c);

#endif
