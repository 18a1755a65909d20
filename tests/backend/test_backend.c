/*
 * test_backend.c - the backend interface around the ops: choosing a
 * backend by name (device ordinals), op names, the op record contract the
 * CUDA graphs rely on (equal calls make byte-equal records), and the sticky
 * error (an op's failure surfaces from sync with the op's name).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"

/* "cuda:N" parses an ordinal; anything else after "cuda" is refused with a
 * message that says what is expected, before any device is touched. */
static void test_device_names(void **state) {
    (void)state;
    const char *bad[] = {"cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cuda:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pt_err err = {0};
        assert_null(pt_backend_open(bad[i], 1, NULL, &err));
        assert_non_null(strstr(err.msg, "expected cuda or cuda:N"));
        assert_non_null(strstr(err.msg, bad[i]));
    }
    pt_err err = {0};
    assert_null(pt_backend_open("gpu", 1, NULL, &err));
    assert_non_null(strstr(err.msg, "unknown device 'gpu'"));
#ifndef PETREL_CUDA
    /* A well-formed ordinal reaches the build check. */
    memset(&err, 0, sizeof err);
    assert_null(pt_backend_open("cuda:1", 1, NULL, &err));
    assert_non_null(strstr(err.msg, "no CUDA backend"));
#endif
    pt_backend *be = pt_backend_open("cpu", 1, NULL, &err);
    assert_non_null(be);
    be->ops->destroy(be);
}

static void test_op_names(void **state) {
    (void)state;
    assert_string_equal(pt_op_name(PT_OP_MATMUL), "matmul");
    assert_string_equal(pt_op_name(PT_OP_GATHER_ROWS), "gather_rows");
    for (int k = 0; k < PT_OP_COUNT; k++) assert_string_not_equal(pt_op_name(k), "?");
    assert_string_equal(pt_op_name(PT_OP_COUNT), "?");
    assert_string_equal(pt_op_name(-1), "?");
}

/* A backend that keeps the last record it was handed. */
static pt_op last;
static void keep_run(pt_backend *be, const pt_op *op) {
    (void)be;
    memcpy(&last, op, sizeof last);
}

/* The wrappers zero the whole record, so the same call from stack frames
 * holding different garbage gives identical bytes (graph reuse compares
 * records with memcmp). */
static void __attribute__((noinline)) call_attention(pt_backend *be, unsigned char junk) {
    volatile unsigned char noise[512];
    for (size_t i = 0; i < sizeof noise; i++) noise[i] = junk;
    pt_kv_view kv;
    memset(&kv, junk, sizeof kv); /* padding of the caller's struct, if any, is junk */
    kv.k = (void *)0x1000, kv.v = (void *)0x2000, kv.dtype = PT_F16, kv.page_size = 16;
    kv.n_kv_heads = 2, kv.head_dim = 64, kv.codec = NULL, kv.kvq = 0, kv.k_bits = kv.v_bits = 0;
    kv.group = 0, kv.k_row = kv.v_row = 0, kv.tables = NULL;
    pt_batch_view b = {.n_tokens = 1, .pos = (const int32_t *)0x3000,
                       .seq = (const int32_t *)0x4000, .block_table = (const int32_t *)0x5000,
                       .max_pages = 4, .n_seqs = 1};
    pt_be_attention(be, (float *)0x6000, (const float *)0x7000, &kv, &b, 8, 0.125f);
}

static void test_records_compare_bytewise(void **state) {
    (void)state;
    static const pt_backend_ops ops = {.run = keep_run};
    pt_backend be = {.ops = &ops, .name = "test"};
    call_attention(&be, 0xa5);
    pt_op first;
    memcpy(&first, &last, sizeof first);
    call_attention(&be, 0x5a);
    assert_int_equal(first.kind, PT_OP_ATTENTION);
    assert_int_equal(first.attention.n_heads, 8);
    assert_memory_equal(&first, &last, sizeof first);
}

/* PETREL_FAULT_OP=rmsnorm:2: the second rmsnorm fails instead of running,
 * the ops after it are skipped, sync and download return -1 with the op's
 * name until the error is taken, and then the backend runs again. */
static void test_injected_fault_surfaces_at_sync(void **state) {
    (void)state;
    setenv("PETREL_FAULT_OP", "rmsnorm:2", 1);
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    unsetenv("PETREL_FAULT_OP");
    assert_non_null(be);
    float x[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, y[4], z[4];
    pt_be_rmsnorm(be, y, x, g, 1, 4, 1e-6f);
    assert_int_equal(be->ops->sync(be), 0);
    assert_true(fabsf(y[3] - 4.0f / sqrtf(7.5f)) < 1e-5f);
    for (int i = 0; i < 4; i++) y[i] = z[i] = NAN;
    pt_be_rmsnorm(be, y, x, g, 1, 4, 1e-6f); /* call 2: fails */
    pt_be_add(be, z, x, x, 4);               /* skipped: the backend is in error */
    assert_true(isnan(y[0]) && isnan(z[0]));
    float h[4];
    assert_int_equal(be->ops->download(be, h, x, sizeof h), -1);
    assert_int_equal(be->ops->sync(be), -1);
    assert_int_equal(be->ops->sync(be), -1); /* sticky */
    pt_err got = {{0}};
    assert_int_equal(pt_be_take_error(be, &got), -1);
    assert_non_null(strstr(got.msg, "rmsnorm"));
    assert_non_null(strstr(got.msg, "injected fault"));
    assert_int_equal(pt_be_take_error(be, &got), 0); /* taken: gone */
    assert_int_equal(be->ops->sync(be), 0);
    pt_be_add(be, z, x, x, 4);
    pt_be_rmsnorm(be, y, x, g, 1, 4, 1e-6f); /* call 3: runs */
    assert_int_equal(be->ops->sync(be), 0);
    assert_true(z[3] == 8.0f && fabsf(y[3] - 4.0f / sqrtf(7.5f)) < 1e-5f);
    be->ops->destroy(be);
}

/* The first failure is the one reported; later ones do not overwrite it. */
static void test_first_failure_wins(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_int_equal(pt_be_fail(be, "matmul", "first %d", 1), -1);
    assert_int_equal(pt_be_fail(be, "rope", "second"), -1);
    assert_int_equal(be->ops->sync(be), -1);
    assert_int_equal(pt_be_take_error(be, &err), -1);
    assert_non_null(strstr(err.msg, "matmul: first 1"));
    assert_null(strstr(err.msg, "rope"));
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_names),
        cmocka_unit_test(test_op_names),
        cmocka_unit_test(test_records_compare_bytewise),
        cmocka_unit_test(test_injected_fault_surfaces_at_sync),
        cmocka_unit_test(test_first_failure_wins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
