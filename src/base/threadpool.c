/*
 * threadpool.c - fork-join worker pool: spin briefly, then futex sleep; a
 * late worker's slice is run by the caller.
 *
 * Protocol.  The pool has two words that threads wait on, each on its own
 * cache line:
 *   gen      bumped by the caller to publish a job (fn, ctx);
 *   pending  slices of the current job not yet finished; whoever finishes
 *            the last one brings it to zero.
 * and one claim word per slice (claimed[ith]: the generation that claimed
 * it).  Every slice of every job is claimed exactly once, by a compare-
 * and-swap from the previous generation to the current one: by its worker
 * when it wakes, or by the caller, which after its own slice 0 claims and
 * runs every slice still unclaimed.  A worker that lost its claim skips the
 * job.  So a worker that is descheduled (more runnable threads than cores:
 * another process, other agents, -t above the core count) costs the job at
 * most one slice of the caller's time, instead of stalling every op of a
 * forward pass until the scheduler runs it again.  A worker is late only
 * if it had not started by the time the caller finished a whole slice, so
 * on an idle machine the caller practically never steals.
 *
 * A waiter spins on its word for spin seconds (SPIN_SECONDS), then announces itself
 * (sleepers / caller_asleep) and sleeps in FUTEX_WAIT, which re-checks the
 * word atomically in the kernel.  The side that changes the word reads the
 * announcement afterwards and only then pays for FUTEX_WAKE.  Both sides use
 * sequentially consistent operations, so either the waker sees the
 * announcement or the sleeper sees the new value: no lost wake-ups, and no
 * syscall at all while everyone is spinning (the common case in a decode
 * step, where ops follow each other within microseconds).  The spin is
 * short and never yields: a thread that stays runnable while waiting only
 * takes its core from the thread it waits for, and a sleeping thread is the
 * one the scheduler runs first when its job arrives.
 */
#include "base/threadpool.h"

#include "base/base.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle thread spins before it sleeps in the kernel (the
 * default; pt_pool_set_spin): long enough to bridge the host-side gap
 * between two ops of a forward pass (a few microseconds), short enough that
 * a waiting thread soon gives its core back on a machine with more runnable
 * threads than cores. */
#define SPIN_SECONDS 20e-6

#define CACHE_LINE 64

/* One slice's claim word, alone on its cache line. */
typedef struct pt_slot {
    _Atomic uint32_t claimed; /* the generation that claimed this slice */
    char pad[CACHE_LINE - sizeof(uint32_t)];
} pt_slot;

struct pt_pool {
    _Alignas(CACHE_LINE) _Atomic uint32_t gen;
    _Atomic uint32_t sleepers; /* workers inside (or about to enter) FUTEX_WAIT on gen */
    pt_pool_fn fn;             /* the job; written before gen is bumped */
    void *ctx;
    /* Atomic, as a worker that lost its slice to the caller may still be
     * reading it while pt_pool_free sets it. */
    _Atomic int stop;

    _Alignas(CACHE_LINE) _Atomic uint32_t pending;
    _Atomic uint32_t caller_asleep;

    _Alignas(CACHE_LINE) int n_threads;
    _Atomic double spin; /* seconds a waiter spins before it sleeps */
    pthread_t *threads;
    struct pt_worker *workers;
    pt_slot *slots; /* [n_threads]; slot 0 (the caller's) is unused */
};

typedef struct pt_worker {
    pt_pool *pool;
    int ith;
} pt_worker;

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until *word != value or the spin budget runs out; returns the last
 * value read.  The clock is read only every 64 pauses to keep it cheap. */
static uint32_t spin_while_equal(_Atomic uint32_t *word, uint32_t value, double budget) {
    double start = 0;
    for (unsigned i = 1;; i++) {
        uint32_t now = atomic_load_explicit(word, memory_order_acquire);
        if (now != value || budget <= 0) return now;
        cpu_relax();
        if ((i & 63) == 0) {
            double t = pt_now();
            if (start == 0) start = t;
            else if (t - start > budget) return now;
        }
    }
}

/* Waits until the generation moves past seen; returns the new generation. */
static uint32_t worker_wait_job(pt_pool *pool, uint32_t seen) {
    uint32_t g = spin_while_equal(&pool->gen, seen, atomic_load_explicit(&pool->spin, memory_order_relaxed));
    while (g == seen) {
        atomic_fetch_add(&pool->sleepers, 1);
        futex_wait(&pool->gen, seen);
        atomic_fetch_sub(&pool->sleepers, 1);
        g = atomic_load(&pool->gen);
    }
    return g;
}

