/*
 * test_logits_proc.c - the logits-processor interface: rollback of the
 * penalty window equals a sampler that never saw the rolled-back tokens,
 * an added processor (a mask, as a grammar will be) constrains the pick
 * while logprobs stay those of the raw distribution, and the edit record
 * keeps the first raw value of an entry written twice.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "sample/logits_proc.h"

enum { V = 50 };

static void fill(float *l, uint64_t seed) {
    pt_rng r;
    pt_rng_seed(&r, seed);
    for (int i = 0; i < V; i++) l[i] = (float)(pt_rng_next(&r) % 1000) / 100.0f - 5.0f;
}

/* Applies s's processors to a copy of base and returns the edited row. */
static void edited(pt_sampler *s, const float *base, float *out) {
    memcpy(out, base, sizeof(float) * V);
    pt_sample_result r;
    pt_sampler_sample(s, out, &r);
}

static void test_penalty_rollback(void **state) {
    (void)state;
    int windows[] = {-1, 3, 8};
    for (size_t w = 0; w < PT_ARRAY_LEN(windows); w++) {
        pt_sampling p = pt_sampling_default();
        p.temperature = 0;
        p.repetition_penalty = 1.3f, p.frequency_penalty = 0.4f, p.presence_penalty = 0.2f;
        p.penalty_last_n = windows[w];
        pt_sampler *a = pt_sampler_new(&p, V), *b = pt_sampler_new(&p, V);
        int32_t hist[] = {4, 7, 4, 9, 4, 11, 7, 2, 30, 4, 7, 7};
        int n = (int)PT_ARRAY_LEN(hist), keep = 5;
        for (int i = 0; i < n; i++) pt_sampler_accept(a, hist[i]);
        pt_sampler_rollback(a, n - keep); /* as if drafts were rejected */
        for (int i = 0; i < keep; i++) pt_sampler_accept(b, hist[i]);
        float base[V], ea[V], eb[V];
        for (uint64_t seed = 1; seed < 6; seed++) {
            fill(base, seed);
            edited(a, base, ea);
            edited(b, base, eb);
            for (int i = 0; i < V; i++)
                if (ea[i] != eb[i]) fail_msg("window %d, token %d: %g vs %g", windows[w], i, ea[i], eb[i]);
        }
        /* and both continue identically */
        pt_sampler_accept(a, 4), pt_sampler_accept(b, 4);
        fill(base, 9);
        edited(a, base, ea), edited(b, base, eb);
        assert_memory_equal(ea, eb, sizeof ea);
        /* rolling back more than was accepted forgets everything */
        pt_sampler_rollback(a, 1000);
        memcpy(ea, base, sizeof ea);
        pt_sample_result r;
        pt_sampler_sample(a, ea, &r);
        assert_memory_equal(ea, base, sizeof ea);
        pt_sampler_free(a);
        pt_sampler_free(b);
    }
}

/* A mask processor: only tokens with even ids are allowed. */
static void even_apply(void *self, pt_logits *l) {
    (void)self;
    uint32_t allowed[(V + 31) / 32] = {0};
    for (int i = 0; i < V; i += 2) allowed[i >> 5] |= 1u << (i & 31);
    pt_logits_mask(l, allowed);
}
static int zero_writes(const void *self) { (void)self; return 0; }
static void no_accept(void *self, int32_t id) { (void)self, (void)id; }
static void no_rollback(void *self, int n) { (void)self, (void)n; }
static void no_free(void *self) { (void)self; }
static const pt_logits_proc_ops even_ops = {"even", zero_writes, even_apply, no_accept, no_rollback, no_free, NULL};

static void test_added_mask(void **state) {
    (void)state;
    pt_sampling p = pt_sampling_default();
    p.temperature = 0;
    p.n_logprobs = 3;
    pt_sampler *s = pt_sampler_new(&p, V);
    pt_sampler_add_proc(s, (pt_logits_proc){&even_ops, NULL});
    float base[V], l[V];
    fill(base, 3);
    base[7] = 100.0f; /* the raw favourite is odd: masked */
    base[12] = 50.0f;
    memcpy(l, base, sizeof l);
    pt_sample_result r;
    pt_sampler_sample(s, l, &r);
    assert_int_equal(r.id, 12);
    /* logprobs are of the raw distribution: the masked 7 is still the top */
    assert_int_equal(r.top[0].id, 7);
    double lse = 0;
    for (int i = 0; i < V; i++) lse += exp((double)base[i] - 100.0);
    lse = 100.0 + log(lse);
    assert_true(fabs(r.logprob - (50.0 - lse)) < 1e-4);
    pt_sampler_free(s);
}

/* Bias and penalty both write token 4; the logprob uses its raw logit. */
static void test_first_raw_value_wins(void **state) {
    (void)state;
    pt_sampling p = pt_sampling_default();
    p.temperature = 0;
    p.n_logprobs = 0;
    p.frequency_penalty = 1.0f;
    pt_sampler *s = pt_sampler_new(&p, V);
    int32_t id = 4;
    float val = 20.0f;
    pt_sampler_set_bias(s, &id, &val, 1);
    pt_sampler_accept(s, 4);
    float l[V];
    for (int i = 0; i < V; i++) l[i] = 0.0f;
    pt_sample_result r;
    pt_sampler_sample(s, l, &r);
    assert_int_equal(r.id, 4);
    assert_true(fabs(l[4] - 19.0f) < 1e-6); /* +20 bias, -1 frequency */
    assert_true(fabs(r.logprob - (0.0 - log((double)V))) < 1e-5);
    pt_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_penalty_rollback),
        cmocka_unit_test(test_added_mask),
        cmocka_unit_test(test_first_raw_value_wins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
