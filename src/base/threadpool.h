/*
 * threadpool.h - a fixed set of worker threads that run one function on all
 * threads at once and return when every thread is done (a fork-join barrier).
 *
 * This is the CPU backend's engine: a decode step of a small model runs a few
 * hundred short ops, each split across every thread, so a dispatch must cost
 * microseconds, not a syscall.  Workers therefore spin briefly (20 us) on a
 * generation counter after each job and only then sleep on a futex; the
 * caller does the same while it waits for stragglers.  When there are more
 * runnable threads than cores, a worker may not run for milliseconds: the
 * caller, once done with its own slice, runs every slice no worker has
 * started, so a descheduled thread does not stall the job.  Nothing is
 * allocated per dispatch.
 *
 * Rules:
 *   - the caller of pt_pool_run is thread 0 and does its share of the work;
 *   - pt_pool_run is not reentrant: fn must not call pt_pool_run, and only
 *     one thread may dispatch on a pool at a time;
 *   - fn(ctx, ith, nth) is called exactly once for every ith in [0, nth),
 *     but not necessarily on a thread of its own: the caller may run a late
 *     worker's slice after its own (slices must not wait for each other).
 */
#ifndef PETREL_THREADPOOL_H
#define PETREL_THREADPOOL_H

typedef struct pt_pool pt_pool;

/* Work function: this thread's index ith of nth. */
typedef void (*pt_pool_fn)(void *ctx, int ith, int nth);

/* Starts n_threads - 1 workers (the caller is the n-th).  n_threads <= 0
 * means one per online core.  Returns NULL if a thread cannot be created. */
pt_pool *pt_pool_new(int n_threads);
/* Stops and joins the workers.  NULL is a no-op. */
void pt_pool_free(pt_pool *pool);
/* How long (seconds) an idle thread spins before it sleeps; 0 sleeps at
 * once (tests use it to exercise the sleeping and late-worker paths). */
void pt_pool_set_spin(pt_pool *pool, double seconds);
/* Total threads, the caller included. */
int pt_pool_size(const pt_pool *pool);
/* Runs fn(ctx, ith, nth) on every thread and returns when all have finished.
 * Everything fn's callers wrote before the call is visible to every thread,
 * and everything every thread wrote is visible to the caller afterwards. */
void pt_pool_run(pt_pool *pool, pt_pool_fn fn, void *ctx);

#endif