/* Takes slice ith of job g; false if someone already did.  Before job g
 * every slice's word holds g - 1 (each job claims each slice once), so a
 * worker that slept through several jobs and wakes holding an old g fails
 * here instead of running a slice twice. */
static bool claim(pt_pool *pool, int ith, uint32_t g) {
    uint32_t expect = g - 1;
    return atomic_compare_exchange_strong(&pool->slots[ith].claimed, &expect, g);
}

static void slice_done(pt_pool *pool) {
    if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_asleep))
        futex_wake_all(&pool->pending);
}

static void *worker_main(void *arg) {
    pt_worker *w = arg;
    pt_pool *pool = w->pool;
    /* gen is 0 when the pool is created; reading it here instead would race
     * with a first job published before this thread got scheduled. */
    uint32_t seen = 0;
    for (;;) {
        seen = worker_wait_job(pool, seen);
        if (atomic_load(&pool->stop)) break;
        if (!claim(pool, w->ith, seen)) continue; /* the caller ran it: we were late */
        pool->fn(pool->ctx, w->ith, pool->n_threads);
        slice_done(pool);
    }
    return NULL;
}

/* Publishes the current (fn, ctx, stop) to the workers; returns its
 * generation. */
static uint32_t publish(pt_pool *pool) {
    atomic_store(&pool->pending, (uint32_t)(pool->n_threads - 1));
    uint32_t g = atomic_fetch_add(&pool->gen, 1) + 1; /* seq_cst: also orders the fn/ctx writes */
    if (atomic_load(&pool->sleepers)) futex_wake_all(&pool->gen);
    return g;
}

/* Runs, on the caller, every slice of job g that no worker has claimed. */
static void run_late_slices(pt_pool *pool, uint32_t g) {
    for (int i = pool->n_threads - 1; i >= 1; i--) {
        if (atomic_load_explicit(&pool->slots[i].claimed, memory_order_relaxed) == g) continue;
        if (!claim(pool, i, g)) continue;
        pool->fn(pool->ctx, i, pool->n_threads);
        atomic_fetch_sub(&pool->pending, 1);
    }
}

/* Waits for pending to reach zero: spin while slices keep finishing, sleep
 * only once the count has stalled for a whole spin budget. */
static void caller_wait_all(pt_pool *pool) {
    uint32_t left;
    while ((left = atomic_load(&pool->pending)) != 0) {
        double spin = atomic_load_explicit(&pool->spin, memory_order_relaxed);
        if (spin_while_equal(&pool->pending, left, spin) != left) continue;
        atomic_store(&pool->caller_asleep, 1);
        while ((left = atomic_load(&pool->pending)) != 0) futex_wait(&pool->pending, left);
        atomic_store(&pool->caller_asleep, 0);
    }
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

pt_pool *pt_pool_new(int n_threads) {
    if (n_threads <= 0) n_threads = online_cores();
    pt_pool *pool = pt_xcalloc(1, sizeof *pool);
    pool->n_threads = n_threads;
    atomic_init(&pool->spin, SPIN_SECONDS);
    pool->threads = pt_xcalloc((size_t)n_threads, sizeof *pool->threads);
    pool->workers = pt_xcalloc((size_t)n_threads, sizeof *pool->workers);
    pool->slots = pt_xcalloc((size_t)n_threads, sizeof *pool->slots);
    /* Workers inherit a full signal mask: a process-directed signal (SIGINT,
     * SIGTERM) is then handled on an application thread, which may clean up
     * what it was writing, and never interrupts a worker mid-job. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 1;
    for (; started < n_threads; started++) {
        pool->workers[started] = (pt_worker){pool, started};
        if (pthread_create(&pool->threads[started], NULL, worker_main, &pool->workers[started]) != 0) break;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started < n_threads) {
        pool->n_threads = started; /* stop and join only the ones that started */
        pt_pool_free(pool);
        return NULL;
    }
    return pool;
}

void pt_pool_free(pt_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    publish(pool);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool->workers);
    free(pool->slots);
    free(pool);
}

void pt_pool_set_spin(pt_pool *pool, double seconds) {
    atomic_store_explicit(&pool->spin, seconds > 0 ? seconds : 0, memory_order_relaxed);
}

int pt_pool_size(const pt_pool *pool) {
    return pool->n_threads;
}

void pt_pool_run(pt_pool *pool, pt_pool_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    uint32_t g = publish(pool);
    fn(ctx, 0, pool->n_threads);
    run_late_slices(pool, g);
    caller_wait_all(pool);
}
