/*
 * test_runner.c - the runner's rows and logits on a real model: k+1 query
 * rows of one sequence with every row's logits (what speculative
 * verification needs) equal the same tokens decoded one step at a time,
 * and rolling the sequence back then recomputing gives the same logits
 * again (rejected drafts leave no trace); with want_ids the backend's
 * picks are the sampler's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/runner.h"

#define MODEL PETREL_SOURCE_DIR "/models/stories260K.gguf"

static pt_engine *open_engine(int n_ctx) {
    pt_engine_opts o = {.model_path = MODEL, .n_threads = 1, .kernels = "auto", .n_ctx = n_ctx,
                        .kv_dtype = PT_F32};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void run(pt_runner *r, pt_seq *s, int n_rows, int n_logits) {
    pt_run_item it = {s, n_rows, n_logits};
    pt_err err = {{0}};
    int failed;
    if (pt_runner_run(r, &it, 1, &failed, &err)) fail_msg("run: %s", err.msg);
}

static void test_k_plus_one_rows(void **state) {
    (void)state;
    enum { K = 4 };
    pt_engine *e = open_engine(128);
    int vocab = e->model->cfg.vocab_size;
    pt_sampling sp = pt_sampling_default();
    sp.temperature = 0;
    int32_t prompt[] = {1, 403, 407, 261, 378}, drafts[K + 1] = {430, 261, 1, 29, 11};
    pt_runner r;
    pt_runner_init(&r, e);

    /* reference: one row per step */
    float *step = malloc(sizeof(float) * (size_t)vocab * (K + 1));
    pt_seq a;
    pt_seq_init(&a, e, &sp);
    for (int i = 0; i < 5; i++) pt_seq_push(&a, prompt[i]);
    run(&r, &a, 5, 0);
    for (int i = 0; i <= K; i++) {
        pt_seq_push(&a, drafts[i]);
        run(&r, &a, 1, 1);
        memcpy(step + (size_t)i * vocab, r.logits, sizeof(float) * (size_t)vocab);
    }

    /* verification: K + 1 rows, all their logits, in one call */
    pt_seq b;
    pt_seq_init(&b, e, &sp);
    for (int i = 0; i < 5; i++) pt_seq_push(&b, prompt[i]);
    run(&r, &b, 5, 0);
    for (int i = 0; i <= K; i++) pt_seq_push(&b, drafts[i]);
    run(&r, &b, K + 1, K + 1);
    assert_int_equal(b.kv.n_tokens, 5 + K + 1);
    for (int i = 0; i <= K; i++) {
        double d = max_diff(r.logits + (size_t)i * vocab, step + (size_t)i * vocab, vocab);
        if (d > 1e-4) fail_msg("row %d of %d: max |logit diff| %.3g", i, K + 1, d);
    }

    /* reject the last two drafts: roll back and recompute them */
    pt_kv_seq_truncate(&e->kv, &b.kv, 5 + K - 1);
    assert_int_equal(b.kv.n_tokens, 5 + K - 1);
    run(&r, &b, 2, 2);
    for (int i = 0; i < 2; i++) {
        double d = max_diff(r.logits + (size_t)i * vocab, step + (size_t)(K - 1 + i) * vocab, vocab);
        if (d > 1e-4) fail_msg("after rollback, row %d: max |logit diff| %.3g", i, d);
    }
    pt_seq_free(&a, e);
    pt_seq_free(&b, e);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    pt_runner_free(&r);
    free(step);
    pt_engine_close(e);
}

/* A fork shares the prompt's pages; both continue independently, and the
 * fork's logits equal a sequence computed from scratch. */
