/*
 * test_cost.c - the bytes `petrel bench` divides bandwidth by (cost.c),
 * against numbers computed by hand from the fixtures' tensor shapes
 * (tests/fixtures/hf/<name>/model.safetensors; dtype sizes: bf16 and f16
 * 2 bytes), so roofline fractions of MoE and sliding-window models are
 * honest: a decode step reads the dense weights, top_k / n_experts of the
 * expert stacks, the output matrix (not the embedding table), every KV
 * position of a full-attention layer and at most `window` of a
 * sliding-window one.  Also the KV one sequence keeps resident.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "model/model_int.h"

/* cmocka here has no assert_double_equal */
#define assert_bytes(got, want) check_bytes((got), (want), __LINE__)
static void check_bytes(double got, double want, int line) {
    if (fabs(got - want) > 0.5) fail_msg("line %d: %.1f bytes, want %.1f", line, got, want);
}

static pt_model *load(pt_backend **be, const char *path) {
    pt_err err = {{0}};
    *be = pt_backend_cpu_new(1, "auto", &err);
    if (!*be) fail_msg("%s", err.msg);
    pt_model_opts o = {.backend = *be};
    pt_model *m = NULL;
    if (pt_model_load(&m, path, &o, &err)) fail_msg("%s: %s", path, err.msg);
    return m;
}

/* Norm vectors: whatever the loader keeps them as, they are not matrices
 * and sum to little; the test takes them from weight_bytes less the
 * matrices, and checks that remainder is small. */
static double norms(const pt_model *m, double matrices) {
    double r = (double)m->weight_bytes - matrices;
    assert_true(r >= 0 && r < 8192);
    return r;
}

/* Qwen3-MoE fixture: 3 layers, 6 experts, top 2, experts 32 wide, dim 64,
 * 4 query heads and 2 KV heads of 64, vocabulary 320, untied, bf16.
 *   attention per layer  q 256x64 + k 128x64 + v 128x64 + o 64x256
 *                        = 49152 elements = 98304 bytes; x3 = 294912
 *   router per layer     6x64 = 384 elements = 768 bytes; x3 = 2304
 *   experts per layer    3 stacks x 6 x 32x64 = 36864 el. = 73728 bytes;
 *                        x3 = 221184, of which 2/6 are read: 73728
 *   lm_head 320x64       40960 bytes (the embedding table: one row, not counted)
 * so a step at depth 0 reads 294912 + 2304 + 73728 + 40960 = 411904 bytes
 * plus the norms; the KV (f16) is 3 layers x 2 heads x 64 x (K, V) x 2
 * = 1536 bytes per token, all of it read at every depth. */
static void test_moe_active_experts(void **state) {
    (void)state;
    pt_backend *be;
    pt_model *m = load(&be, "tests/fixtures/hf/qwen3_moe");
    double all_matrices = 294912 + 2304 + 221184 + 40960 + 40960.0;
    double n = norms(m, all_matrices);
    size_t kv = 1536;
    assert_bytes(pt_model_step_bytes(m, 0, kv), 411904 + n);
    assert_bytes(pt_model_step_bytes(m, 1000, kv), 411904 + n + 1000.0 * 1536);
    /* the same stacks read whole would be 147456 bytes more: that is the
     * dishonesty a dense count had */
    assert_bytes(pt_model_step_bytes(m, 0, kv), m->weight_bytes - 40960 - 147456.0);
    /* no window: resident KV is every page of the context */
    assert_bytes(pt_model_kv_resident(m, 100, kv, 16), 112.0 * 1536);
    pt_model_free(m);
    be->ops->destroy(be);
}

/* Gemma 2 fixture: 4 layers alternating sliding (window 8) and full,
 * dim 64, 4 query heads and 2 KV heads of 32, FFN 128, vocabulary 320,
 * tied embeddings, f16.
 *   per layer  q 128x64 + k 64x64 + v 64x64 + o 64x128 + gate, up 128x64
 *              + down 64x128 = 49152 elements = 98304 bytes; x4 = 393216
 *   output     the tied table 320x64 = 40960 bytes, read whole
 * so weights read per step: 434176 plus the norms.  KV (f16) per layer
 * and token: 2 heads x 32 x (K, V) x 2 = 256 bytes, 1024 over 4 layers.
 * At depth 100: full layers 2 x 100 x 256 = 51200, sliding layers
 * 2 x 8 x 256 = 4096; at depth 5 (inside the window) 5 x 1024 = 5120. */
static void test_sliding_window_kv(void **state) {
    (void)state;
    pt_backend *be;
    pt_model *m = load(&be, "tests/fixtures/hf/gemma2");
    double n = norms(m, 393216 + 40960.0);
    size_t kv = 1024;
    assert_bytes(pt_model_step_bytes(m, 100, kv), 434176 + n + 51200 + 4096);
    assert_bytes(pt_model_step_bytes(m, 5, kv), 434176 + n + 5120);
    /* resident at 32768 positions, pages of 16: full layers 2048 pages x
     * 16 x 2 x 256 = 16 MiB; window layers ceil(8/16) + 1 = 2 pages:
     * 2 x 16 x 2 x 256 = 16384 bytes; an all-global cache would be 32 MiB */
    assert_bytes(pt_model_kv_resident(m, 32768, kv, 16), 16777216.0 + 16384);
    assert_bytes(pt_model_kv_resident(m, 10, kv, 16), 16.0 * 1024); /* one page */
    pt_model_free(m);
    be->ops->destroy(be);
}

/* gpt-oss fixture: both at once.  4 layers alternating sliding (window 8)
 * and full, 6 experts, top 2, expert width 64, dim 64, 4 query heads and
 * 2 KV heads of 32, vocabulary 320, untied, bf16.
 *   attention  q 128x64 + k 64x64 + v 64x64 + o 64x128 = 24576 el.
 *              = 49152 bytes per layer; x4 = 196608
 *   router     6x64 = 768 bytes per layer; x4 = 3072
 *   experts    gate_up 6x64x128 + down 6x64x64 = 73728 el. = 147456
 *              bytes per layer; x4 = 589824, of which 2/6 read: 196608
 *   lm_head    320x64 = 40960 bytes
 * so 196608 + 3072 + 196608 + 40960 = 437248 bytes plus the vectors
 * (norms, attention biases, sinks; the experts' biases are kept apart,
 * 4 layers x 6 x 192 floats, and not counted).  KV as Gemma 2's: at depth
 * 100, 51200 + 4096 bytes. */
static void test_gpt_oss_both(void **state) {
    (void)state;
    pt_backend *be;
    pt_model *m = load(&be, "tests/fixtures/hf/gpt_oss");
    double n = norms(m, 196608 + 3072 + 589824 + 40960 + 40960.0);
    assert_bytes(pt_model_step_bytes(m, 100, 1024), 437248 + n + 51200 + 4096);
    pt_model_free(m);
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_active_experts),
        cmocka_unit_test(test_sliding_window_kv),
        cmocka_unit_test(test_gpt_oss_both),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
