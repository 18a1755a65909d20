/*
 * scheduler.h - continuous batching for many threads: a queue in front of
 * the engine core, and the thread that drives it.
 *
 * The engine (model, KV cache, backend) is not thread-safe, so one thread
 * owns it: the scheduler thread.  Other threads hand it jobs through a
 * FIFO queue and get their tokens back through callbacks that run on the
 * scheduler thread.  Each iteration the thread moves new jobs and cancels
 * into the core (core.h), then runs one step of it: the policy
 * (sched_policy.h) mixes prompt chunks and decode rows under the token
 * budget, grows KV lazily and preempts by recompute when the pool runs out.
 *
 * The scheduler knows nothing of HTTP or text: it deals in token ids.  The
 * caller detokenizes and matches stop strings in on_token, which may ask to
 * stop.
 *
 * Invariants:
 *   - on_done is called exactly once for every job pt_sched_submit accepted,
 *     and after it neither callback is called again for that job;
 *   - jobs are admitted in the order they were submitted (a job at the head
 *     that does not fit waits rather than being overtaken).
 */
#ifndef PETREL_SCHEDULER_H
#define PETREL_SCHEDULER_H

#include "engine/core.h"

typedef struct pt_sched pt_sched;

typedef struct pt_sched_opts {
    int max_seqs;    /* sequences decoded together (default 8) */
    int n_ctx;       /* positions per sequence: prompt + output (default e->n_ctx) */
    int max_prefill; /* prompt rows per step, to bound decode latency (default max_batch) */
    int max_queue;   /* waiting jobs before submit refuses (default 4096) */
    int hold;        /* tests: no step until this many jobs are queued (once;
                      * a cancel or stop lifts it).  Arrival timing then plays
                      * no part in what the first step admits.  0: off */
} pt_sched_opts;

/* Starts the scheduler thread on e, which it then owns until pt_sched_stop. */
int pt_sched_start(pt_sched **out, pt_engine *e, const pt_sched_opts *o, pt_err *err);

/* Queues a job; thread-safe.  Returns its id (> 0), or 0 with err set if the
 * job can never run (empty prompt, prompt too long for the context or the
 * KV pool) or the queue is full or shut down; then no callback is called. */
uint64_t pt_sched_submit(pt_sched *s, const pt_sched_job *job, pt_err *err);

/* 0 if the job could ever run here (what submit checks first); -1 with
 * the reason otherwise.  Thread-safe. */
int pt_sched_check(pt_sched *s, const pt_sched_job *job, pt_err *err);

/* Cancels a job, waiting or running; thread-safe.  Its on_done follows (with
 * finish = cancel) at the next step unless it already finished.  Unknown or
 * finished ids are ignored, so a late cancel is harmless. */
void pt_sched_cancel(pt_sched *s, uint64_t id);

/* Cancels every job.  Thread-safe. */
void pt_sched_cancel_all(pt_sched *s);

/* Counts as of the last step, thread-safe: jobs waiting (queued or
 * preempted), running, and KV pages held. */
void pt_sched_load(pt_sched *s, int *n_waiting, int *n_running, int *pages_held);
/* KV pages free but still holding cached content, as of the last step. */
int pt_sched_cached_pages(pt_sched *s);

/* Cancels whatever is left, joins the thread and frees the scheduler (all
 * on_done callbacks have run when it returns).  NULL is a no-op. */
void pt_sched_stop(pt_sched *s);

/* Pages a job of n_positions positions may need. */
int pt_sched_pages_for(const pt_engine *e, int n_positions);

#endif