static void test_fork_continues(void **state) {
    (void)state;
    pt_engine *e = open_engine(128);
    int vocab = e->model->cfg.vocab_size;
    pt_sampling sp = pt_sampling_default();
    sp.temperature = 0;
    int32_t prompt[] = {1, 403, 407, 261, 378, 430, 261, 1, 29, 11, 403, 407, 261, 378, 29, 1, 45, 50};
    int n = (int)PT_ARRAY_LEN(prompt);
    pt_runner r;
    pt_runner_init(&r, e);
    pt_seq a, b, c;
    pt_seq_init(&a, e, &sp), pt_seq_init(&b, e, &sp), pt_seq_init(&c, e, &sp);
    for (int i = 0; i < n; i++) pt_seq_push(&a, prompt[i]), pt_seq_push(&b, prompt[i]);
    for (int i = 0; i < n; i++) pt_seq_push(&c, prompt[i]);
    run(&r, &a, n, 0);
    pt_kv_seq_fork(&e->kv, &b.kv, &a.kv);
    int before = pt_kv_free_pages(&e->kv);
    pt_seq_push(&a, 300), pt_seq_push(&b, 301), pt_seq_push(&c, 301);
    run(&r, &a, 1, 1);
    run(&r, &b, 1, 1); /* copies the shared partial page */
    assert_int_equal(pt_kv_free_pages(&e->kv), before - 1);
    float *fork = malloc(sizeof(float) * (size_t)vocab);
    memcpy(fork, r.logits, sizeof(float) * (size_t)vocab);
    run(&r, &c, n + 1, 1);
    double d = max_diff(fork, r.logits, vocab);
    if (d > 1e-4) fail_msg("forked sequence: max |logit diff| %.3g", d);
    pt_seq_free(&a, e), pt_seq_free(&b, e), pt_seq_free(&c, e);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    free(fork);
    pt_runner_free(&r);
    pt_engine_close(e);
}

/* Greedy picks on the backend (want_ids): each row's id is the pick the
 * sampler makes from that row's logits, for every row of a verify-sized
 * call, and PETREL_DEVICE_ARGMAX=0 gives logits back instead. */
static void test_argmax_picks(void **state) {
    (void)state;
    enum { K = 4 };
    pt_engine *e = open_engine(128);
    int vocab = e->model->cfg.vocab_size;
    pt_sampling sp = pt_sampling_default();
    sp.temperature = 0;
    int32_t toks[] = {1, 403, 407, 261, 378, 430, 261, 1, 29, 11};
    pt_runner r;
    pt_runner_init(&r, e);
    assert_true(r.can_ids);
    pt_seq a;
    pt_seq_init(&a, e, &sp);
    assert_true(pt_sampler_is_argmax(a.sampler));
    for (int i = 0; i < 10; i++) pt_seq_push(&a, toks[i]);
    run(&r, &a, 10 - K - 1, 0);
    run(&r, &a, K + 1, K + 1); /* logits */
    assert_false(r.have_ids);
    int32_t want[K + 1];
    for (int i = 0; i <= K; i++) {
        pt_sample_result res;
        pt_sampler_sample(a.sampler, r.logits + (size_t)i * vocab, &res);
        want[i] = res.id;
    }
    pt_kv_seq_truncate(&e->kv, &a.kv, 10 - K - 1);
    r.want_ids = true;
    run(&r, &a, K + 1, K + 1); /* the same rows, picks only */
    assert_true(r.have_ids);
    for (int i = 0; i <= K; i++)
        if (r.ids[i] != want[i])
            fail_msg("row %d: backend pick %d, sampler %d", i, r.ids[i], want[i]);

    /* a bias makes the sampler more than an argmax */
    int32_t bias_id = 7;
    float bias_val = 1.0f;
    pt_sampler_set_bias(a.sampler, &bias_id, &bias_val, 1);
    assert_false(pt_sampler_is_argmax(a.sampler));
    pt_seq_free(&a, e);
    pt_runner_free(&r);

    setenv("PETREL_DEVICE_ARGMAX", "0", 1);
    pt_runner_init(&r, e);
    unsetenv("PETREL_DEVICE_ARGMAX");
    assert_false(r.can_ids);
    pt_runner_free(&r);
    pt_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k_plus_one_rows),
        cmocka_unit_test(test_fork_continues),
        cmocka_unit_test(test_argmax_picks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
