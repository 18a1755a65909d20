/*
 * test_comm.c - the host communicator (backend/comm.h) and the all_reduce
 * op on the CPU backend: N threads, each with its own buffer and its own
 * backend, sum in place.  Every rank must end with exactly the sum added
 * in rank order (the same bits on every rank, run after run), for counts
 * that do and do not divide by N (0 and 1 included), over many rounds in
 * a row (a rank that ran ahead into the next round must not disturb the
 * one still reading).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/comm.h"

#define ROUNDS 200
#define MAX_COUNT 37

typedef struct rank_arg {
    pt_comm *comm;
    pt_backend *be;
    int rank, n;
    float out[ROUNDS][MAX_COUNT]; /* what the rank held after each round */
} rank_arg;

/* Rank r's contribution to element i of round k: not exactly summable in
 * any order, so a wrong order shows. */
static float part(int k, int r, int i) {
    return (float)(r + 1) * 0.1f + (float)i * 1e-3f + (float)k * 1e3f / (float)(r + 3);
}

static int count_of(int k) {
    return k % (MAX_COUNT + 1); /* 0 .. MAX_COUNT */
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    float buf[MAX_COUNT];
    for (int k = 0; k < ROUNDS; k++) {
        int c = count_of(k);
        for (int i = 0; i < c; i++)
            buf[i] = part(k, a->rank, i);
        pt_be_all_reduce(a->be, a->comm, a->rank, buf, (size_t)c);
        memcpy(a->out[k], buf, sizeof(float) * (size_t)c);
    }
    return NULL;
}

static void check_ranks(int n) {
    pt_comm *comm = pt_comm_host_new(n);
    assert_int_equal(pt_comm_size(comm), n);
    assert_int_equal(pt_comm_kind(comm), PT_COMM_HOST);
    rank_arg *a = calloc((size_t)n, sizeof *a);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    pt_err err = {{0}};
    for (int r = 0; r < n; r++) {
        a[r] = (rank_arg){.comm = comm, .rank = r, .n = n};
        a[r].be = pt_backend_cpu_new(1, "auto", &err);
        assert_non_null(a[r].be);
    }
    for (int r = 0; r < n; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int k = 0; k < ROUNDS; k++)
        for (int i = 0; i < count_of(k); i++) {
            float want = part(k, 0, i);
            for (int r = 1; r < n; r++)
                want += part(k, r, i);
            for (int r = 0; r < n; r++)
                if (memcmp(&a[r].out[k][i], &want, sizeof want) != 0)
                    fail_msg("%d ranks, round %d, element %d: rank %d has %.9g, want %.9g", n, k, i,
                             r, a[r].out[k][i], want);
        }
    for (int r = 0; r < n; r++)
        a[r].be->ops->destroy(a[r].be);
    free(a);
    free(th);
    pt_comm_free(comm);
}

static void test_host_all_reduce(void **state) {
    (void)state;
    for (int n = 1; n <= 8; n++)
        check_ranks(n);
}

/* Without NCCL in the build, asking for it fails with the reason. */
static void test_nccl_absent_says_so(void **state) {
    (void)state;
    if (pt_comm_have_nccl()) skip();
    pt_comm *c = (pt_comm *)1;
    pt_err err = {{0}};
    int dev = 0;
    assert_int_equal(pt_comm_nccl_new(&c, &dev, 1, &err), -1);
    assert_null(c);
    assert_non_null(strstr(err.msg, "needs NCCL"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_all_reduce),
        cmocka_unit_test(test_nccl_absent_says_so),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
