/*
 * test_threadpool.c - the fork-join pool: every thread runs exactly once per
 * dispatch, partitions add up, rapid dispatches and sleeping workers both
 * work, the blocking path (no spinning: every wait sleeps, late workers'
 * slices run on the caller) keeps every slice exactly once, and pools come
 * and go cleanly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "base/threadpool.h"

/* Each thread sums its slice [n*ith/nth, n*(ith+1)/nth) of 1..n and records
 * that it ran. */
typedef struct sum_job {
    int64_t n;
    int64_t partial[64];
    int calls[64];
    int nth_seen[64];
} sum_job;

static void sum_slice(void *ctx, int ith, int nth) {
    sum_job *j = ctx;
    int64_t lo = j->n * ith / nth, hi = j->n * (ith + 1) / nth, s = 0;
    for (int64_t i = lo; i < hi; i++) s += i + 1;
    j->partial[ith] = s;
    j->calls[ith]++;
    j->nth_seen[ith] = nth;
}

static void check_sum(pt_pool *pool, int64_t n) {
    sum_job j = {.n = n};
    pt_pool_run(pool, sum_slice, &j);
    int nth = pt_pool_size(pool);
    int64_t total = 0;
    for (int i = 0; i < nth; i++) {
        assert_int_equal(j.calls[i], 1);
        assert_int_equal(j.nth_seen[i], nth);
        total += j.partial[i];
    }
    for (int i = nth; i < 64; i++) assert_int_equal(j.calls[i], 0);
    assert_true(total == n * (n + 1) / 2);
}

static void test_partition_sums(void **state) {
    (void)state;
    for (int nth = 1; nth <= 5; nth++) {
        pt_pool *pool = pt_pool_new(nth);
        assert_non_null(pool);
        assert_int_equal(pt_pool_size(pool), nth);
        int64_t sizes[] = {0, 1, 2, 3, 7, 1000, 1000003};
        for (size_t k = 0; k < PT_ARRAY_LEN(sizes); k++) check_sum(pool, sizes[k]);
        pt_pool_free(pool);
    }
}

/* Many back-to-back dispatches, as in a decode step; each one's results must
 * be complete when pt_pool_run returns. */
typedef struct count_job {
    int64_t counter[64][8]; /* one cache line per thread */
} count_job;

static void bump(void *ctx, int ith, int nth) {
    (void)nth;
    count_job *j = ctx;
    j->counter[ith][0]++;
}

static void test_rapid_dispatch(void **state) {
    (void)state;
    for (int nth = 2; nth <= 3; nth++) {
        pt_pool *pool = pt_pool_new(nth);
        count_job *j = calloc(1, sizeof *j);
        /* More threads than cores is legal but every hand-off then waits
         * for the scheduler: keep that case short. */
        const int reps = nth <= sysconf(_SC_NPROCESSORS_ONLN) ? 100000 : 300;
        double t0 = pt_now();
        for (int r = 0; r < reps; r++) {
            pt_pool_run(pool, bump, j);
            for (int i = 0; i < nth; i++)
                if (j->counter[i][0] != r + 1) fail_msg("thread %d missed dispatch %d", i, r);
        }
        double us = (pt_now() - t0) / reps * 1e6;
        print_message("%d threads: %.2f us per dispatch\n", nth, us);
        free(j);
        pt_pool_free(pool);
    }
}

/* Dispatches separated by pauses longer than the spin budget, so workers
 * are asleep in the futex when the job arrives. */
static void test_wake_from_sleep(void **state) {
    (void)state;
    pt_pool *pool = pt_pool_new(3);
    for (int r = 0; r < 20; r++) {
        usleep(2000);
        check_sum(pool, 12345 + r);
    }
    pt_pool_free(pool);
}

/* A slow thread 0 makes the workers finish first; a slow worker makes the
 * caller wait (and sleep) for it. */
static void slow_one(void *ctx, int ith, int nth) {
    int *args = ctx; /* args[0] = slow thread, args[1 + ith] = ran */
    if (ith == args[0]) usleep(3000);
    args[1 + ith] += 1;
    (void)nth;
}

