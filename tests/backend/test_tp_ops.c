/*
 * test_tp_ops.c - the CPU backend's expert-parallel ops (backend.h):
 * moe_local keeps the routing slots of a rank's experts, renumbered, and
 * turns the others into id -1 with weight 0; matmul_id gives a zero row
 * for id -1 and, for the rest, exactly what the whole stack gives.  The
 * ranks' combined outputs then sum to the whole model's (to f32 rounding).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"

enum { N = 5, K = 3, E = 6, ROWS = 4, COLS = 8, RANKS = 3 };

static void test_moe_local(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    int32_t ids[] = {0, 2, 5, 3, 4, 1};
    float w[] = {.1f, .2f, .3f, .4f, .5f, .6f};
    pt_be_moe_local(be, ids, w, 2, 3, 2, 2); /* experts 2 and 3 */
    int32_t want_ids[] = {-1, 0, -1, 1, -1, -1};
    float want_w[] = {0, .2f, 0, .4f, 0, 0};
    assert_memory_equal(ids, want_ids, sizeof ids);
    assert_memory_equal(w, want_w, sizeof w);
    be->ops->destroy(be);
}

/* A stack of E experts [ROWS][COLS] f32; each rank holds E / RANKS of them
 * (a view), localizes the routing and runs matmul_id then moe_combine; the
 * sum over ranks must match the whole stack's combine. */
static void test_expert_split_sums_to_whole(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(2, "auto", &err);
    float wdata[E * ROWS * COLS], x[N * COLS];
    for (int i = 0; i < E * ROWS * COLS; i++)
        wdata[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < N * COLS; i++)
        x[i] = cosf((float)i * 0.11f);
    int32_t ids[N * K];
    float wts[N * K];
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            ids[t * K + j] = (t + 2 * j) % E, wts[t * K + j] = 0.1f * (j + 1);
    pt_weight w = {.dtype = PT_F32,
                   .rows = ROWS,
                   .cols = COLS,
                   .data = wdata,
                   .nbytes = sizeof wdata,
                   .n_experts = E,
                   .expert_stride = ROWS * COLS * sizeof(float)};
    float y[N * K * ROWS], whole[N * ROWS], sum[N * ROWS] = {0};
    pt_be_matmul_id(be, y, x, &w, ids, N, K, 1);
    pt_be_moe_combine(be, whole, y, wts, N, K, ROWS);
    int per = E / RANKS;
    for (int r = 0; r < RANKS; r++) {
        int32_t lid[N * K];
        float lw[N * K], part[N * ROWS];
        memcpy(lid, ids, sizeof ids);
        memcpy(lw, wts, sizeof wts);
        pt_be_moe_local(be, lid, lw, N, K, r * per, per);
        pt_weight v = w;
        v.data = wdata + r * per * ROWS * COLS;
        v.n_experts = per;
        memset(y, 0x7f, sizeof y); /* skipped rows must be written as zero */
        pt_be_matmul_id(be, y, x, &v, lid, N, K, 1);
        for (int i = 0; i < N * K; i++)
            for (int o = 0; o < ROWS && lid[i] < 0; o++)
                assert_true(y[i * ROWS + o] == 0.0f);
        pt_be_moe_combine(be, part, y, lw, N, K, ROWS);
        for (int i = 0; i < N * ROWS; i++)
            sum[i] += part[i];
    }
    for (int i = 0; i < N * ROWS; i++)
        assert_true(fabsf(sum[i] - whole[i]) <= 1e-6f * (1 + fabsf(whole[i])));
    assert_false(be->failed);
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_local),
        cmocka_unit_test(test_expert_split_sums_to_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
