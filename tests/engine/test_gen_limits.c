/*
 * test_gen_limits.c - the shared table of generation parameter ranges
 * (engine/gen_limits.h): closed ranges, NaN and infinities always out,
 * integers refuse fractions, and the range in words says the bounds.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/gen_limits.h"

static bool in(pt_gen_param p, double x) {
    return pt_gen_in_range(&pt_gen_limits[p], x);
}

static void test_edges(void **state) {
    (void)state;
    assert_true(in(PT_GP_TEMPERATURE, 0) && in(PT_GP_TEMPERATURE, 2));
    assert_false(in(PT_GP_TEMPERATURE, -1) || in(PT_GP_TEMPERATURE, 2.001));
    assert_true(in(PT_GP_TOP_P, 1) && !in(PT_GP_TOP_P, 2));
    assert_true(in(PT_GP_MIN_P, 0) && !in(PT_GP_MIN_P, 5));
    assert_true(in(PT_GP_REPETITION_PENALTY, 1) && !in(PT_GP_REPETITION_PENALTY, -3) &&
                !in(PT_GP_REPETITION_PENALTY, 0));
    assert_true(in(PT_GP_FREQUENCY_PENALTY, -2) && !in(PT_GP_PRESENCE_PENALTY, 2.5));
    assert_true(in(PT_GP_TOP_K, -1) && in(PT_GP_TOP_K, 0) && !in(PT_GP_TOP_K, -5));
    assert_true(in(PT_GP_LOGPROBS, 20) && !in(PT_GP_LOGPROBS, 21) && !in(PT_GP_LOGPROBS, 100));
    assert_true(in(PT_GP_MAX_TOKENS, 1) && !in(PT_GP_MAX_TOKENS, 0) && !in(PT_GP_MAX_TOKENS, -1));
    assert_true(in(PT_GP_PARALLEL, 1) && !in(PT_GP_PARALLEL, 0) && !in(PT_GP_PARALLEL, 100000));
}

static void test_never_in_range(void **state) {
    (void)state;
    for (int p = 0; p < PT_GP_COUNT; p++) {
        const pt_gen_limit *l = &pt_gen_limits[p];
        assert_non_null(l->name);
        assert_true(l->lo <= l->hi && isfinite(l->lo) && isfinite(l->hi));
        assert_false(pt_gen_in_range(l, NAN));
        assert_false(pt_gen_in_range(l, INFINITY));
        assert_false(pt_gen_in_range(l, -INFINITY));
        if (l->integer) assert_false(pt_gen_in_range(l, l->lo + 0.5));
    }
}

static void test_words(void **state) {
    (void)state;
    char buf[64];
    assert_string_equal(pt_gen_range_text(&pt_gen_limits[PT_GP_TEMPERATURE], buf, sizeof buf),
                        "a number between 0 and 2");
    assert_string_equal(pt_gen_range_text(&pt_gen_limits[PT_GP_LOGPROBS], buf, sizeof buf),
                        "an integer between 0 and 20");
    assert_string_equal(pt_gen_range_text(&pt_gen_limits[PT_GP_MAX_TOKENS], buf, sizeof buf),
                        "an integer >= 1");
    assert_string_equal(
        pt_gen_range_text(&pt_gen_limits[PT_GP_REPETITION_PENALTY], buf, sizeof buf),
        "a number between 0.01 and 10");
}

/* The C API's check: the same table over a whole pt_gen_params. */
static void test_params_check(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_gen_params p = {.max_tokens = 16};
    p.sampling = pt_sampling_default();
    assert_int_equal(pt_gen_params_check(&p, &err), 0); /* n_logprobs -1: none */
    p.sampling.repetition_penalty = 0.01f;              /* the edge, as a float */
    p.sampling.n_logprobs = 20;
    assert_int_equal(pt_gen_params_check(&p, &err), 0);
    p.sampling.temperature = NAN;
    assert_int_equal(pt_gen_params_check(&p, &err), -1);
    assert_non_null(strstr(err.msg, "temperature"));
    p.sampling.temperature = 1;
    p.max_tokens = 0;
    assert_int_equal(pt_gen_params_check(&p, &err), -1);
    assert_non_null(strstr(err.msg, "max_tokens 0 is out of range: it must be an integer >= 1"));
    p.max_tokens = 1;
    p.sampling.n_logprobs = 21;
    assert_int_equal(pt_gen_params_check(&p, &err), -1);
    assert_non_null(strstr(err.msg, "between 0 and 20"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_never_in_range),
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_params_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