static void test_uneven_threads(void **state) {
    (void)state;
    pt_pool *pool = pt_pool_new(3);
    for (int slow = 0; slow < 3; slow++) {
        int args[4] = {slow, 0, 0, 0};
        pt_pool_run(pool, slow_one, args);
        assert_int_equal(args[1], 1);
        assert_int_equal(args[2], 1);
        assert_int_equal(args[3], 1);
    }
    pt_pool_free(pool);
}

static void test_create_destroy(void **state) {
    (void)state;
    for (int r = 0; r < 50; r++) {
        pt_pool *pool = pt_pool_new(1 + r % 4);
        if (r % 2) check_sum(pool, 100 + r);
        pt_pool_free(pool);
    }
    pt_pool_free(NULL);
    pt_pool *pool = pt_pool_new(0); /* one per core */
    assert_true(pt_pool_size(pool) >= 1);
    check_sum(pool, 999);
    pt_pool_free(pool);
}

/* Spin 0: every waiting thread goes straight to FUTEX_WAIT, so every
 * dispatch goes through the sleep/wake path, and the caller, which is done
 * with its own tiny slice long before a sleeping worker is scheduled, runs
 * most workers' slices itself.  Each slice must still run exactly once per
 * dispatch, on some thread, with every result visible on return. */
typedef struct who_job {
    int64_t counter[64][8];
    pthread_t ran_on[64];
    int64_t value;
} who_job;

static void record(void *ctx, int ith, int nth) {
    who_job *j = ctx;
    j->counter[ith][0]++;
    j->ran_on[ith] = pthread_self();
    j->counter[ith][1] = j->value * (ith + 1); /* read after the dispatch */
    (void)nth;
}

static void test_blocking_path(void **state) {
    (void)state;
    for (int nth = 2; nth <= 4; nth++) {
        pt_pool *pool = pt_pool_new(nth);
        pt_pool_set_spin(pool, 0);
        who_job *j = calloc(1, sizeof *j);
        int reps = 20000, on_caller = 0;
        pthread_t me = pthread_self();
        for (int r = 0; r < reps; r++) {
            j->value = r;
            pt_pool_run(pool, record, j);
            for (int i = 0; i < nth; i++) {
                if (j->counter[i][0] != r + 1) fail_msg("%d threads: slice %d ran %lld times by dispatch %d", nth, i,
                                                        (long long)j->counter[i][0], r + 1);
                if (j->counter[i][1] != (int64_t)r * (i + 1)) fail_msg("slice %d: stale result", i);
                on_caller += i > 0 && pthread_equal(j->ran_on[i], me);
            }
            if (r % 1000 == 999) usleep(100); /* and workers deep asleep now and then */
        }
        for (int i = nth; i < 64; i++) assert_int_equal(j->counter[i][0], 0);
        print_message("%d threads, spin 0: %d of %d worker slices ran on the caller\n", nth, on_caller,
                      reps * (nth - 1));
        free(j);
        pt_pool_free(pool);
    }
}

/* A slow slice on the caller or on a worker, with spin 0: the other slices
 * wait asleep, nothing runs twice. */
static void test_blocking_uneven(void **state) {
    (void)state;
    pt_pool *pool = pt_pool_new(3);
    pt_pool_set_spin(pool, 0);
    for (int slow = 0; slow < 3; slow++)
        for (int r = 0; r < 5; r++) {
            int args[4] = {slow, 0, 0, 0};
            pt_pool_run(pool, slow_one, args);
            assert_int_equal(args[1], 1);
            assert_int_equal(args[2], 1);
            assert_int_equal(args[3], 1);
        }
    for (int r = 0; r < 200; r++) check_sum(pool, 1000 + r);
    pt_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partition_sums),  cmocka_unit_test(test_rapid_dispatch),
        cmocka_unit_test(test_wake_from_sleep), cmocka_unit_test(test_uneven_threads),
        cmocka_unit_test(test_blocking_path),   cmocka_unit_test(test_blocking_uneven),
        cmocka_unit_test(test_create_destroy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
