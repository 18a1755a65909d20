/*
 * test_bpw.c - the --target-bpw allocation: budgets are kept, upgrades go
 * where they save the most KL per bit, non-convex curves are handled, and
 * an impossible budget is an error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "quant/bpw.h"

/* Two equal-size modules; A is 10x as sensitive as B: A gets the bits. */
static void test_sensitive_module_wins(void **state) {
    (void)state;
    pt_bpw_module m[2] = {{.params = 1000, .cost = {1.0, 0.1, 0.01}}, {.params = 1000, .cost = {0.1, 0.01, 0.001}}};
    pt_bpw_problem p = {.n_choices = 3, .bpw = {2.5, 4.5, 8.5}, .n_modules = 2, .modules = m, .target_bpw = 3.5};
    double got;
    pt_err err;
    assert_int_equal(pt_bpw_allocate(&p, &got, &err), 0);
    assert_int_equal(m[0].choice, 1);
    assert_int_equal(m[1].choice, 0);
    assert_true(got <= 3.5 + 1e-9);
}

/* A flat middle (5 bits no better than 4) does not stop the jump to 8. */
static void test_non_convex(void **state) {
    (void)state;
    pt_bpw_module m[1] = {{.params = 100, .cost = {0.5, 0.5, 0.0}}};
    pt_bpw_problem p = {.n_choices = 3, .bpw = {4.5, 5.5, 8.5}, .n_modules = 1, .modules = m, .target_bpw = 9};
    double got;
    pt_err err;
    assert_int_equal(pt_bpw_allocate(&p, &got, &err), 0);
    assert_int_equal(m[0].choice, 2);
}

/* Bigger modules cost more bits: with room for one upgrade of the small
 * one only, the small one is upgraded even though the big one saves more
 * in total. */
static void test_budget_is_kept(void **state) {
    (void)state;
    pt_bpw_module m[2] = {{.params = 900, .cost = {1.0, 0.5}}, {.params = 100, .cost = {0.3, 0.0}}};
    pt_bpw_problem p = {.n_choices = 2, .bpw = {2.0, 4.0}, .n_modules = 2, .modules = m, .target_bpw = 2.3};
    double got;
    pt_err err;
    assert_int_equal(pt_bpw_allocate(&p, &got, &err), 0);
    assert_int_equal(m[0].choice, 0);
    assert_int_equal(m[1].choice, 1);
    assert_true(got <= 2.3 + 1e-9 && got > 2.19);
}

static void test_impossible_budget(void **state) {
    (void)state;
    pt_bpw_module m[1] = {{.params = 100, .cost = {0.5, 0.1}}};
    pt_bpw_problem p = {.n_choices = 2, .bpw = {2.5, 4.5}, .n_modules = 1, .modules = m, .target_bpw = 2.0};
    double got;
    pt_err err = {{0}};
    assert_int_equal(pt_bpw_allocate(&p, &got, &err), -1);
    assert_non_null(strstr(err.msg, "below the cheapest"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sensitive_module_wins),
        cmocka_unit_test(test_non_convex),
        cmocka_unit_test(test_budget_is_kept),
        cmocka_unit_test(test_impossible_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
