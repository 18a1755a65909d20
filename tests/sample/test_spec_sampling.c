/*
 * test_spec_sampling.c - speculative verification keeps the target's
 * distribution.  At fixed logits, a drafter proposing token d with
 * certainty, N seeded verifications must produce tokens distributed as
 * the sampler's own p (softmax at the temperature, after top-k): a
 * chi-square test against the exact probabilities.  The same test must
 * reject a broken verifier that resamples from p instead of the residual
 * p - q (its output over-weights d), so the test has the power to catch
 * the bug it is for.  Greedy verification accepts exactly the argmax.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "sample/sampler.h"

enum { V = 8, N = 200000 };
static const float LOGITS[V] = {1.0f, 2.0f, 0.5f, 1.5f, -1.0f, 0.0f, 2.2f, 1.1f};

/* The sampler's p: softmax(logits / t) over the top_k best (0: all). */
static void exact(float t, int top_k, double *p) {
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < V; i++) /* selection sort, descending */
        for (int j = i + 1; j < V; j++)
            if (LOGITS[order[j]] > LOGITS[order[i]]) {
                int x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
    int keep = top_k > 0 ? top_k : V;
    double sum = 0;
    for (int i = 0; i < V; i++) p[i] = 0;
    for (int i = 0; i < keep; i++) sum += p[order[i]] = exp(LOGITS[order[i]] / t);
    for (int i = 0; i < V; i++) p[i] /= sum;
}

static double chi_square(const long *count, const double *p) {
    double x2 = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            if (count[i]) return INFINITY; /* a token p forbids */
            continue;
        }
        double e = p[i] * N;
        x2 += (count[i] - e) * (count[i] - e) / e;
    }
    return x2;
}

/* N verifications of draft at the fixed logits; broken: resample from p. */
static void run(float t, int top_k, int32_t draft, bool broken, long *count, long *accepted) {
    pt_sampling sp = pt_sampling_default();
    sp.temperature = t;
    sp.top_k = top_k;
    sp.seed = 1234;
    pt_sampler *s = pt_sampler_new(&sp, V);
    memset(count, 0, sizeof(long) * V);
    *accepted = 0;
    for (int i = 0; i < N; i++) {
        float l[V];
        memcpy(l, LOGITS, sizeof l);
        pt_sample_result r;
        bool ok;
        pt_sampler_verify(s, l, draft, &r, &ok);
        if (broken && !ok) {
            memcpy(l, LOGITS, sizeof l);
            pt_sampler_sample(s, l, &r);
        }
        count[r.id]++;
        *accepted += ok;
    }
    pt_sampler_free(s);
}

/* df <= 7: 40 is far past the 1e-6 tail (chi2(7) > 35.3 has p < 1e-5). */
#define CRITICAL 40.0

static void test_distribution_preserved(void **state) {
    (void)state;
    struct { float t; int k; int32_t draft; } cases[] = {
        {1.0f, 0, 6}, {1.0f, 0, 4}, {0.7f, 0, 1}, {1.3f, 4, 3}, {1.0f, 4, 4} /* draft outside top-k */
    };
    for (size_t c = 0; c < PT_ARRAY_LEN(cases); c++) {
        double p[V];
        exact(cases[c].t, cases[c].k, p);
        long count[V], acc;
        run(cases[c].t, cases[c].k, cases[c].draft, false, count, &acc);
        double x2 = chi_square(count, p);
        if (!(x2 < CRITICAL))
            fail_msg("case %zu: chi-square %.1f against the target's p", c, x2);
        /* the draft is accepted with its own probability */
        double want = p[cases[c].draft], got = (double)acc / N;
        assert_true(fabs(got - want) < 5 * sqrt(want * (1 - want) / N) + 1e-9);
        /* and the broken verifier is caught (unless d is never accepted) */
        if (want > 0.05) {
            run(cases[c].t, cases[c].k, cases[c].draft, true, count, &acc);
            double bad = chi_square(count, p);
            if (!(bad > CRITICAL)) fail_msg("case %zu: the broken verifier passed (%.1f)", c, bad);
        }
    }
}

static void test_greedy(void **state) {
    (void)state;
    pt_sampling sp = pt_sampling_default();
    sp.temperature = 0;
    pt_sampler *s = pt_sampler_new(&sp, V);
    float l[V];
    pt_sample_result r;
    bool ok;
    memcpy(l, LOGITS, sizeof l);
    pt_sampler_verify(s, l, 6, &r, &ok);
    assert_true(ok);
    assert_int_equal(r.id, 6);
    memcpy(l, LOGITS, sizeof l);
    pt_sampler_verify(s, l, 1, &r, &ok);
    assert_false(ok);
    assert_int_equal(r.id, 6);
    pt_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distribution_preserved),
        cmocka_unit_test(test_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
