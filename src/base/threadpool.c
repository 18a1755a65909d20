/*
 * threadpool.c - fork-join worker pool: spin, then futex sleep.
 *
 * Protocol.  The pool has two words that threads wait on, each on its own
 * cache line:
 *   gen      bumped by the caller to publish a job (fn, ctx);
 *   pending  workers still running the current job; the last one to finish
 *            brings it to zero.
 * A waiter spins on its word for a while (see SPIN_SECONDS), then announces
 * itself (sleepers / caller_asleep) and sleeps in FUTEX_WAIT, which
 * re-checks the word atomically in the kernel.  The side that changes the word reads the
 * announcement afterwards and only then pays for FUTEX_WAKE.  Both sides use
 * sequentially consistent operations, so either the waker sees the
 * announcement or the sleeper sees the new value: no lost wake-ups, and no
 * syscall at all while everyone is spinning (the common case in a decode
 * step, where ops follow each other within microseconds).
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

/* How long an idle thread waits before sleeping in the kernel.  For the
 * first SPIN_SECONDS it only pauses: long enough to bridge the host-side gap
 * between two ops of a forward pass.  Until YIELD_SECONDS it also yields the
 * core each round, so on an oversubscribed machine the thread it is waiting
 * for (or anyone else) can run; after that it sleeps, so an idle server does
 * not burn its cores. */
#define SPIN_SECONDS 20e-6
#define YIELD_SECONDS 200e-6

#define CACHE_LINE 64

struct pt_pool {
    _Alignas(CACHE_LINE) _Atomic uint32_t gen;
    _Atomic uint32_t sleepers; /* workers inside (or about to enter) FUTEX_WAIT on gen */
    pt_pool_fn fn;             /* the job; written before gen is bumped */
    void *ctx;
    int stop;

    _Alignas(CACHE_LINE) _Atomic uint32_t pending;
    _Atomic uint32_t caller_asleep;

    _Alignas(CACHE_LINE) int n_threads;
    pthread_t *threads;
    struct pt_worker *workers;
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

/* Waits until *word != value or the budget runs out; returns the last value
 * read.  The clock is read only every 64 pauses to keep it cheap. */
static uint32_t spin_while_equal(_Atomic uint32_t *word, uint32_t value) {
    double start = 0;
    for (unsigned i = 1;; i++) {
        uint32_t now = atomic_load_explicit(word, memory_order_acquire);
        if (now != value) return now;
        cpu_relax();
        if ((i & 63) == 0) {
            double t = pt_now();
            if (start == 0) start = t;
            if (t - start > YIELD_SECONDS) return now;
            if (t - start > SPIN_SECONDS) sched_yield();
        }
    }
}

/* Waits until the generation moves past seen; returns the new generation. */
static uint32_t worker_wait_job(pt_pool *pool, uint32_t seen) {
    uint32_t g = spin_while_equal(&pool->gen, seen);
    while (g == seen) {
        atomic_fetch_add(&pool->sleepers, 1);
        futex_wait(&pool->gen, seen);
        atomic_fetch_sub(&pool->sleepers, 1);
        g = atomic_load(&pool->gen);
    }
    return g;
}

static void worker_done(pt_pool *pool) {
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
        if (pool->stop) break; /* ordered by the acquire of gen */
        pool->fn(pool->ctx, w->ith, pool->n_threads);
        worker_done(pool);
    }
    return NULL;
}

/* Publishes the current (fn, ctx, stop) to the workers. */
static void publish(pt_pool *pool) {
    atomic_store(&pool->pending, (uint32_t)(pool->n_threads - 1));
    atomic_fetch_add(&pool->gen, 1); /* seq_cst: also orders the fn/ctx writes */
    if (atomic_load(&pool->sleepers)) futex_wake_all(&pool->gen);
}

/* Waits for pending to reach zero: spin while workers keep finishing, sleep
 * only once the count has stalled for a whole spin budget. */
static void caller_wait_all(pt_pool *pool) {
    uint32_t left;
    while ((left = atomic_load(&pool->pending)) != 0) {
        if (spin_while_equal(&pool->pending, left) != left) continue;
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
    pool->threads = pt_xcalloc((size_t)n_threads, sizeof *pool->threads);
    pool->workers = pt_xcalloc((size_t)n_threads, sizeof *pool->workers);
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
    pool->stop = 1;
    publish(pool);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool->workers);
    free(pool);
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
    publish(pool);
    fn(ctx, 0, pool->n_threads);
    caller_wait_all(pool);
}
